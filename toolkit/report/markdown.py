"""The report of one or several sweep runs as sections of Markdown; report.md and report.html are both
made from `sections()`, so the HTML holds everything the Markdown does (plus the plots).

Order: summary table (every run and step, with units and which way is better), findings of the
doctor, A/B verdicts (when the report sits beside an ab.json), then each run: what ran, prefill vs
decode, and a full table per step (avg/min/max/std, p1…p99).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from toolkit.bench.metrics import METRICS, RECORD_METRICS
from toolkit.bench.server_metrics import POSTPROCESSING, REQUEST_PATH
from toolkit.bench.rundir import RunDir
from toolkit.engine.format_effect import format_effect_sentence, read_format_effect
from toolkit.report.workload_tables import workload_lines

COLUMNS = ["avg", "min", "max", "std", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99"]
DEFINITIONS = ("Definitions (genai-perf / AIPerf): TTFT = first response − send; ITL = (latency − TTFT) / "
               "(output tokens − 1); inter-chunk gap = every gap between consecutive responses; output tokens as "
               "the server reports them (Triton `output_token_count`, OpenAI `usage`), else counted with the "
               "model's tokenizer. Throughputs divide by the step's window, first send → last completion. "
               "↓ lower is better, ↑ higher is better.")
# What a quantization format's weights are once the engine computes with them (the kernels' format).
_COMPUTED_AS = {"fp8": "fp8", "int8_sq": "int8", "int4_awq": "int4", "w4a8_awq": "int4", "nvfp4": "fp4",
                "int8_wo": "int8", "int8_weight_only": "int8"}


@dataclass
class Section:
    title: str
    level: int  # 2 = ##, 3 = ###
    body: str  # Markdown
    plots: list[tuple[str, Callable[[], bytes | None]]] = field(default_factory=list)  # HTML only


def fmt(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def arrow(tag: str) -> str:
    better = METRICS[tag].lower_is_better
    return "" if better is None else (" ↓" if better else " ↑")


# ---------------------------------------------------------------- what ran, named honestly


def reported_weight_format(run: RunDir) -> str:
    """What the engine said its kernels run (the CPU runtime's ModelRunner.weight_format, e.g. 'fp8',
    'fp8-widened', 'int4-g128'), where the run recorded it; '' otherwise."""
    info = run.info
    environment = run.path / "environment.json"
    env = json.loads(environment.read_text()) if environment.is_file() else {}
    return str(info.get("weight_format") or (info.get("engine") or {}).get("weight_format")
               or (env.get("weight_format") if isinstance(env, dict) else None) or "")


def compute_dtype(run: RunDir) -> str:
    """The precision the engine computes in when it did not report its kernels."""
    info = run.info
    planned = (info.get("plan_deployment") or {}).get("weights") or ""
    if info.get("target") != "cpu":
        return planned  # TensorRT-LLM runs the format's own kernels
    if planned in ("fp32", "bf16", "fp16"):
        return planned  # the planner already said what the CPU engine computes in (older runs: fp32)
    dtype = (info.get("engine") or {}).get("dtype") or "auto"
    return "bf16" if dtype == "auto" else dtype  # the CPU runtime's activations (auto = bf16)


def precision(run: RunDir) -> str:
    """'fp8' only where the engine computes in fp8; else e.g. 'fp8 checkpoint, computed in bf16'."""
    qformat = run.info.get("qformat") or "none"
    reported = reported_weight_format(run)
    if reported:
        if qformat == "none":
            return reported
        native = all("widened" not in f and f.split("-")[0] == _COMPUTED_AS.get(qformat, qformat)
                     for f in reported.split("+"))
        if native:
            return qformat
        if all("-a8" in f for f in reported.split("+")):  # re-quantized for an integer kernel: int8 x int8, not bf16
            return f"{qformat} checkpoint on {reported} kernels"
        dtype = (run.info.get("served_engine") or {}).get("compute_dtype")
        return f"{qformat} checkpoint, computed in {dtype} ({reported} kernels)" if dtype else \
            f"{qformat} checkpoint, engine kernels {reported}"
    computed = compute_dtype(run)
    if qformat == "none":
        return computed or "unquantized"
    if computed == _COMPUTED_AS.get(qformat, qformat):
        return qformat
    return f"{qformat} checkpoint, computed in {computed}" if computed else f"{qformat} checkpoint"


def run_date(run: RunDir) -> str:
    match = re.match(r"(\d{8})-(\d{6})", run.name)
    if not match:
        return ""
    return datetime.strptime("".join(match.groups()), "%Y%m%d%H%M%S").strftime("%Y-%m-%d %H:%M:%S")


_DIFFERING = (("config_name", "{}"), ("qformat", "{}"), ("kv_cache_dtype", "KV {}"), ("endpoint", "{}"),
              ("target", "{}"))


def run_labels(runs: list[RunDir]) -> list[str]:
    """Distinct legend labels: the variant (or config), what differs between the runs, repetition, time."""
    infos = [r.info for r in runs]
    labels = []
    for run, info in zip(runs, infos):
        parts = [info.get("label") or info.get("config_name") or run.name]
        for key, pattern in _DIFFERING:
            if len({str(i.get(key)) for i in infos}) > 1 and info.get(key) not in (None, "") \
                    and str(info.get(key)) != parts[0]:
                parts.append(pattern.format(info[key]))
        modes = {s.get("mode") for s in run.steps}
        if len({m for r in runs for s in r.steps for m in [s.get("mode")]}) > 1:
            parts.append("/".join(sorted(str(m) for m in modes)))
        if info.get("repetition") is not None:
            parts.append(f"rep {info['repetition'] + 1}")
        if len(runs) > 1:
            parts.append(run_date(run)[5:] or run.name)  # month-day time: runs of one day differ by time
        labels.append(" · ".join(parts))
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # still equal (same second): number them
        seen[label] = seen.get(label, 0) + 1
        if labels.count(label) > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def step_title(step: dict) -> str:
    if step.get("mode") == "rate":
        load = f"Request rate {step['rate']:g}/s"
    else:
        load = f"Concurrency {step.get('concurrency')}"
    shape = f" (ISL {step['input_tokens']}, OSL {step['output_tokens']})" if "input_tokens" in step else ""
    return load + shape


def step_load(step: dict) -> str:
    return f"rate {step['rate']:g}/s" if step.get("mode") == "rate" else f"c{step.get('concurrency')}"


# ---------------------------------------------------------------- sections


_SUMMARY_COLUMNS = [("time_to_first_token", "p50", "TTFT"), ("time_to_first_token", "p99", "TTFT"),
                    ("inter_token_latency", "p50", "ITL"), ("inter_token_latency", "p99", "ITL"),
                    ("request_latency", "p50", "Latency"), ("output_token_throughput_per_user", "p50", "tok/s/user")]


def summary_table(runs: list[RunDir], labels: list[str]) -> str:
    head = ["Run", "Load", "ISL / OSL", "OK / failed"] + \
        [f"{name} {stat} {METRICS[tag].unit}{arrow(tag)}" if tag != "output_token_throughput_per_user"
         else f"{name} {stat}{arrow(tag)}" for tag, stat, name in _SUMMARY_COLUMNS] + \
        [f"Output tok/s{arrow('output_token_throughput')}"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---:|" + "---:|" * (len(head) - 4)]
    for run, label in zip(runs, labels):
        for step in run.steps:
            m = step["metrics"]
            cells = [fmt(m[tag][stat]) if tag in m else "-" for tag, stat, _ in _SUMMARY_COLUMNS]
            small = " (few)" if step.get("small_sample") else ""
            lines.append(f"| {label} | {step_load(step)} | {step.get('input_tokens', '-')} / "
                         f"{step.get('output_tokens', '-')} | {step['request_count']}{small} / {step['error_count']} | "
                         + " | ".join(cells) + f" | {fmt(step['output_token_throughput']['avg'])} |")
    return "\n".join(lines)


def step_table(step: dict) -> str:
    lines = ["| Metric | Unit | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for metric in RECORD_METRICS:
        stats = step["metrics"].get(metric.tag)
        if stats:
            lines.append(f"| {metric.header}{arrow(metric.tag)} | {stats['unit']} | "
                         + " | ".join(fmt(stats[c]) if c in stats else "-" for c in COLUMNS) + " |")
    lines.append("")
    lines.append(f"- Output token throughput: **{fmt(step['output_token_throughput']['avg'])} tokens/s**; "
                 f"request throughput: **{step['request_throughput']['avg']:.3f} requests/s**; "
                 f"{step['request_count']} requests in {step['duration_s']:.2f} s")
    if step.get("small_sample"):
        lines.append(f"- Only {step['request_count']} requests: the tail percentiles (p90, p99) are the largest one "
                     "or two values, not a distribution; measure more requests for tails")
    if step.get("goodput"):
        g = step["goodput"]
        slo = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in g["slo"].items() if v is not None)
        lines.append(f"- Goodput: **{g['avg']:.3f} requests/s** ({g['good_requests']} of {step['request_count']} "
                     f"met {slo})")
    if step["error_count"]:
        kinds = ", ".join(f"{k}: {v}" for k, v in step["errors_by_kind"].items())
        lines.append(f"- **Errors: {step['error_count']}** ({kinds})")
    lines += workload_lines(step)
    server = step.get("server") or {}
    parts = []
    for model in REQUEST_PATH:
        if model in server:
            per = "response" if model == POSTPROCESSING else "request"  # the detokenizer runs per streamed response
            parts.append(f"{model} queue {fmt(server[model]['queue_ms_per_request'])} ms per {per}")
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


def phase_table(run: RunDir) -> str:
    lines = ["Prefill is the time to first token (queueing + prompt processing); decode is the rest of the "
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
    info = run.info
    out = [f"- model: `{info.get('model', '?')}` ({precision(run)})"]
    for key in ("config_name", "kv_cache_dtype", "endpoint", "target", "label"):
        if info.get(key) not in (None, ""):
            # the config's "none" reads as no KV cache; it means one left unquantized
            note = " (unquantized: the activations' dtype)" if key == "kv_cache_dtype" and info[key] == "none" else ""
            out.append(f"- {key.replace('_', ' ')}: `{info[key]}`{note}")
    served = info.get("served_engine") or {}
    if served.get("step_kernels"):  # the CPU engine's own account of what ran (its build's ISA first)
        where = served.get("cpu_binding") or f"{served.get('threads', '?')} threads"  # older runs: threads only
        out.append(f"- engine: {served['step_kernels']}, {where}")
    if run_date(run):
        out.append(f"- started: {run_date(run)}; folder `{run.path}`")
    effect = read_format_effect(run.path)
    if effect is not None:
        out.append(f"- weight format's effect. {format_effect_sentence(effect)}")
    s = info.get("sweep")
    if s:
        if s.get("mode") == "rate":
            cap = f", at most {s['max_concurrency']} in flight" if s.get("max_concurrency") else ""
            load = f"rate {s.get('request_rates')} req/s ({s.get('arrival')} arrivals{cap})"
        else:
            load = f"concurrency {s.get('concurrencies')}"
        bound = " and/or ".join(x for x in (f"{s['requests_per_step']} requests" if s.get("requests_per_step") else "",
                                            f"{s['duration_s']:g} s" if s.get("duration_s") else "") if x)
        out.append(f"- load: {load}, {bound} per step, input {s.get('input_tokens_mean')} ± "
                   f"{s.get('input_tokens_stddev')} tokens, output {s.get('output_tokens')} ± "
                   f"{s.get('output_tokens_stddev', 0)} tokens (ignore EOS), {s.get('warmup_requests')} warm-up "
                   f"requests before the sweep and {s.get('step_warmup_requests') or 0} opening each step "
                   f"excluded, seed {s.get('seed')}")
    split = info.get("host_scheduling")
    if split:
        from toolkit.serve.server import client_in_another_session

        out.append(f"- client: {client_in_another_session(split, quote='`')}; where the server fills the cores, the "
                   "client waits for them and token gaps grow (perf/README \"Served\")")
    if run.summary.get("aborted"):
        out += ["", f"> **Partial run:** {run.summary['aborted']}. The steps below hold what was measured."]
    return out


def findings(run: RunDir) -> str:
    from toolkit.report.doctor import diagnose

    found = diagnose(run)
    if not found:
        return "No findings: nothing in this run matches the doctor's checklist."
    return "\n".join(f"- **{f.summary}** ({f.severity}): {f.evidence}. Lever: {f.lever}" for f in found)


def load_ab(folder: Path) -> dict | None:
    """The A/B results when the report is written beside `toolkit ab`'s ab.json."""
    path = Path(folder) / "ab.json"
    return json.loads(path.read_text()) if path.is_file() else None


def ab_table(ab: dict) -> str:
    lines = ["Change = (candidate − baseline) / baseline of the median; 95 % interval from a two-level bootstrap "
             "(repetitions, then requests). A verdict other than noise needs every repetition to agree and "
             "repetitions that reproduce.", "",
             "| Candidate vs baseline | Step | Metric | Baseline | Candidate | Change | 95 % interval | Verdict | Why |",
             "|---|---|---|---:|---:|---:|---|---|---|"]
    for r in ab.get("results", []):
        metric = METRICS.get(r["metric"])
        unit = f" {metric.unit}" if metric else ""
        name = f"{metric.header}{arrow(metric.tag)}" if metric else r["metric"]
        lines.append(f"| {r['candidate']} vs {r['baseline']} | {r['step']} | {name} | {fmt(r['baseline_value'])}{unit} | "
                     f"{fmt(r['candidate_value'])}{unit} | {100 * r['relative_change']:+.1f} % | "
                     f"[{100 * r['ci_low']:+.1f} %, {100 * r['ci_high']:+.1f} %] | **{r['verdict']}** | {r['reason']} |")
    return "\n".join(lines)


def sections(runs: list[RunDir], ab: dict | None = None) -> list[Section]:
    from toolkit.report import plots

    labels = run_labels(runs)
    out = [Section("Summary", 2, DEFINITIONS + "\n\n" + summary_table(runs, labels),
                   plots=plots.comparison_plots(runs, labels))]
    if ab:
        out.append(Section("A/B verdicts", 2, ab_table(ab)))
    for run, label in zip(runs, labels):
        out.append(Section(f"Findings — {label}" if len(runs) > 1 else "Findings", 2, findings(run)))
    for run, label in zip(runs, labels):
        out.append(Section(f"Run {label}", 2, "\n".join(run_header(run)), plots=plots.run_plots(run, label)))
        out.append(Section("Prefill vs decode", 3, phase_table(run)))
        out += [Section(step_title(step), 3, step_table(step)) for step in run.steps]
    return out


def report_title(runs: list[RunDir]) -> str:
    if len(runs) > 1:
        return f"{len(runs)} runs compared"
    run = runs[0]
    info = run.info
    return f"{info.get('config_name', run.name)}: {info.get('model', '?')} ({precision(run)}), {run_date(run) or run.name}"


def render_markdown(runs: list[RunDir], ab: dict | None = None) -> str:
    out = [f"# Sweep report: {report_title(runs)}", ""]
    for section in sections(runs, ab):
        out += ["#" * section.level + " " + section.title, "", section.body, ""]
    return "\n".join(out)


def write_markdown_report(runs: RunDir | list[RunDir], out_path: Path | None = None) -> Path:
    runs = runs if isinstance(runs, list) else [runs]
    path = out_path or runs[0].path / "report.md"
    path.write_text(render_markdown(runs, load_ab(path.parent)))
    return path
