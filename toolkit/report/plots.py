"""Plots of sweep runs, as PNG bytes (matplotlib, Agg). Inputs are RunDirs only.

`comparison_plots` and `run_plots` hand the report (lazy) plot makers in the order the page shows them.
Conventions: a load axis never mixes concurrency and request rate (one plot per mode); concurrency
axes are log-2 with the measured levels as ticks; lines join only steps of one ISL/OSL; every axis
says which way is better where one is.
"""

from __future__ import annotations

import io
from typing import Callable

from toolkit.bench.metrics import METRICS, InterChunkGap, InterTokenLatency
from toolkit.bench.rundir import RunDir, step_level
from toolkit.deploy.names import ENGINE_MODEL, QUEUE_US, REQUEST_SUCCESS

_MODES = {"concurrency": "concurrency (in-flight requests)", "rate": "request rate (requests/s)"}


def _figure(width=7.0, height=4.0, rows=1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(rows, 1, figsize=(width, height), sharex=rows > 1, squeeze=True)
    return plt, fig, ax


def _png(plt, fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


LEGEND_INSIDE_MAX = 6  # entries; more (an A/B's runs, each with p50 and p99) cover the lines, so they go below


def _legend(ax, fig, handles=None, labels=None, **inside) -> None:
    """The axes' legend inside them (at `inside`'s place) where it is short, else below them in two columns, the
    figure grown to hold it."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if len(handles) <= LEGEND_INSIDE_MAX:
        ax.legend(handles, labels, fontsize=7, **inside)
        return
    fig.set_figheight(fig.get_figheight() + 0.18 * -(-len(handles) // 2))
    ax.legend(handles, labels, fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def _colors(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _load_colors(n: int) -> list:
    """A light-to-dark sequence for load levels (kept apart from the plan's own red and blue)."""
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    return [cmap(0.85 - 0.75 * i / max(1, n - 1)) for i in range(n)]


def _shape(step: dict) -> tuple:
    return step.get("input_tokens"), step.get("output_tokens")


def _shape_label(shape: tuple, shapes: set) -> str:
    return f" ISL {shape[0]}/OSL {shape[1]}" if len(shapes) > 1 else ""


def log2_levels(ax, levels: list[float]) -> None:
    """A log-2 axis whose ticks are the measured levels (1 2 4 8 ..., or whatever was swept)."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted(set(levels)))
    ax.set_xticklabels([f"{v:g}" for v in sorted(set(levels))])


# ---------------------------------------------------------------- across runs


def latency_vs_load(runs: list[RunDir], labels: list[str], tag: str, name: str, mode: str) -> bytes | None:
    """p50 (solid) and p99 (dashed) of one latency metric against load, for the runs' steps of one mode."""
    plt, fig, ax = _figure()
    levels, drawn = [], False
    shapes = {_shape(s) for r in runs for s in r.steps if s.get("mode", "concurrency") == mode}
    for run, label, color in zip(runs, labels, _colors(len(runs))):
        by_shape: dict[tuple, list[dict]] = {}
        for s in run.steps:
            if s.get("mode", "concurrency") == mode and tag in s["metrics"]:
                by_shape.setdefault(_shape(s), []).append(s)
        for shape, steps in by_shape.items():
            steps = sorted(steps, key=step_level)
            x = [step_level(s) for s in steps]
            levels += x
            for pct, style in (("p50", "-o"), ("p99", "--x")):
                ax.plot(x, [s["metrics"][tag][pct] for s in steps], style, color=color,
                        label=f"{label}{_shape_label(shape, shapes)} {pct}")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if mode == "concurrency":
        log2_levels(ax, levels)
    ax.set_xlabel(_MODES[mode])
    ax.set_ylabel(f"{name} ({METRICS[tag].unit}) — lower is better")
    ax.set_title(f"{name} p50 / p99 vs {mode}")
    ax.grid(alpha=0.3)
    _legend(ax, fig)
    return _png(plt, fig)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes, when higher is better on both (sorted by x)."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def interactivity_points(runs: list[RunDir]) -> dict[tuple, list[tuple[float, float]]]:
    """Per ISL/OSL: (tokens/s per user p50, tokens/s per GPU or replica) of every step of every run."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for run in runs:
        divisor, _ = replicas_unit(run)
        for step in run.steps:
            per_user = step["metrics"].get("output_token_throughput_per_user")
            if per_user:
                groups.setdefault(_shape(step), []).append(
                    (per_user["p50"], step["output_token_throughput"]["avg"] / divisor))
    return groups


def replicas_unit(run: RunDir) -> tuple[int, str]:
    """What a throughput is divided by: GPUs (TP × PP) on a GPU target, the one replica on CPU."""
    info = run.info
    d = info.get("plan_deployment") or {}
    if info.get("target") == "cpu" or (info.get("plan") or {}).get("gpu") == "cpu":
        return 1, "replica"
    return max(1, int(d.get("tp", 1)) * int(d.get("pp", 1))), "GPU"


def throughput_vs_interactivity(runs: list[RunDir], labels: list[str]) -> bytes | None:
    """The field's trade-off plot: output tokens/s per user (x) against output tokens/s per GPU or per
    replica (y); up and to the right is better. One Pareto frontier per ISL/OSL, never across them."""
    plt, fig, ax = _figure(7.0, 4.5)
    units, drawn = set(), False
    markers = {"concurrency": "o", "rate": "s"}
    for run, label, color in zip(runs, labels, _colors(len(runs))):
        divisor, unit = replicas_unit(run)
        units.add(unit)
        for step in run.steps:
            per_user = step["metrics"].get("output_token_throughput_per_user")
            if not per_user:
                continue
            x, y = per_user["p50"], step["output_token_throughput"]["avg"] / divisor
            mode = step.get("mode", "concurrency")
            ax.plot([x], [y], markers.get(mode, "o"), color=color, label=label)
            ax.annotate(f"{'c' if mode == 'concurrency' else 'r'}{step_level(step):g}", (x, y), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    for ((isl, osl), points), style in zip(interactivity_points(runs).items(), ["--", ":", "-.", (0, (5, 5))] * 9):
        front = pareto_front(points)
        if len(front) > 1:
            ax.plot([p[0] for p in front], [p[1] for p in front], color="black", linestyle=style, linewidth=1,
                    label=f"Pareto frontier ISL {isl}/OSL {osl}")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    _legend(ax, fig, list(unique.values()), list(unique.keys()), loc="lower left")
    ax.annotate("better", xy=(0.97, 0.95), xytext=(0.82, 0.78), xycoords="axes fraction", fontsize=8,
                arrowprops={"arrowstyle": "->", "color": "tab:green"}, color="tab:green")
    per = " / ".join(sorted(units))
    ax.set_xlabel("output tokens/s per user (p50, = 1 / ITL) — higher is better")
    ax.set_ylabel(f"output tokens/s per {per} — higher is better")
    ax.set_title("Throughput vs interactivity (labels: c = concurrency, r = request rate)")
    ax.grid(alpha=0.3)
    return _png(plt, fig)


def comparison_plots(runs: list[RunDir], labels: list[str]) -> list[tuple[str, Callable[[], bytes | None]]]:
    modes = [m for m in ("concurrency", "rate") if any(s.get("mode", "concurrency") == m for r in runs for s in r.steps)]
    out = []
    for mode in modes:
        out += [(f"TTFT vs {mode}", lambda m=mode: latency_vs_load(runs, labels, "time_to_first_token", "TTFT", m)),
                (f"ITL vs {mode}", lambda m=mode: latency_vs_load(runs, labels, "inter_token_latency", "ITL", m))]
    out.append(("throughput vs interactivity", lambda: throughput_vs_interactivity(runs, labels)))
    return out


# ---------------------------------------------------------------- one run


def _ecdf(ax, values: list[float], label: str) -> None:
    values = sorted(values)
    n = len(values)
    ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})")


TAIL_QUANTILE = 0.99  # an ECDF's x axis ends a little past this quantile where a few values lie far beyond it
TAIL_STRETCH = 3.0  # ... that is, where the largest value is more than this many times the quantile


def ecdf_x_limit(values: list[float]) -> tuple[float, int] | None:
    """(the x axis' right end, how many values lie beyond it), or None to show every value: one stalled gap of
    700 ms among gaps of 5-15 ms would squeeze every curve against the left edge."""
    if len(values) < 20:
        return None
    ordered = sorted(values)
    tail = ordered[min(len(ordered) - 1, int(TAIL_QUANTILE * len(ordered)))]
    if tail <= 0 or ordered[-1] <= TAIL_STRETCH * tail:
        return None
    limit = 1.2 * tail
    return limit, sum(v > limit for v in ordered)


def distribution(run: RunDir, label: str, metric, title: str) -> bytes | None:
    """ECDF per step of one per-request metric (every value the metric gives, e.g. each chunk gap)."""
    plt, fig, ax = _figure()
    everything = []
    steps = {s["step"]: s for s in run.steps}
    for step, records in run.measured_records_by_step().items():
        values = [v for r in records for v in metric.values(r)]
        if values:
            _ecdf(ax, values, step_label(steps.get(step), step))
            everything += values
    if not everything:
        plt.close(fig)
        return None
    cut = ecdf_x_limit(everything)
    if cut:
        limit, beyond = cut
        ax.set_xlim(left=min(0.0, min(everything)), right=limit)
        ax.text(0.98, 0.04, f"{beyond} of {len(everything)} beyond the axis, up to {max(everything):,.1f} {metric.unit}",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="0.3")
    ax.set_xlabel(f"{metric.header.lower()} ({metric.unit}) — lower is better")
    ax.set_ylabel("fraction of values ≤ x")
    ax.set_title(f"{title} — {label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def step_label(step: dict | None, name: str) -> str:
    if not step:
        return name
    load = f"rate {step['rate']:g}/s" if step.get("mode") == "rate" else f"c{step.get('concurrency')}"
    return f"{load} ISL {step.get('input_tokens')}/OSL {step.get('output_tokens')}"


def short_step_label(step: dict, shapes: int) -> str:
    """c4 / r2 (with the shape only where a sweep has several), for labels inside narrow bands."""
    load = f"r{step['rate']:g}" if step.get("mode") == "rate" else f"c{step.get('concurrency')}"
    return load if shapes == 1 else f"{load} {step.get('input_tokens')}/{step.get('output_tokens')}"


def phase_shares(run: RunDir, label: str) -> bytes | None:
    steps = [s for s in run.steps if s.get("phases")]
    if not steps:
        return None
    plt, fig, ax = _figure()
    names = [step_label(s, s["step"]) for s in steps]
    prefill = [s["phases"]["prefill_ms"] for s in steps]
    decode = [s["phases"]["decode_ms"] for s in steps]
    ax.bar(names, prefill, label="prefill (TTFT)", color="tab:red")
    ax.bar(names, decode, bottom=prefill, label="decode (latency − TTFT)", color="tab:blue")
    ax.set_ylabel("mean request latency (ms)")
    ax.set_title(f"Prefill vs decode — {label}")
    ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def step_spans(run: RunDir) -> list[tuple[str, float, float]]:
    """Each sweep step's first send → last end, on the records' monotonic clock."""
    spans = []
    steps = {s["step"]: s for s in run.steps}
    shapes = len({_shape(s) for s in run.steps})
    for step in steps:
        records = [r for r in run.records() if r.step == step]
        if records:
            ends = [r.end_time or (r.chunk_times[-1] if r.chunk_times else r.send_time) for r in records]
            spans.append((short_step_label(steps[step], shapes), min(r.send_time for r in records), max(ends)))
    return spans


def _mark_steps(axes, spans: list[tuple[str, float, float]], t0: float, label_axis=None) -> None:
    for i, (name, start, end) in enumerate(spans):
        for ax in axes:
            ax.axvspan(start - t0, end - t0, color="tab:gray", alpha=0.08 if i % 2 else 0.16, linewidth=0)
            ax.axvline(start - t0, color="tab:gray", linewidth=0.8, linestyle=":")
        if label_axis is not None:
            label_axis.text(start - t0, 1.0, f" {name}", transform=label_axis.get_xaxis_transform(), fontsize=6,
                            va="bottom", ha="left", rotation=0, color="dimgray")


def server_timeline(run: RunDir, label: str) -> bytes | None:
    from toolkit.bench.server_metrics import sum_metric

    samples = run.server_metrics()
    if len(samples) < 2:
        return None
    spans = step_spans(run)
    t0 = min([samples[0]["time"]] + [s[1] for s in spans])
    plt, fig, ax = _figure(7.0, 4.2)
    times = [s["time"] - t0 for s in samples]
    kv = [sum_metric(s["metrics"], "toolkit_kv_cache_blocks_used")
          or sum_metric(s["metrics"], "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") for s in samples]
    ax.plot(times, kv, color="tab:purple", label="KV blocks used")
    ax.set_xlabel("seconds since the sweep began (shaded: one band per step)")
    ax.set_ylabel("KV-cache blocks used")
    twin = ax.twinx()
    # Queue time per request between scrapes in which requests completed (undefined in between).
    queue_points, previous = [], None
    for t, s in zip(times, samples):
        q = sum_metric(s["metrics"], QUEUE_US, model=ENGINE_MODEL)
        n = sum_metric(s["metrics"], REQUEST_SUCCESS, model=ENGINE_MODEL)
        if previous and n > previous[1]:
            queue_points.append((t, (q - previous[0]) / (n - previous[1]) / 1e3))
        if previous is None or n > previous[1]:
            previous = (q, n)
    if queue_points:
        twin.plot([p[0] for p in queue_points], [p[1] for p in queue_points], ".", color="tab:orange",
                  label="queue ms / request")
    twin.set_ylabel("engine queue time per request (ms)")
    _mark_steps([ax], spans, t0, label_axis=ax)
    ax.set_title(f"Server over time — {label}", pad=14)
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="upper right")
    return _png(plt, fig)


def engine_timeline(run: RunDir, label: str) -> bytes | None:
    """The embedded engine's own steps (engine_timeline.jsonl, fetched into the run folder by the sweep):
    step duration, batch composition, tokens per step and KV blocks, with the sweep's steps shaded."""
    steps = run.engine_steps()
    if len(steps) < 2:
        return None
    spans = step_spans(run)
    t0 = min([steps[0]["mono"]] + [s[1] for s in spans])
    plt, fig, axes = _figure(7.0, 7.5, rows=4)
    t = [s["mono"] - t0 for s in steps]
    axes[0].plot(t, [s["duration"] * 1e3 for s in steps], ".", markersize=2, color="tab:gray")
    axes[0].set_ylabel("step (ms)")
    axes[1].plot(t, [s["context_requests"] for s in steps], ".", markersize=2, color="tab:red", label="prefilling")
    axes[1].plot(t, [s["generation_requests"] for s in steps], ".", markersize=2, color="tab:blue", label="decoding")
    axes[1].set_ylabel("sequences")
    axes[2].plot(t, [s["prefill_tokens"] for s in steps], ".", markersize=2, color="tab:red", label="prefill")
    axes[2].plot(t, [s["decode_tokens"] for s in steps], ".", markersize=2, color="tab:blue", label="decode")
    axes[2].set_ylabel("tokens / step")
    axes[3].plot(t, [s["kv_blocks_used"] for s in steps], color="tab:purple", linewidth=1, label="used")
    axes[3].axhline(steps[-1]["kv_blocks_max"], color="tab:purple", linestyle="--", linewidth=0.8, label="capacity")
    axes[3].set_ylabel("KV blocks")
    axes[3].set_xlabel("seconds since the sweep began (shaded: one band per step)")
    for ax in axes[1:]:
        ax.legend(fontsize=6, loc="upper right")
    _mark_steps(axes, spans, t0, label_axis=axes[0])
    axes[0].set_title(f"Engine steps ({len(steps)}) — {label}", pad=14)
    return _png(plt, fig)


def _in_flight(step: dict) -> float:
    """Concurrency, or for a rate step the mean requests in flight (Little's law: rate × latency)."""
    if step.get("concurrency"):
        return float(step["concurrency"])
    latency = step["metrics"].get("request_latency", {}).get("avg", 0.0) / 1e3
    return max(1.0, step["request_throughput"]["avg"] * latency)


def roofline_with_measurements(run: RunDir) -> bytes | None:
    """The run's plan (model × plan GPU) with each step's achieved prefill (▲) and decode (▼) points,
    coloured by load."""
    from toolkit.model.spec import ModelSpec
    from toolkit.plan.memory import Deployment
    from toolkit.plan.plot import plot_roofline
    from toolkit.plan.roofline import phase_intensity

    plan = run.plan()  # written by the sweep: a report never re-plans (nor re-probes the CPU)
    if plan is None:
        return None
    spec = ModelSpec(**{k: v for k, v in plan["model"].items() if k != "total_params"})
    d = Deployment(**plan["deployment"])
    steps = [s for s in run.steps if "time_to_first_token" in s["metrics"] and "inter_token_latency" in s["metrics"]]
    colors = dict(zip([s["step"] for s in sorted(steps, key=_in_flight)], _load_colors(len(steps))))
    points = []
    for step in steps:
        m, load = step["metrics"], step_label(step, step["step"])
        batch = _in_flight(step)
        # Decode: every in-flight sequence advances one token per forward pass → 2·P FLOPs per token.
        points.append({"intensity": phase_intensity(spec, max(1, round(batch)), d.weights),
                       "achieved_flops": 2 * spec.total_params * step["output_token_throughput"]["avg"],
                       "label": f"decode, {load}", "marker": "v", "color": colors[step["step"]]})
        isl = m["input_sequence_length"]["avg"]
        points.append({"intensity": phase_intensity(spec, int(isl), d.weights),
                       "achieved_flops": 2 * spec.total_params * isl / (m["time_to_first_token"]["p50"] / 1e3),
                       "label": f"prefill, {load}", "marker": "^", "color": colors[step["step"]]})
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        return plot_roofline(plan, Path(tmp) / "roofline.png", measured=points).read_bytes()


def run_plots(run: RunDir, label: str) -> list[tuple[str, Callable[[], bytes | None]]]:
    return [("prefill vs decode", lambda: phase_shares(run, label)),
            ("ITL distribution", lambda: distribution(run, label, InterTokenLatency(),
                                                       "ITL per request (ECDF)")),
            ("inter-chunk gap distribution", lambda: distribution(run, label, InterChunkGap(),
                                                                   "Inter-chunk gaps, every response (ECDF)")),
            ("server over time", lambda: server_timeline(run, label)),
            ("engine steps over time", lambda: engine_timeline(run, label)),
            ("roofline with measured points", lambda: roofline_with_measurements(run))]
