"""A scenario's figure: baseline against fix, from the run folders only (PNG, matplotlib Agg)."""

from __future__ import annotations

from pathlib import Path

from toolkit.bench.rundir import RunDir
from toolkit.bench.server_metrics import metric_series
from toolkit.report.doctor_workloads import prefill_floor_ms, ttft_by_length
from toolkit.report.plots import _figure, _png
from toolkit.scenarios.analysis import values

Runs = dict[str, list[RunDir]]


def _records(reps: list[RunDir]):
    return [r for run in reps for rs in run.measured_records_by_step().values() for r in rs]


def _cdf(ax, data: list[float], label: str) -> None:
    data = sorted(data)
    if data:
        ax.step(data, [(i + 1) / len(data) for i in range(len(data))], where="post", label=f"{label} (n={len(data)})")


def _finish(plt, fig, ax, xlabel: str, ylabel: str, title: str) -> bytes:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(plt, fig)


def ttft_vs_isl(runs: Runs, title: str) -> bytes:
    plt, fig, ax = _figure()
    for label, reps in runs.items():
        points: dict[int, list[float]] = {}
        for run in reps:
            for isl, ttft in ttft_by_length(run):
                points.setdefault(isl, []).append(ttft)
        xs = sorted(points)
        ax.plot(xs, [sorted(points[x])[len(points[x]) // 2] for x in xs], "-o", label=f"{label}: TTFT p50")
    first = next(iter(runs.values()))[0]
    xs = [isl for isl, _ in ttft_by_length(first)]
    floor = [prefill_floor_ms(first, x) for x in xs]
    if xs and all(f is not None for f in floor):
        ax.plot(xs, floor, "k--", label="prefill floor (toolkit plan)")
    return _finish(plt, fig, ax, "prompt tokens", "ms", title)


def itl_vs_context(runs: Runs, title: str) -> bytes:
    plt, fig, ax = _figure()
    for label, reps in runs.items():
        rs = [r for r in _records(reps) if r.inter_token_latency]
        ax.scatter([r.input_tokens for r in rs], [r.inter_token_latency * 1e3 for r in rs], s=12, alpha=0.7, label=label)
    return _finish(plt, fig, ax, "context at the turn (prompt tokens, history included)", "ITL (ms)", title)


def gaps_cdf(runs: Runs, title: str) -> bytes:
    """Left: each short stream's longest pause (what the A/B judges); right: every gap between tokens."""
    plt, fig, _ = _figure()
    plt.close(fig)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, reps) in enumerate(runs.items()):
        pauses = sorted(values([r for r in _records(reps) if r.request_class == "short"], "max_gap", None))
        left.scatter([i + 0.25 * ((k % 7) / 6 - 0.5) for k in range(len(pauses))], pauses, s=10, alpha=0.6)
        if pauses:
            left.hlines(pauses[len(pauses) // 2], i - 0.3, i + 0.3, colors="k")
        _cdf(right, [g * 1e3 for r in _records(reps) if r.request_class == "short" for g in r.chunk_gaps], label)
    left.set_xticks(range(len(runs)), list(runs))
    left.set_ylabel("longest pause per short stream (ms; line: median)")
    right.set_xscale("log")
    fig.suptitle(title)
    return _finish(plt, fig, right, "gap between a short stream's tokens (ms, log)", "fraction of gaps ≤ x", "")


def ttft_cdf(runs: Runs, title: str) -> bytes:
    plt, fig, ax = _figure()
    for label, reps in runs.items():
        _cdf(ax, values(_records(reps), "ttft", None), label)
    return _finish(plt, fig, ax, "TTFT (ms)", "fraction of requests ≤ x", title)


def kv_and_latency(runs: Runs, title: str) -> bytes:
    plt, fig, _ = _figure()
    plt.close(fig)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, reps in runs.items():
        _cdf(left, values(_records(reps), "ttft", None), label)
        samples = reps[0].server_metrics()
        used = metric_series(samples, "toolkit_kv_cache_blocks_used") or metric_series(
            samples, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")
        if used:
            right.plot(range(len(used)), used, label=f"{label}: blocks used")
    left.set_xlabel("TTFT (ms)")
    left.set_ylabel("fraction of requests ≤ x")
    left.legend(fontsize=8)
    right.set_xlabel("metrics sample (every 0.25 s)")
    right.set_ylabel("KV blocks used")
    right.legend(fontsize=8)
    fig.suptitle(title)
    return _png(plt, fig)


def itl_by_step(runs: Runs, title: str) -> bytes:
    plt, fig, ax = _figure()
    labels = list(runs)
    steps = [s["step"] for s in runs[labels[0]][0].steps]
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        medians = []
        for step in steps:
            v = sorted(x for run in runs[label] for x in values(run.measured_records_by_step().get(step, []), "itl", None))
            medians.append(v[len(v) // 2] if v else 0.0)
        ax.bar([k + i * width for k in range(len(steps))], medians, width, label=label)
    ax.set_xticks([k + width * (len(labels) - 1) / 2 for k in range(len(steps))], steps)
    return _finish(plt, fig, ax, "step", "ITL p50 (ms)", title)


def write_figure(kind: str, runs: Runs, title: str, path: Path) -> Path:
    path.write_bytes(globals()[kind](runs, title))
    return path
