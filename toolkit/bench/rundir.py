"""Reading a run directory back: reports are made from these files only, never from live objects."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.bench.records import RequestRecord, read_jsonl, read_records
from toolkit.engine.runtime.layout import TIMELINE_FILE
from toolkit.errors import ToolkitError


@dataclass
class RunDir:
    path: Path
    summary: dict
    _records: list[RequestRecord] | None = field(default=None, init=False, repr=False)
    _server_metrics: list[dict] | None = field(default=None, init=False, repr=False)
    _by_step: dict[str, list[RequestRecord]] | None = field(default=None, init=False, repr=False)
    _engine_steps: list[dict] | None = field(default=None, init=False, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        path = Path(path)
        summary_path = path / "summary.json"
        if not summary_path.is_file():
            raise ToolkitError(f"{path} has no summary.json (not a sweep run directory)",
                               "pass a directory under perf/runs/ written by `toolkit sweep`")
        return cls(path, json.loads(summary_path.read_text()))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def info(self) -> dict:
        """What the sweep recorded about the run (config, qformat, engine, served engine, host); {} for old runs."""
        return self.summary.get("run") or {}

    @property
    def label(self) -> str:
        """Short name for legends: the variant label of an A/B run, else config + qformat."""
        info = self.info
        return info.get("label") or f"{info.get('config_name', self.name)} {info.get('qformat', '')}".strip()

    @property
    def steps(self) -> list[dict]:
        return self.summary.get("steps", [])

    def records(self) -> list[RequestRecord]:
        """Read once per RunDir: reports, A/B and the doctor ask for them many times."""
        if self._records is None:
            self._records = read_records(self.path / "records.jsonl")
        return self._records

    def measured_records_by_step(self) -> dict[str, list[RequestRecord]]:
        """Successful, non-warm-up records grouped by step, in the order they finished (grouped once)."""
        if self._by_step is None:
            self._by_step = {}
            for record in self.records():
                if record.ok and not record.warmup:
                    self._by_step.setdefault(record.step, []).append(record)
        return self._by_step

    def plan(self) -> dict | None:
        """The plan the sweep wrote beside its measurements (plan.json), if it could make one."""
        path = self.path / "plan.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def server_metrics(self) -> list[dict]:
        if self._server_metrics is None:
            self._server_metrics = read_jsonl(self.path / "server_metrics.jsonl")
        return self._server_metrics

    def engine_steps(self) -> list[dict]:
        """The embedded engine's step timeline (TIMELINE_FILE, copied into the run by the sweep), in time order; empty for
        other servers. Read once: the doctor's checks and the report's plot each want it."""
        if self._engine_steps is None:
            steps = [s for s in read_jsonl(self.path / TIMELINE_FILE) if "mono" in s]
            self._engine_steps = sorted(steps, key=lambda s: s["mono"])
        return self._engine_steps


def step_level(step: dict) -> float:
    """A step's load level: its concurrency, or its request rate in rate mode."""
    return step.get("concurrency") or step.get("rate") or 0


def latest_run(runs_dir: Path) -> Path:
    runs = sorted(p for p in Path(runs_dir).glob("*/summary.json"))
    if not runs:
        raise ToolkitError(f"no sweep runs under {runs_dir}", "run `toolkit sweep` first")
    return max(runs, key=lambda p: p.stat().st_mtime).parent
