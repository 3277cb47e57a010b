"""Markdown report of a sweep run: a table per concurrency and the prefill vs decode split."""

from __future__ import annotations

from pathlib import Path

from toolkit.report.rundir import RunDir

_ROWS = ["time_to_first_token", "time_to_second_token", "inter_token_latency", "inter_chunk_gap",
         "request_latency", "prefill_share", "input_sequence_length", "output_sequence_length",
         "output_token_throughput_per_user"]
_HEADERS = {"time_to_first_token": "Time to first token", "time_to_second_token": "Time to second token",
            "inter_token_latency": "Inter-token latency", "inter_chunk_gap": "Inter-chunk gap",
            "request_latency": "Request latency", "prefill_share": "TTFT share of latency",
            "input_sequence_length": "Input sequence length", "output_sequence_length": "Output sequence length",
            "output_token_throughput_per_user": "Output tokens/s per user"}
_COLUMNS = ["avg", "min", "max", "p50", "p90", "p95", "p99"]


def _fmt(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def step_table(step: dict) -> str:
    lines = ["| Metric | Unit | " + " | ".join(_COLUMNS) + " |", "|---|---|" + "---:|" * len(_COLUMNS)]
    for tag in _ROWS:
        stats = step["metrics"].get(tag)
        if stats:
            lines.append(f"| {_HEADERS[tag]} | {stats['unit']} | " + " | ".join(_fmt(stats[c]) for c in _COLUMNS) + " |")
    lines.append("")
    lines.append(f"- Output token throughput: **{_fmt(step['output_token_throughput']['avg'])} tokens/s**; "
                 f"request throughput: **{step['request_throughput']['avg']:.3f} requests/s**; "
                 f"{step['request_count']} requests in {step['duration_s']:.2f} s")
    if step.get("goodput"):
        g = step["goodput"]
        lines.append(f"- Goodput: {g['avg']:.3f} requests/s ({g['good_requests']} of {step['request_count']} met {g['slo']})")
    if step["error_count"]:
        lines.append(f"- **Errors: {step['error_count']}** ({', '.join(f'{k}: {v}' for k, v in step['errors_by_kind'].items())})")
    return "\n".join(lines)


def phase_section(run: RunDir) -> str:
    lines = ["## Prefill vs decode", "",
             "Prefill is the time to first token (queueing + prompt processing); decode is the rest of the "
             "request (one forward pass per output token).", "",
             "| Concurrency | Prefill (TTFT) ms | Decode ms | Prefill share | Decode share | Dominant |",
             "|---:|---:|---:|---:|---:|---|"]
    for step in run.steps:
        p = step.get("phases")
        if p:
            lines.append(f"| {step['concurrency']} | {_fmt(p['prefill_ms'])} | {_fmt(p['decode_ms'])} | "
                         f"{100 * p['prefill_share']:.1f} % | {100 * p['decode_share']:.1f} % | {p['dominant']} |")
    dominant = {s["phases"]["dominant"] for s in run.steps if s.get("phases")}
    if dominant == {"decode"}:
        lines += ["", "Decode dominates end-to-end latency at every concurrency: cut bytes read per token "
                      "(weight quantization, FP8 KV cache) or raise batch efficiency to move it."]
    elif dominant == {"prefill"}:
        lines += ["", "Prefill (time to first token) dominates: look at queueing, prompt length and chunked prefill."]
    return "\n".join(lines)


def render_markdown(run: RunDir) -> str:
    info = run.summary.get("run", {})
    out = [f"# Sweep report: {run.name}", ""]
    for key in ("config_name", "model", "qformat", "endpoint", "target"):
        if key in info:
            out.append(f"- {key.replace('_', ' ')}: `{info[key]}`")
    if "sweep" in info:
        s = info["sweep"]
        out.append(f"- load: concurrency {s.get('concurrencies')}, {s.get('requests_per_step')} requests per step, "
                   f"input {s.get('input_tokens_mean')} ± {s.get('input_tokens_stddev')} tokens, "
                   f"output {s.get('output_tokens')} tokens (ignore EOS), {s.get('warmup_requests')} warm-up requests")
    if run.summary.get("aborted"):
        out += ["", f"> **Partial run:** {run.summary['aborted']}. The steps below hold what was measured."]
    out.append("")
    out.append("Definitions (genai-perf / AIPerf): TTFT = first response − send; ITL = (latency − TTFT) / "
               "(output tokens − 1); inter-chunk gap = every gap between consecutive responses; output tokens "
               "as the server reports them (Triton `output_token_count`), else counted with the model's tokenizer.")
    for step in run.steps:
        out += ["", f"## Concurrency {step['concurrency']}", "", step_table(step)]
    out += ["", phase_section(run), ""]
    return "\n".join(out)


def write_markdown_report(run: RunDir, out_path: Path | None = None) -> Path:
    path = out_path or run.path / "report.md"
    path.write_text(render_markdown(run))
    return path
