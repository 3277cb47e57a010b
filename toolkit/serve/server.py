"""Start, wait for, and stop a tritonserver; the running server is recorded in a small state file."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import requests

from toolkit.config import DeploymentConfig, ServerSection
from toolkit.errors import ToolkitError
from toolkit.serve.install import TritonInstall
from toolkit.targets import target_of


# The server gets a process group of its own (Ctrl-C at the terminal does not reach it; `toolkit stop` ends the
# whole group) but stays in the caller's session. A new session (setsid) is a new scheduler autogroup on Linux
# (kernel.sched_autogroup_enabled, the default of most distributions), and the kernel then shares a core between
# sessions, not threads: with the server filling both cores of this machine, a sweep client in another session
# waited up to 130 ms for a core it was woken on (perf sched), and streamed tokens arrived in bursts, gaps up to
# 370 ms at 8 streams, in 3 of 4 runs; in the caller's session none over 35 ms in 4 of 4 (perf/README "Served").
OWN_PROCESS_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


PROC = Path("/proc")
AUTOGROUP_SETTING = PROC / "sys/kernel/sched_autogroup_enabled"
# What to do when separate_autogroups names two groups (the sweep's warning and the doctor's lever say it).
AUTOGROUP_FIX = ("sweep from the shell that started the server, set kernel.sched_autogroup_enabled=0, or run the client "
                 "on another host")


def client_in_another_session(split: dict, quote: str = "") -> str:
    """How the sweep's warning, the doctor and the report name a separate_autogroups result."""
    return (f"in another session than the server on this host (scheduler autogroups {quote}{split['client']}{quote} / "
            f"{quote}{split['server']}{quote})")


def separate_autogroups(server_pid: int) -> dict | None:
    """{"client": ..., "server": ...} (as /proc/<pid>/autogroup names them) when Linux's autogroup scheduling is on
    and a server process on this host runs in another session's autogroup than the client (this process); else
    None, also wherever this host cannot tell. On a host the server fills, the client then waits for cores
    (OWN_PROCESS_GROUP's comment)."""
    try:
        if AUTOGROUP_SETTING.read_text().strip() != "1":
            return None
        if os.readlink(PROC / "self") != str(os.getpid()):
            return None  # /proc is another PID namespace's (a sandbox that kept the host's): its pids are not ours
        groups = {who: (PROC / str(pid) / "autogroup").read_text().split()[0]
                  for who, pid in (("client", os.getpid()), ("server", server_pid))}
    except (OSError, IndexError):
        return None  # not Linux, autogroups compiled out, a task in none (init's session: empty), or the server gone
    return groups if groups["client"] != groups["server"] else None


@dataclass
class ServerHandle:
    pid: int
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log_file: str
    repo_dir: str
    openai_port: int | None = None
    openai_pid: int | None = None
    shm_prefix: str | None = None  # of its python-backend shared-memory regions (tritonserver_command)
    # Filled by stop_server: every process it ended ("name (pid)"), the server's orphans included.
    ended: list[str] = field(default_factory=list)

    @property
    def stop_summary(self) -> str:
        if not self.ended:
            return f"stopped pid {self.pid} (nothing of it was still running)"
        return f"stopped pid {self.pid}: ended {len(self.ended)} process(es): {', '.join(self.ended)}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def openai_url(self) -> str | None:
        return f"http://{self.host}:{self.openai_port}" if self.openai_port else None

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "ServerHandle":
        if not path.is_file():
            raise ToolkitError(f"no running server recorded in {path}", "start one with `toolkit serve`")
        return cls(**json.loads(path.read_text()))

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise ToolkitError(f"{what} port {port} on {host} is already in use",
                               f"stop what uses it, or set server.{what}_port: 0 to pick a free one") from None


def _choose_ports(server: ServerSection) -> dict[str, int]:
    ports = {}
    for what in ("http", "grpc", "metrics") + (("openai",) if server.openai else ()):
        port = getattr(server, f"{what}_port")
        if port:
            check_port_free(server.host, port, what)
        else:
            port = free_port(server.host)
            while port in ports.values():
                port = free_port(server.host)
        ports[what] = port
    return ports


def tritonserver_command(install: TritonInstall, repo_dir: Path, host: str, ports: dict[str, int],
                         log_file: Path, world_size: int = 1, rank_launcher: tuple[str, ...] = (),
                         shm_prefix: str | None = None) -> list[str]:
    """The server's command line, as NVIDIA's launch_triton_server.py builds it: one process at world size 1
    (no MPI), else `mpirun` with one rank per GPU, each rank wrapped in the target's `rank_launcher`
    (`trtllm-llmapi-launch` for the llmapi model: TensorRT-LLM's PyTorch backend then spans the ranks with
    its MPI session). shm_prefix: the python backend's shared-memory regions are named with it (each rank's
    with its number after it), so that stop_server can remove those a killed server leaves in /dev/shm."""
    rank0 = [str(install.binary), f"--model-repository={repo_dir}",
             f"--http-address={host}", f"--http-port={ports['http']}",
             f"--grpc-address={host}", f"--grpc-port={ports['grpc']}",
             f"--metrics-address={host}", f"--metrics-port={ports['metrics']}",
             "--allow-gpu-metrics=false" if install.backend_dir else "--allow-gpu-metrics=true",
             # Per-model histograms incl. nv_inference_first_response_histogram_ms (server-side TTFT; its
             # buckets are fixed at 100/500/2000/5000 ms, so dashboards read TTFT from the engine's own metrics).
             "--metrics-config=histogram_latencies=true",
             "--disable-auto-complete-config", "--exit-timeout-secs=30", f"--log-file={log_file}"]
    if install.backend_dir:
        rank0.append(f"--backend-directory={install.backend_dir}")
    if world_size == 1:
        return rank0 + ([f"--backend-config=python,shm-region-prefix-name={shm_prefix}"] if shm_prefix else [])
    # TensorRT-LLM with TP × PP > 1: one MPI rank per GPU. Rank 0 serves every endpoint; the other
    # ranks load only the engine model, each with its own python-backend shared-memory prefix.
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            cmd.append(":")
        args = rank0 if rank == 0 else [
            str(install.binary), f"--model-repository={repo_dir}", "--model-control-mode=explicit",
            "--load-model=tensorrt_llm", "--disable-auto-complete-config", "--allow-http=false",
            "--allow-grpc=false", "--allow-metrics=false", f"--log-file={log_file}.rank{rank}"]
        cmd += ["-n", "1", *rank_launcher] + args + [
            f"--backend-config=python,shm-region-prefix-name={shm_prefix or 'prefix'}{rank}_"]
    return cmd


_LOAD_FAILURE = re.compile(r"(failed to load|Failed to initialize|failed to start|Invalid argument|error: creating server)",
                           re.IGNORECASE)


def _log_error_line(log_file: Path) -> str | None:
    """The first line of the log that says why the server or a model failed, shortened to one line."""
    if not log_file.is_file():
        return None
    for line in log_file.read_text(errors="replace").splitlines():
        if _LOAD_FAILURE.search(line):
            message = line.split("] ", 1)[-1].strip().strip('"')
            first = message.split("\\n")[0][:300]
            # A python model's traceback names its file: <repo>/<model>/<version>/model.py
            model = re.search(r"/([^/\s]+)/\d+/model\.py", message)
            if model and model.group(1) not in first:
                first = f"model {model.group(1)}: {first}"
            return first
    return None


def start_server(config: DeploymentConfig, repo_dir: Path, work_dir: Path, state_file: Path) -> ServerHandle:
    from toolkit.repo.checks import check_repository_or_raise

    repo_dir = repo_dir.resolve()
    if not any(repo_dir.glob("*/config.pbtxt")):
        raise ToolkitError(f"{repo_dir} is not a model repository (no */config.pbtxt)", "run `toolkit repo` first")
    check_repository_or_raise(repo_dir)
    check_repository_target(repo_dir, config.engine.target)
    if state_file.is_file():
        old = ServerHandle.load(state_file)
        if old.is_alive():
            raise ToolkitError(f"a server for this config is already running (pid {old.pid}, {old.http_url})",
                               "stop it with `toolkit stop`")
    server = config.server
    target = target_of(config)
    install = target.triton(work_dir, server.tritonserver)
    ports = _choose_ports(server)
    log_file = (work_dir / "servers" / f"{config.name}.log").resolve()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.unlink(missing_ok=True)
    shm_prefix = f"toolkit_{secrets.token_hex(4)}_"
    cmd = tritonserver_command(install, repo_dir, server.host, ports, log_file, config.parallel.world_size,
                               target.rank_launcher, shm_prefix)
    env = os.environ | install.env
    stdout = (log_file.parent / f"{config.name}.stdout").open("w")
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                            **OWN_PROCESS_GROUP)
    handle = ServerHandle(proc.pid, server.host, ports["http"], ports["grpc"], ports["metrics"], str(log_file),
                          str(repo_dir), shm_prefix=shm_prefix)
    try:
        _wait_ready(proc, handle, server.startup_timeout_s, log_file)
        if server.openai:
            handle.openai_port = ports["openai"]
            handle.openai_pid = _start_openai_front(handle, repo_dir, log_file.parent / f"{config.name}.openai.log",
                                                    config.model.display_name, config.engine.max_seq_len)
    except BaseException:
        _terminate(proc.pid)
        _remove_shm_regions(shm_prefix)
        raise
    handle.save(state_file)
    (log_file.parent / f"{config.name}.cmd").write_text(shlex.join(cmd) + "\n")
    return handle


def check_repository_target(repo_dir: Path, target: str) -> None:
    """The repository must be the one written for the config's target: the launch (MPI, llmapi launcher, which
    tritonserver) follows the config, the models follow the repository."""
    manifest = repo_dir / "manifest.json"
    if not manifest.is_file():
        return  # a hand-made repository: nothing recorded to compare
    written_for = json.loads(manifest.read_text()).get("inputs", {}).get("target")
    if written_for and written_for != target:
        raise ToolkitError(f"{repo_dir} was written for engine.target {written_for} but the config says {target}",
                           "run `toolkit build` and `toolkit repo` with this config, or serve with the config that "
                           "wrote the repository")


def _wait_ready(proc: subprocess.Popen, handle: ServerHandle, timeout_s: float, log_file: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            line = _log_error_line(log_file) or f"(no error line; see {log_file})"
            raise ToolkitError(f"tritonserver exited with {code} while starting: {line}",
                               f"fix the model the log names; full log: {log_file}")
        failure = _log_error_line(log_file)
        if failure:  # a model failed to load; Triton may keep running without it, so do not wait
            raise ToolkitError(f"tritonserver could not load the repository: {failure}",
                               f"fix the model the log names; full log: {log_file}")
        try:
            if requests.get(f"{handle.http_url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.25)
    line = _log_error_line(log_file) or "no error in the log"
    raise ToolkitError(f"tritonserver not ready after {timeout_s:.0f}s: {line}",
                       f"raise server.startup_timeout_s or read {log_file}")


def _start_openai_front(handle: ServerHandle, repo_dir: Path, log_path: Path, served_name: str,
                        max_seq_len: int) -> int:
    import sys

    manifest = json.loads((repo_dir / "manifest.json").read_text())
    # The BLS where there is one; else what the repository's manifest names (ensemble, or the llmapi model).
    fallback = manifest["outputs"].get("client_model", "ensemble")
    model = "tensorrt_llm_bls" if (repo_dir / "tensorrt_llm_bls").is_dir() else fallback
    cmd = [sys.executable, "-m", "toolkit.serve.openai_front", "--grpc-url", handle.grpc_url,
           "--tokenizer", manifest["outputs"]["tokenizer_dir"], "--host", handle.host,
           "--port", str(handle.openai_port), "--model", model, "--served-name", served_name,
           "--max-seq-len", str(max_seq_len)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                            **OWN_PROCESS_GROUP)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ToolkitError(f"the OpenAI front exited with {proc.returncode}", f"read {log_path}")
        try:
            if requests.get(f"{handle.openai_url}/v1/models", timeout=1).status_code == 200:
                return proc.pid
        except requests.RequestException:
            time.sleep(0.2)
    _terminate(proc.pid)
    raise ToolkitError("the OpenAI front did not answer within 60 s", f"read {log_path}")


def group_members(pgid: int) -> list[tuple[int, str]]:
    """Live (non-zombie) processes of a process group, as (pid, command name), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended while we looked
        name = text[text.index("(") + 1:text.rindex(")")]
        state, _ppid, group = text[text.rindex(")") + 2:].split()[:3]
        if int(group) == pgid and state != "Z":
            members.append((int(stat.parent.name), name))
    return sorted(members)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def end_process_group(pgid: int, grace_s: float = 40) -> list[str]:
    """End every process of the group the server was started in (its own process group): SIGTERM, then SIGKILL
    after the grace period. Returns what was ended. The leader gets the grace period to drain; when it is
    already gone (killed, crashed), its python-backend stubs have no one to stop them and ignore SIGTERM,
    so they get a few seconds."""
    _reap(pgid)
    members = group_members(pgid)
    if not members:
        return []
    leader_alive = any(pid == pgid for pid, _ in members)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return []
    deadline = time.monotonic() + (grace_s if leader_alive else min(grace_s, 3.0))
    while time.monotonic() < deadline:
        _reap(pgid)
        if not group_members(pgid):
            break
        time.sleep(0.1)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while group_members(pgid) and time.monotonic() < deadline:
            _reap(pgid)
            time.sleep(0.05)
    _reap(pgid)  # the leader may have turned zombie after the last look: reap it (when it is our child)
    return [f"{name} ({pid})" for pid, name in members]


def _terminate(pid: int, timeout_s: float = 40) -> list[str]:
    return end_process_group(pid, timeout_s)


def _remove_shm_regions(prefix: str | None) -> None:
    """The python backend's shared-memory regions of an ended server: Triton unlinks them on a clean exit, but
    a killed server (a crash, an OOM kill, a stop past --exit-timeout-secs) left them in /dev/shm, ~1 MiB each,
    several per start (211 here after a day of test runs, 2026-11-27)."""
    if not prefix:
        return
    for region in Path("/dev/shm").glob(f"{prefix}*"):
        region.unlink(missing_ok=True)


def stop_server(state_file: Path) -> ServerHandle:
    handle = ServerHandle.load(state_file)
    ended = []
    if handle.openai_pid:
        ended += _terminate(handle.openai_pid, timeout_s=5)
    ended += _terminate(handle.pid)
    _remove_shm_regions(handle.shm_prefix)
    state_file.unlink(missing_ok=True)
    handle.ended = ended
    return handle


@contextmanager
def running_server(config: DeploymentConfig, repo_dir: Path, work_dir: Path, state_file: Path) -> Iterator[ServerHandle]:
    handle = start_server(config, repo_dir, work_dir, state_file)
    try:
        yield handle
    finally:
        stop_server(state_file)
