"""Markdown report of one or several sweep runs: a table per step, server view, prefill vs decode."""

from __future__ import annotations

from pathlib import Path

from toolkit.bench.metrics import RECORD_METRICS
from toolkit.bench.rundir import RunDir

COLUMNS = ["avg", "min", "max", "p50", "p90", "p95", "p99"]
DEFINITIONS = ("Definitions (genai-perf / AIPerf): TTFT = first response − send; ITL = (latency − TTFT) / "
               "(output tokens − 1); inter-chunk gap = every gap between consecutive responses; output tokens as "
               "the server reports them (Triton `output_token_count`, OpenAI `usage`), else counted with the "
               "model's tokenizer. Throughputs divide by the step's window, first send → last completion.")


def fmt(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def step_title(step: dict) -> str:
    if step.get("mode") == "rate":
        load = f"Request rate {step['rate']:g}/s"
    else:
        load = f"Concurrency {step.get('concurrency')}"
    shape = f" (ISL {step['input_tokens']}, OSL {step['output_tokens']})" if "input_tokens" in step else ""
    return load + shape


def step_table(step: dict) -> str:
    lines = ["| Metric | Unit | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for metric in RECORD_METRICS:
        stats = step["metrics"].get(metric.tag)
        if stats:
            lines.append(f"| {metric.header} | {stats['unit']} | " + " | ".join(fmt(stats[c]) for c in COLUMNS) + " |")
    lines.append("")
    lines.append(f"- Output token throughput: **{fmt(step['output_token_throughput']['avg'])} tokens/s**; "
                 f"request throughput: **{step['request_throughput']['avg']:.3f} requests/s**; "
                 f"{step['request_count']} requests in {step['duration_s']:.2f} s")
    if step.get("small_sample"):
        lines.append(f"- Only {step['request_count']} requests: the tail percentiles (p90–p99) rest on one or two "
                     "of them; measure more (--requests) before comparing tails")
    if step.get("goodput"):
        g = step["goodput"]
        slo = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in g["slo"].items() if v is not None)
        lines.append(f"- Goodput: **{g['avg']:.3f} requests/s** ({g['good_requests']} of {step['request_count']} "
                     f"met {slo})")
    if step["error_count"]:
        kinds = ", ".join(f"{k}: {v}" for k, v in step["errors_by_kind"].items())
        lines.append(f"- **Errors: {step['error_count']}** ({kinds})")
    server = step.get("server") or {}
    parts = []
    for model in ("ensemble", "tensorrt_llm"):
        if model in server:
            parts.append(f"{model} queue {fmt(server[model]['queue_ms_per_request'])} ms per request")
    if "kv_cache" in server:
        kv = server["kv_cache"]
        parts.append(f"KV blocks used max {kv['blocks_used_max']:g} of {kv['blocks_max']:g} "
                     f"({100 * kv['utilization_max']:.0f} %)")
    if "pending_requests_max" in server:
        parts.append(f"pending requests max {server['pending_requests_max']:g}")
    for phase in ("prefill", "decode"):
        if f"{phase}_ms_mean" in server:
            parts.append(f"engine {phase} mean {fmt(server[f'{phase}_ms_mean'])} ms")
    if parts:
        lines.append("- Server (Triton /metrics): " + "; ".join(parts))
    return "\n".join(lines)


def phase_section(run: RunDir) -> str:
    lines = ["### Prefill vs decode", "",
             "Prefill is the time to first token (queueing + prompt processing); decode is the rest of the "
             "request (one forward pass per output token).", "",
             "| Step | Prefill (TTFT) ms | Decode ms | Prefill share | Decode share | Dominant |",
             "|---|---:|---:|---:|---:|---|"]
    for step in run.steps:
        p = step.get("phases")
        if p:
            lines.append(f"| {step_title(step)} | {fmt(p['prefill_ms'])} | {fmt(p['decode_ms'])} | "
                         f"{100 * p['prefill_share']:.1f} % | {100 * p['decode_share']:.1f} % | {p['dominant']} |")
    dominant = {s["phases"]["dominant"] for s in run.steps if s.get("phases")}
    if dominant == {"decode"}:
        lines += ["", "Decode dominates end-to-end latency at every step: cut bytes read per token "
                      "(weight quantization, FP8 KV cache) or raise batch efficiency to move it."]
    elif dominant == {"prefill"}:
        lines += ["", "Prefill (time to first token) dominates: look at queueing, prompt length and chunked prefill."]
    return "\n".join(lines)


def run_header(run: RunDir) -> list[str]:
    info = run.summary.get("run", {})
    out = []
    for key in ("config_name", "model", "qformat", "kv_cache_dtype", "endpoint", "target"):
        if info.get(key) not in (None, ""):
            out.append(f"- {key.replace('_', ' ')}: `{info[key]}`")
    s = info.get("sweep")
    if s:
        if s.get("mode") == "rate":
            cap = s.get("max_concurrency") or "uncapped"
            load = f"rate {s.get('request_rates')} req/s ({s.get('arrival')}, max in flight {cap})"
        else:
            load = f"concurrency {s.get('concurrencies')}"
        bound = " and/or ".join(x for x in (f"{s['requests_per_step']} requests" if s.get("requests_per_step") else "",
                                            f"{s['duration_s']:g} s" if s.get("duration_s") else "") if x)
        out.append(f"- load: {load}, {bound} per step, input {s.get('input_tokens_mean')} ± "
                   f"{s.get('input_tokens_stddev')} tokens, output {s.get('output_tokens')} ± "
                   f"{s.get('output_tokens_stddev', 0)} tokens (ignore EOS), {s.get('warmup_requests')} warm-up "
                   f"requests before the sweep and {s.get('step_warmup_requests') or 0} opening each step "
                   f"excluded, seed {s.get('seed')}")
    if run.summary.get("aborted"):
        out += ["", f"> **Partial run:** {run.summary['aborted']}. The steps below hold what was measured."]
    return out


def comparison_table(runs: list[RunDir]) -> str:
    lines = ["| Run | Step | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | Latency p50 ms | Output tok/s | Errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        for step in run.steps:
            m = step["metrics"]

            def cell(tag, pct):
                return fmt(m[tag][pct]) if tag in m else "-"

            lines.append(f"| {run.label} | {step_title(step)} | {cell('time_to_first_token', 'p50')} | "
                         f"{cell('time_to_first_token', 'p99')} | {cell('inter_token_latency', 'p50')} | "
                         f"{cell('inter_token_latency', 'p99')} | {cell('request_latency', 'p50')} | "
                         f"{fmt(step['output_token_throughput']['avg'])} | {step['error_count']} |")
    return "\n".join(lines)


def render_markdown(runs: list[RunDir]) -> str:
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs compared"
    out = [f"# Sweep report: {title}", "", DEFINITIONS, ""]
    if len(runs) > 1:
        out += ["## Comparison", "", comparison_table(runs), ""]
    for run in runs:
        out += [f"## Run {run.label} ({run.name})" if len(runs) > 1 else "## Run", ""] + run_header(run)
        for step in run.steps:
            out += ["", f"### {step_title(step)}", "", step_table(step)]
        out += ["", phase_section(run), ""]
    return "\n".join(out)


def write_markdown_report(runs: RunDir | list[RunDir], out_path: Path | None = None) -> Path:
    runs = runs if isinstance(runs, list) else [runs]
    path = out_path or runs[0].path / "report.md"
    path.write_text(render_markdown(runs))
    return path
