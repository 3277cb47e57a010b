"""Where the sweep client and a local server sit in the kernel's scheduler: a server in another session's
autogroup is named (the sweep warns and the doctor says so), one in the caller's session is not."""

import subprocess

import pytest

from toolkit.serve import server
from toolkit.serve.server import OWN_PROCESS_GROUP, separate_autogroups


def _autogroups_on() -> bool:
    try:
        return server.AUTOGROUP_SETTING.read_text().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(not _autogroups_on(), reason="kernel.sched_autogroup_enabled is off or absent on this host")
def test_a_server_in_another_session_is_in_another_autogroup():
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


def test_nothing_to_say_when_autogroups_are_off(tmp_path, monkeypatch):
    setting = tmp_path / "sched_autogroup_enabled"
    setting.write_text("0\n")
    monkeypatch.setattr(server, "AUTOGROUP_SETTING", setting)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert separate_autogroups(other.pid) is None
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(not _autogroups_on(), reason="kernel.sched_autogroup_enabled is off or absent on this host")
def test_the_sweep_stage_looks_at_the_server_toolkit_serve_started(tmp_path):
    """What `toolkit sweep` records and warns about: the server in the state file `toolkit serve` wrote; nothing for
    sweep.url's server, which may be on another host."""
    from e2e_helpers import tiny_deployment
    from toolkit.pipeline import _client_server_autogroups
    from toolkit.serve.server import ServerHandle

    config, layout = tiny_deployment(tmp_path, tmp_path / "no-model")
    assert _client_server_autogroups(config, layout) is None  # no server started
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        layout.server_state_file.parent.mkdir(parents=True, exist_ok=True)
        ServerHandle(other.pid, "127.0.0.1", 1, 2, 3, "log", "repo").save(layout.server_state_file)
        split = _client_server_autogroups(config, layout)
        assert split == separate_autogroups(other.pid) and split is not None
        remote, remote_layout = tiny_deployment(tmp_path, tmp_path / "no-model", sweep={"url": "127.0.0.1:8001"})
        assert _client_server_autogroups(remote, remote_layout) is None
    finally:
        other.kill()
        other.wait()
