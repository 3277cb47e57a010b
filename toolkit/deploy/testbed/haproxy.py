"""haproxy in front of the replicas: least connections, health checks on Triton's /v2/health/ready,
and replica slots switched at run time over its admin socket (ready / drain / maint)."""

from __future__ import annotations

import csv
import io
import shutil
import socket
import subprocess
import time
from pathlib import Path

from toolkit.errors import ToolkitError

BACKEND = "triton"


def slot(index: int) -> str:
    return f"r{index}"


def config_text(port: int, socket_path: Path, slots: int) -> str:
    servers = "\n".join(f"  server {slot(i)} 127.0.0.1:9 check disabled" for i in range(slots))
    return f"""global
  stats socket {socket_path} mode 600 level admin
  maxconn 4096

defaults
  mode http
  timeout connect 5s
  # Streams stay open for the whole generation.
  timeout client 300s
  timeout server 300s

frontend llm
  bind 127.0.0.1:{port}
  default_backend {BACKEND}

backend {BACKEND}
  balance leastconn
  option httpchk GET /v2/health/ready
  http-check expect status 200
  default-server inter 1s fall 2 rise 1
{servers}
"""


class Haproxy:
    def __init__(self, work_dir: Path, port: int, slots: int):
        binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
        if not binary:
            raise ToolkitError("haproxy is not installed", "run `make setup-tools` (apt-get install haproxy)")
        work_dir = work_dir.resolve()  # haproxy reads a relative socket path as an address
        self.socket_path = work_dir / "haproxy.sock"
        self.config = work_dir / "haproxy.cfg"
        self.config.write_text(config_text(port, self.socket_path, slots))
        self.url = f"http://127.0.0.1:{port}"
        self.log = (work_dir / "haproxy.log").open("w")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config)], stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_socket()

    def _wait_socket(self, timeout_s: float = 10) -> None:
        deadline = time.time() + timeout_s
        while not self.socket_path.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise ToolkitError(f"haproxy did not start: {_last_alert(self.config.parent / 'haproxy.log')}",
                                   f"see {self.config.parent / 'haproxy.log'}")
            time.sleep(0.1)

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode()

    def enable(self, index: int, port: int) -> None:
        self.command(f"set server {BACKEND}/{slot(index)} addr 127.0.0.1 port {port}")
        self.command(f"set server {BACKEND}/{slot(index)} state ready")

    def wait_up(self, index: int, timeout_s: float) -> bool:
        """Until the slot's health check has passed (status UP), so new requests can go to it."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.stats().get(slot(index), {}).get("status", "").startswith("UP"):
                return True
            time.sleep(0.1)
        return False

    def drain(self, index: int) -> None:
        """No new requests; those in flight go on."""
        self.command(f"set server {BACKEND}/{slot(index)} state drain")

    def disable(self, index: int) -> None:
        self.command(f"set server {BACKEND}/{slot(index)} state maint")

    def stats(self) -> dict[str, dict]:
        """Per slot: current sessions (scur), status (UP / DRAIN / MAINT / DOWN), total sessions."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {r["svname"]: {"scur": int(r["scur"] or 0), "status": r["status"], "stot": int(r["stot"] or 0)}
                for r in rows if r["pxname"] == BACKEND and r["svname"] not in ("BACKEND", "FRONTEND")}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _last_alert(log: Path) -> str:
    alerts = [line for line in log.read_text(errors="replace").splitlines() if "[ALERT]" in line]
    return alerts[0].split(":", 2)[-1].strip() if alerts else "no message"
