"""What a testbed run showed, from its files only: the controller's timeline and the sweep's records.
Pure functions, so an old run can be re-read and re-plotted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def read_timeline(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def windowed_p95(times: list[float], values: list[float], edges: np.ndarray) -> list[float | None]:
    """p95 of the values whose time falls in each [edge, next edge)."""
    out = []
    times_a, values_a = np.asarray(times), np.asarray(values)
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = values_a[(times_a >= lo) & (times_a < hi)]
        out.append(float(np.percentile(inside, 95)) if inside.size else None)
    return out


def request_outcomes(records: list[dict]) -> dict:
    """Failed (an error) and cut-off (fewer tokens than asked, with EOS ignored) requests, warm-up excluded."""
    measured = [r for r in records if not r.get("warmup")]
    failed = [r for r in measured if r.get("error")]
    cut = [r for r in measured if not r.get("error") and r.get("output_tokens", 0) < r["requested_output_tokens"]]
    return {"requests": len(measured), "failed": len(failed), "cut_off": len(cut),
            "errors": sorted({r["error"][:120] for r in failed})[:5]}


def scaling_events(timeline: list[dict]) -> list[dict]:
    """Each change of the ready replica count: when (seconds from the first row), from, to."""
    events = []
    for before, after in zip(timeline, timeline[1:]):
        if after["replicas"] != before["replicas"]:
            events.append({"t": after["t"] - timeline[0]["t"], "from": before["replicas"], "to": after["replicas"],
                           "metrics": after["metrics"]})
    return events


def ramp_steps(records: list[dict]) -> list[tuple[float, float, float]]:
    """(first send, last end, offered rate) of each step in send order; a ramp may repeat a rate."""
    steps: list[list] = []
    for r in sorted((r for r in records if not r.get("warmup")), key=lambda r: r["send_time"]):
        end = r["end_time"] or r["send_time"]
        if steps and steps[-1][3] == r["step"]:
            steps[-1][1] = max(steps[-1][1], end)
        else:
            steps.append([r["send_time"], end, float(r["step"].rsplit("_", 1)[-1]), r["step"]])
    return [(start, end, rate) for start, end, rate, _ in steps]
