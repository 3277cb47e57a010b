"""A real Prometheus for the testbed: scrapes the replicas listed in a file_sd targets file, runs the
rule file `toolkit deploy k8s` writes, and answers instant queries over its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import requests
import yaml

from toolkit.errors import ToolkitError

JOB = "testbed"

def config_dict(rules: Path, targets: Path, interval_s: float) -> dict:
    scrape = {"job_name": JOB, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": f"{interval_s:g}s"}]}
    return {"global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
            "rule_files": [str(rules)], "scrape_configs": [scrape]}


class Prometheus:
    def __init__(self, work_dir: Path, rules: Path, port: int, interval_s: float = 2.0):
        binary = shutil.which("prometheus")
        if not binary:
            raise ToolkitError("prometheus is not installed", "run `make setup-tools` (apt-get install prometheus)")
        self.targets = work_dir / "targets.json"
        self.set_targets({})
        config = work_dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(config_dict(rules.resolve(), self.targets.resolve(), interval_s)))
        self.url = f"http://127.0.0.1:{port}"
        self.log = (work_dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={work_dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise ToolkitError(f"prometheus exited ({self.proc.returncode})", f"see {self.log.name}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise ToolkitError("prometheus did not become ready", f"see {self.log.name}")

    def set_targets(self, metrics_ports: dict[str, int]) -> None:
        """{replica name: metrics port}; Prometheus picks the file up on its own."""
        groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"pod": name}} for name, port in metrics_ports.items()]
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets)

    def query(self, expr: str) -> list[tuple[dict, float]]:
        reply = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        if reply.get("status") != "success":
            raise ToolkitError(f"prometheus query {expr!r} failed: {reply.get('error')}", "check the rule file")
        return [(r["metric"], float(r["value"][1])) for r in reply["data"]["result"]]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
