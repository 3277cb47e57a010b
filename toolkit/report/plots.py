"""Plots of sweep runs, as PNG bytes (matplotlib, Agg). Inputs are RunDirs only."""

from __future__ import annotations

import io

from toolkit.bench.rundir import RunDir, step_level


def _figure(width=7.0, height=4.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    return plt, fig, ax


def _png(plt, fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def level_label(runs: list[RunDir]) -> str:
    modes = {s.get("mode", "concurrency") for r in runs for s in r.steps}
    return "concurrency" if modes == {"concurrency"} else "request rate (req/s)" if modes == {"rate"} else "load level"


def latency_vs_load(runs: list[RunDir], tag: str, title: str) -> bytes:
    plt, fig, ax = _figure()
    for run in runs:
        steps = [s for s in run.steps if tag in s["metrics"]]
        x = [step_level(s) for s in steps]
        for pct, style in (("p50", "-o"), ("p99", "--x")):
            ax.plot(x, [s["metrics"][tag][pct] for s in steps], style, label=f"{run.label} {pct}")
    ax.set_xlabel(level_label(runs))
    ax.set_ylabel(f"{title} (ms)")
    ax.set_title(f"{title} vs load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not beaten by another with lower-or-equal latency (x) and higher-or-equal throughput (y)."""
    front = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def throughput_vs_latency(runs: list[RunDir]) -> bytes:
    plt, fig, ax = _figure()
    everything = []
    for run in runs:
        pts = [(s["metrics"]["request_latency"]["p50"], s["output_token_throughput"]["avg"])
               for s in run.steps if "request_latency" in s["metrics"]]
        everything += pts
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=run.label)
        for s, (x, y) in zip([s for s in run.steps if "request_latency" in s["metrics"]], pts):
            ax.annotate(f"{step_level(s):g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = pareto_front(everything)
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", linewidth=1, label="Pareto frontier")
    ax.set_xlabel("request latency p50 (ms)")
    ax.set_ylabel("output token throughput (tokens/s)")
    ax.set_title("Throughput vs latency (labels: load level)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def itl_distribution(run: RunDir) -> bytes:
    plt, fig, ax = _figure()
    for step, records in run.measured_records_by_step().items():
        gaps = [g * 1e3 for r in records for g in r.chunk_gaps]
        if gaps:
            ax.hist(gaps, bins=50, histtype="step", label=step)
    ax.set_xlabel("inter-chunk gap (ms)")
    ax.set_ylabel("count")
    ax.set_title(f"ITL distribution — {run.label}")
    ax.legend(fontsize=7)
    return _png(plt, fig)


def phase_shares(run: RunDir) -> bytes:
    plt, fig, ax = _figure()
    steps = [s for s in run.steps if s.get("phases")]
    names = [s["step"] for s in steps]
    prefill = [s["phases"]["prefill_ms"] for s in steps]
    decode = [s["phases"]["decode_ms"] for s in steps]
    ax.bar(names, prefill, label="prefill (TTFT)", color="tab:red")
    ax.bar(names, decode, bottom=prefill, label="decode", color="tab:blue")
    ax.set_ylabel("mean request latency (ms)")
    ax.set_title(f"Prefill vs decode — {run.label}")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def server_timeline(run: RunDir) -> bytes | None:
    from toolkit.bench.server_metrics import sum_metric

    samples = run.server_metrics()
    if len(samples) < 2:
        return None
    t0 = samples[0]["time"]
    plt, fig, ax = _figure()
    times = [s["time"] - t0 for s in samples]
    kv = [sum_metric(s["metrics"], "toolkit_kv_cache_blocks_used")
          or sum_metric(s["metrics"], "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") for s in samples]
    ax.plot(times, kv, color="tab:purple", label="KV blocks used")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("KV-cache blocks used")
    twin = ax.twinx()
    # Queue time per request between scrapes in which requests completed (undefined in between).
    queue_points, previous = [], None
    for t, s in zip(times, samples):
        q = sum_metric(s["metrics"], "nv_inference_queue_duration_us", model="tensorrt_llm")
        n = sum_metric(s["metrics"], "nv_inference_request_success", model="tensorrt_llm")
        if previous and n > previous[1]:
            queue_points.append((t, (q - previous[0]) / (n - previous[1]) / 1e3))
        if previous is None or n > previous[1]:
            previous = (q, n)
    if queue_points:
        twin.plot([p[0] for p in queue_points], [p[1] for p in queue_points], ".", color="tab:orange",
                  label="queue ms / request")
    twin.set_ylabel("engine queue time per request (ms)")
    ax.set_title(f"Server over time — {run.label}")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="upper left")
    return _png(plt, fig)


def roofline_with_measurements(run: RunDir) -> bytes | None:
    """The run's plan (model × plan GPU) with each step's achieved decode and prefill points."""
    from toolkit.plan.gpus import gpu_spec
    from toolkit.plan.memory import Deployment
    from toolkit.plan.plot import plot_roofline
    from toolkit.plan.roofline import phase_intensity
    from toolkit.plan.stage import make_plan
    from toolkit.model.spec import ModelSpec

    info = run.summary.get("run", {})
    if "model_spec" not in info or "plan_deployment" not in info:
        return None
    spec_fields = {k: v for k, v in info["model_spec"].items() if k != "total_params"}
    spec = ModelSpec(**spec_fields)
    d = Deployment(**info["plan_deployment"])
    plan = make_plan(spec, gpu_spec(info.get("plan", {}).get("gpu", "cpu")), d)
    points = []
    for step in run.steps:
        m = step["metrics"]
        if "time_to_first_token" not in m or "inter_token_latency" not in m:
            continue
        level = step.get("concurrency") or 1
        # Decode: every in-flight sequence advances one token per step → 2·P FLOPs per token.
        decode_flops = 2 * spec.total_params * step["output_token_throughput"]["avg"]
        points.append({"intensity": phase_intensity(spec, int(level), d.weights), "achieved_flops": decode_flops,
                       "label": f"decode, {step['step']}"})
        isl = m["input_sequence_length"]["avg"]
        points.append({"intensity": phase_intensity(spec, int(isl), d.weights),
                       "achieved_flops": 2 * spec.total_params * isl / (m["time_to_first_token"]["p50"] / 1e3),
                       "label": f"prefill, {step['step']}"})
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = plot_roofline(plan, Path(tmp) / "roofline.png", measured=points)
        return path.read_bytes()
