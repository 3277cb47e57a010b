"""The engine's per-step timeline: what each forward pass did and how long it took.

One `StepRecord` per step (start on the wall and the monotonic clock, duration, prefill and decode tokens, batch size, KV
blocks in use, ...). The engine keeps the latest records in memory and, when given a path, appends
each one as a JSON line, so another process (the sweep) can read the steps of a time window while
the server runs. `chrome_trace` turns records into a Chrome / Perfetto trace (chrome://tracing,
ui.perfetto.dev): one slice per step, counters for batch size, tokens and KV blocks.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.engine.runtime.layout import TIMELINE_FILE


@dataclass
class StepRecord:
    step: int
    start: float  # wall clock, seconds since the epoch
    mono: float  # time.perf_counter() at the start: the host's monotonic clock, as request records use it
    duration: float  # seconds, scheduling + forward + sampling
    forward: float  # seconds in the model runner
    batch_size: int  # sequences in the step
    context_requests: int  # sequences prefilling (a chunk or all of their prompt)
    generation_requests: int  # sequences decoding
    prefill_tokens: int
    decode_tokens: int  # includes draft tokens being verified
    draft_tokens: int
    accepted_tokens: int
    kv_blocks_used: int
    kv_blocks_max: int
    waiting: int  # requests queued after this step was scheduled
    preempted: int  # requests paused by this step's scheduling (full cache, max_utilization)

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


class Timeline:
    # A server runs for days: past this size the file moves to <name>.1 (replacing the previous one) and a
    # new one starts, so the timeline keeps the latest steps in at most twice this much disk.
    MAX_FILE_BYTES = 64 << 20

    def __init__(self, path: str | Path | None = None, keep: int = 4096):
        self.records: deque[StepRecord] = deque(maxlen=keep)
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._file = None
        self._written = 0
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", buffering=1)  # a server start begins a fresh timeline

    def add(self, record: StepRecord) -> None:
        with self._lock:
            self.records.append(record)
            if self._file:
                line = json.dumps(asdict(record)) + "\n"
                if self._written + len(line) > self.MAX_FILE_BYTES:
                    self._file.close()
                    self.path.replace(rotated(self.path))
                    self._file, self._written = self.path.open("w", buffering=1), 0
                self._file.write(line)
                self._written += len(line)

    def close(self) -> None:
        with self._lock:
            if self._file:
                self._file.close()
                self._file = None


def rotated(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def read_timeline(path: str | Path, start: float | None = None, end: float | None = None) -> list[StepRecord]:
    """Steps that began within [start, end] (wall clock), from the file and its rotated predecessor;
    a half-written last line is skipped."""
    records = []
    path = Path(path)
    for part in (rotated(path), path):
        if not part.is_file():
            continue
        for line in part.read_text().splitlines():
            try:
                record = StepRecord(**json.loads(line))
            except (ValueError, TypeError):
                continue
            if (start is None or record.start >= start) and (end is None or record.start <= end):
                records.append(record)
    return records


def copy_window(source: str | Path, run_dir: str | Path, start: float, end: float) -> Path | None:
    """A run's steps (wall clock start..end) into the run folder: engine_timeline.jsonl and the same as a
    Chrome / Perfetto trace, engine_timeline.trace.json. None when the engine wrote no steps then."""
    records = read_timeline(source, start, end)
    if not records:
        return None
    out = Path(run_dir) / TIMELINE_FILE
    out.write_text("".join(json.dumps(asdict(r)) + "\n" for r in records))
    out.with_suffix(".trace.json").write_text(json.dumps(chrome_trace(records)))
    return out


def chrome_trace(records: list[StepRecord]) -> dict:
    """Trace Event Format: a complete event per step and counter tracks, timestamps in microseconds."""
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "cpu engine"}}]
    for r in records:
        ts = r.start * 1e6
        kind = "mixed" if r.context_requests and r.generation_requests else (
            "prefill" if r.context_requests else "decode")
        events.append({"name": f"step {kind}", "cat": "step", "ph": "X", "pid": 1, "tid": 1, "ts": ts,
                       "dur": r.duration * 1e6, "args": asdict(r)})
        events.append({"name": "batch", "ph": "C", "pid": 1, "ts": ts,
                       "args": {"context": r.context_requests, "generation": r.generation_requests}})
        events.append({"name": "tokens", "ph": "C", "pid": 1, "ts": ts,
                       "args": {"prefill": r.prefill_tokens, "decode": r.decode_tokens}})
        events.append({"name": "kv blocks", "ph": "C", "pid": 1, "ts": ts, "args": {"used": r.kv_blocks_used}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
