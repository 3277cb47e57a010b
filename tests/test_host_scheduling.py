"""Where the sweep client and a local server sit in the kernel's scheduler: a server in another session's
autogroup is named (the sweep warns and the doctor says so), one in the caller's session is not, and a host that
cannot tell (autogroups off, a /proc of another PID namespace, the server gone) says nothing."""

import os
import subprocess
from pathlib import Path

import pytest

from toolkit.serve import server
from toolkit.serve.server import OWN_PROCESS_GROUP, separate_autogroups

SERVER_PID = 4242


def fake_proc(root: Path, groups: dict[int, str], setting: str = "1", self_pid: int | None = None) -> Path:
    """A /proc holding what separate_autogroups reads: the sysctl, /proc/self, and /proc/<pid>/autogroup."""
    (root / "sys/kernel").mkdir(parents=True)
    (root / "sys/kernel/sched_autogroup_enabled").write_text(f"{setting}\n")
    (root / "self").symlink_to(str(self_pid or os.getpid()))
    for pid, line in groups.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "autogroup").write_text(line)
    return root


@pytest.fixture
def use_proc(monkeypatch):
    def use(root: Path) -> None:
        monkeypatch.setattr(server, "PROC", root)
        monkeypatch.setattr(server, "AUTOGROUP_SETTING", root / "sys/kernel/sched_autogroup_enabled")
    return use


def test_a_server_in_another_autogroup_is_named(tmp_path, use_proc):
    use_proc(fake_proc(tmp_path, {os.getpid(): "/autogroup-12 nice 0\n", SERVER_PID: "/autogroup-97 nice 0\n"}))
    assert separate_autogroups(SERVER_PID) == {"client": "/autogroup-12", "server": "/autogroup-97"}


@pytest.mark.parametrize("case", ["same group", "autogroups off", "server gone", "foreign /proc", "root group"])
def test_nothing_to_say_where_there_is_nothing_or_this_host_cannot_tell(tmp_path, use_proc, case):
    groups = {os.getpid(): "/autogroup-12 nice 0\n", SERVER_PID: "/autogroup-97 nice 0\n"}
    setting, self_pid = "1", None
    if case == "same group":
        groups[SERVER_PID] = groups[os.getpid()]
    elif case == "autogroups off":
        setting = "0"
    elif case == "server gone":
        del groups[SERVER_PID]
    elif case == "foreign /proc":  # the pids under /proc are another namespace's: 4242 there is not our server
        self_pid = os.getpid() + 1
    elif case == "root group":  # a task in no autogroup: the kernel prints nothing
        groups[SERVER_PID] = ""
    use_proc(fake_proc(tmp_path, groups, setting, self_pid))
    assert separate_autogroups(SERVER_PID) is None


def _why_the_kernel_cannot_show_it() -> str | None:
    """None where this host's kernel puts a new session in an autogroup of its own, as /proc shows it; else why
    not, with what was read (CI's sandbox need not be a host where it does)."""
    try:
        if server.AUTOGROUP_SETTING.read_text().strip() != "1":
            return "kernel.sched_autogroup_enabled is off"
        if os.readlink("/proc/self") != str(os.getpid()):
            return f"/proc is another PID namespace's (/proc/self -> {os.readlink('/proc/self')}, pid {os.getpid()})"
    except OSError as error:
        return f"no autogroup setting to read: {error}"
    probe = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        seen = {who: Path(f"/proc/{pid}/autogroup").read_text().strip() for who, pid in
                (("this process", os.getpid()), ("a new session", probe.pid))}
    except OSError as error:
        return f"/proc/<pid>/autogroup unreadable: {error}"
    finally:
        probe.kill()
        probe.wait()
    return None if seen["this process"] != seen["a new session"] and all(seen.values()) else f"read {seen}"


def test_the_kernels_own_groups_a_new_session_apart_and_the_servers_process_group_not():
    reason = _why_the_kernel_cannot_show_it()
    if reason:
        pytest.skip(f"this host does not show a session's autogroup: {reason}")
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    same = subprocess.Popen(["sleep", "30"], **OWN_PROCESS_GROUP)  # how `toolkit serve` starts tritonserver
    try:
        split = separate_autogroups(other.pid)
        assert split is not None and split["server"] != split["client"]
        assert split["server"].startswith("/autogroup-") and split["client"].startswith("/autogroup-")
        assert separate_autogroups(same.pid) is None
    finally:
        for proc in (other, same):
            proc.kill()
            proc.wait()
    assert separate_autogroups(other.pid) is None  # the server is gone: nothing to say


def test_the_sweep_stage_looks_at_the_server_toolkit_serve_started(tmp_path, use_proc):
    """What `toolkit sweep` records and warns about: the server in the state file `toolkit serve` wrote; nothing for
    sweep.url's server, which may be on another host."""
    from e2e_helpers import tiny_deployment
    from toolkit.pipeline import _client_server_autogroups, target_for
    from toolkit.serve.server import ServerHandle

    use_proc(fake_proc(tmp_path / "proc", {os.getpid(): "/autogroup-12 nice 0\n",
                                           SERVER_PID: "/autogroup-97 nice 0\n"}))
    config, layout = tiny_deployment(tmp_path, tmp_path / "no-model")
    layout.server_state_file.parent.mkdir(parents=True, exist_ok=True)
    ServerHandle(SERVER_PID, "127.0.0.1", 1, 2, 3, "log", "repo").save(layout.server_state_file)
    assert _client_server_autogroups(target_for(config, layout)) == {"client": "/autogroup-12", "server": "/autogroup-97"}
    remote, remote_layout = tiny_deployment(tmp_path, tmp_path / "no-model", sweep={"url": "127.0.0.1:8001"})
    assert _client_server_autogroups(target_for(remote, remote_layout)) is None  # the state file is still there
