"""`toolkit doctor RUN`: the troubleshooting checklist, automated from a run's records and server metrics.

Each check is a pure function of the run's files; each finding carries its evidence numbers and
the lever to try. Thresholds are module constants so they are visible and testable.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from toolkit.bench.server_metrics import POSTPROCESSING, PREPROCESSING, REQUEST_PATH, metric_series
from toolkit.bench.rundir import RunDir, step_level

DECODE_DOMINANT_SHARE = 0.8
QUEUE_DOMINANT_SHARE = 0.5
KV_NEAR_FULL = 0.9
TTFT_GROWTH = 2.0
ITL_FLAT = 1.3
ITL_SPIKE_RATIO = 3.0
CONTEXT_CORRELATION = 0.5
MEMORY_FLAT = 0.02
# The detokenizer's queue per response, as a share of the ITL, from which the ITL finding names it.
DETOKENIZER_SHARE = 0.1


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # warn | info
    summary: str
    evidence: str
    lever: str

    def markdown(self) -> str:
        return f"- **{self.summary}** ({self.severity})\n  - evidence: {self.evidence}\n  - lever: {self.lever}"


def _m(step: dict, tag: str, stat: str = "p50") -> float | None:
    return step["metrics"].get(tag, {}).get(stat)


def check_decode_dominates(run: RunDir) -> list[Finding]:
    steps = [s for s in run.steps if s.get("phases")]
    if not steps:
        return []
    shares = [s["phases"]["decode_share"] for s in steps]
    unloaded = min(steps, key=step_level)  # the phase split without queueing effects
    if unloaded["phases"]["decode_share"] < DECODE_DOMINANT_SHARE:
        return []
    return [Finding("decode_dominates", "info", "Decode dominates end-to-end latency",
                    f"decode is {100 * min(shares):.0f}–{100 * max(shares):.0f} % of mean request latency "
                    f"(e.g. {unloaded['step']}: prefill {unloaded['phases']['prefill_ms']:.1f} ms, decode "
                    f"{unloaded['phases']['decode_ms']:.1f} ms)",
                    f"{_fewer_bytes(run)}; raise batch (concurrency) to share each weight read across more "
                    "tokens; consider speculative decoding")]


def _fewer_bytes(run: RunDir) -> str:
    """The byte cuts this run has not taken yet (fewer weight bits than it has, an 8-bit KV cache), or that
    it has taken them: the lever no longer proposes FP8 weights to a run that serves FP8."""
    meta = run.info
    qformat, kv = meta.get("qformat") or "none", meta.get("kv_cache_dtype") or "none"
    to_4_bits = "INT4-AWQ weights (4 bits, from 8)"
    weights = {"none": "FP8 or INT4-AWQ weights", "fp8": to_4_bits, "int8_sq": to_4_bits}
    cuts = [weights[qformat]] if qformat in weights else []
    if kv == "none":
        cuts.append("an FP8 KV cache")
    if cuts:
        return "cut the bytes each decode step reads: " + ", ".join(cuts)
    return f"the weights ({qformat}) and KV cache ({kv}) are already compact"


PYTHON_MODELS = (PREPROCESSING, POSTPROCESSING)  # of REQUEST_PATH: the tokenizer and detokenizer


def _queue_ms(step: dict, model: str) -> float:
    """Mean time one request to `model` waited in its Triton queue in this step, ms (0 where not measured)."""
    return ((step.get("server") or {}).get(model) or {}).get("queue_ms_per_request", 0.0)


def _triton_queue_ms(step: dict) -> float:
    """Mean time a request of this step waited in Triton's queues before its first token: the tokenizer's, the
    ensemble's, the engine model's, and the detokenizer's for its first response, ms."""
    return sum(_queue_ms(step, m) for m in REQUEST_PATH)


def _python_model_instances(run: RunDir) -> str:
    instances = _engine(run).get("python_model_instances") or "the target's default"
    return f"engine.python_model_instances, now {instances}"


def _python_models_lever(run: RunDir) -> str:
    return (f"the tokenizer / detokenizer models are where requests wait: more instances of them "
            f"({_python_model_instances(run)}), or more CPU for them beside the engine")


def _engine(run: RunDir) -> dict:
    """The engine settings the run was measured with (the sweep records them in summary.json)."""
    return run.info.get("engine") or {}


def _batching_levers(run: RunDir, high: dict) -> list[str]:
    """Levers that the run's own engine settings leave open for TTFT under load — none that is already
    pulled (max_batch_size already at the load, chunked prefill already on)."""
    engine, level = _engine(run), step_level(high)
    levers = []
    batch = engine.get("max_batch_size")
    if batch is not None and high.get("concurrency") and batch < level:
        levers.append(f"raise max_batch_size ({batch}) to the concurrency ({level:g}): requests beyond it wait "
                      "for a slot")
    if engine.get("enable_chunked_context") is False:
        levers.append("enable chunked prefill (enable_chunked_context) so new prompts share steps with decodes")
    elif engine.get("enable_chunked_context"):
        levers.append(f"chunked prefill is on: a smaller max_num_tokens ({engine.get('max_num_tokens', '?')}) "
                      "caps how long one step's prefill holds the others")
    return levers


def check_queueing(run: RunDir) -> list[Finding]:
    findings = []
    for step in run.steps:
        ttft = _m(step, "time_to_first_token", "avg")
        if not ttft:
            continue
        queue = _triton_queue_ms(step)
        if queue / ttft > QUEUE_DOMINANT_SHARE:
            parts = ", ".join(f"{m} {_queue_ms(step, m):.1f}" for m in REQUEST_PATH if _queue_ms(step, m) >= 0.05)
            in_python = sum(_queue_ms(step, m) for m in PYTHON_MODELS)
            lever = (_python_models_lever(run) if in_python > queue / 2 else
                     "more model instances or a larger max_batch_size / max_num_tokens; in rate mode, the arrival "
                     "rate exceeds what the server finishes: scale out")
            findings.append(Finding("queueing", "warn", f"Queueing dominates TTFT in {step['step']}",
                                    f"Triton queue {queue:.1f} ms of {ttft:.1f} ms mean TTFT ({100 * queue / ttft:.0f} %: "
                                    f"{parts} ms)", lever))
    steps = sorted((s for s in run.steps if _m(s, "time_to_first_token")), key=step_level)
    if len(steps) < 2 or findings:
        return findings
    low, high = steps[0], steps[-1]
    growth = _m(high, "time_to_first_token") / _m(low, "time_to_first_token")
    load_growth = step_level(high) / step_level(low) if step_level(low) else 0
    # "Far faster than load": more than the load itself grew (queueing makes TTFT grow superlinearly).
    if growth <= max(TTFT_GROWTH * 2, load_growth):
        return findings
    server = high.get("server") or {}
    evidence = (f"TTFT p50 {_m(low, 'time_to_first_token'):.1f} ms at {low['step']} → "
                f"{_m(high, 'time_to_first_token'):.1f} ms at {high['step']} (×{growth:.1f} for load ×{load_growth:g})")
    if any(m in server for m in REQUEST_PATH):
        evidence += f"; Triton queue {_triton_queue_ms(high):.1f} ms per request at {high['step']}"
    if server.get("prefill_ms_mean"):
        evidence += f"; engine arrival → first token {server['prefill_ms_mean']:.1f} ms"
    levers = _batching_levers(run, high) or ["the engine's batch slots and prefill settings are not the limit: "
                                             "add capacity (replicas, or TP for a faster prefill)"]
    batch = _engine(run).get("max_batch_size")
    if batch is not None and high.get("concurrency") and batch < step_level(high):
        summary = "Requests wait for a batch slot: TTFT grows faster than load"
    elif any(m in server for m in REQUEST_PATH):  # Triton's queues are measured and are not where time goes
        summary = "TTFT grows faster than load, though requests do not wait in Triton's queue"
    else:
        summary = "TTFT grows faster than load"
    findings.append(Finding("queueing", "warn", summary, evidence, "; ".join(levers)))
    return findings


def check_kv_cache(run: RunDir) -> list[Finding]:
    findings = []
    for step in run.steps:
        kv = (step.get("server") or {}).get("kv_cache")
        if kv and kv["utilization_max"] >= KV_NEAR_FULL:
            findings.append(Finding("kv_cache_full", "warn", f"KV cache near full in {step['step']}",
                                    f"{kv['blocks_used_max']:g} of {kv['blocks_max']:g} blocks used at peak "
                                    f"({100 * kv['utilization_max']:.0f} %), source {kv['source']}",
                                    "requests wait or are paused for blocks: FP8 KV cache, a larger "
                                    "kv_cache_free_gpu_mem_fraction, a smaller max_seq_len, or more GPUs (TP)"))
    return findings


def check_ttft_grows_itl_flat(run: RunDir) -> list[Finding]:
    steps = sorted((s for s in run.steps if _m(s, "time_to_first_token") and _m(s, "inter_token_latency")), key=step_level)
    findings = []
    if len(steps) >= 2:
        low, high = steps[0], steps[-1]
        ttft_growth = _m(high, "time_to_first_token") / _m(low, "time_to_first_token")
        itl_growth = _m(high, "inter_token_latency") / _m(low, "inter_token_latency")
        if ttft_growth > TTFT_GROWTH and itl_growth < ITL_FLAT:
            levers = _batching_levers(run, high) or [
                "enable chunked prefill (enable_chunked_context) and tune max_num_tokens so prefill chunks share steps"]
            findings.append(Finding("ttft_grows_itl_flat", "warn", "TTFT grows with load while ITL stays flat",
                                    f"TTFT p50 ×{ttft_growth:.1f}, ITL p50 ×{itl_growth:.2f} from {low['step']} "
                                    f"to {high['step']}",
                                    "new prompts wait behind running decodes for prefill: " + "; ".join(levers)))
    for step in run.steps:
        p50, p99 = _m(step, "inter_chunk_gap", "p50"), _m(step, "inter_chunk_gap", "p99")
        if p50 and p99 and p99 / p50 > ITL_SPIKE_RATIO:
            evidence = f"inter-chunk gap p99 {p99:.1f} ms vs p50 {p50:.1f} ms (×{p99 / p50:.1f})"
            causes, lever = _stall_causes(run, step, ITL_SPIKE_RATIO * p50 / 1e3)
            findings.append(Finding("itl_spikes", "warn", f"Decode stalls in {step['step']}", evidence + causes,
                                    lever))
    return findings


PREFILL_STALL_LEVER = "chunked prefill, a smaller max_num_tokens per step, or separate prefill capacity"


def _stall_causes(run: RunDir, step: dict, threshold_s: float) -> tuple[str, str]:
    """(evidence to add, lever) for a step's gaps longer than threshold_s: what the engine's step timeline says
    each was (doctor_workloads.stall_causes), the lever for the commonest; without a timeline, the causes the
    step's load leaves possible. A p99 / p50 ratio alone does not say a prefill blocked the decodes: at
    concurrency 1 no other request is there to prefill, and the embedded engine's timeline showed such stalls
    stepped through at its pace, the tokens arriving late together (2026-11-27)."""
    from toolkit.report.doctor_workloads import stall_causes  # it builds on this module: imported late

    records = run.measured_records_by_step().get(step["step"], [])
    gaps = [(a, b) for r in records for a, b in zip(r.chunk_times, r.chunk_times[1:]) if b - a > threshold_s]
    counts = stall_causes(run, gaps) if gaps else None
    # where the response path can hold tokens the engine has made
    held_by = (f"the detokenizer (postprocessing) model (more instances, {_python_model_instances(run)}, or more CPU "
               "beside the engine), Triton's streaming, the network, or the client's own loop (a client on another "
               "host tells the last two apart)")
    response_path = "the response path held tokens the engine had made: " + held_by
    if counts:
        shares = ", ".join(f"{100 * n / len(gaps):.0f} % {cause}" for cause, n in counts.items() if n)
        evidence = (f"; the engine's step timeline puts the {len(gaps)} gaps over {threshold_s * 1e3:.1f} ms as "
                    f"{shares}" + (" (delivery: the engine stepped through them at its pace)" if counts["delivery"]
                                   else ""))
        commonest = max(counts, key=counts.get)
        engine = _engine(run)
        on_host_cores = engine.get("device", "cpu") == "cpu"  # the embedded engine shares the serving host's cores
        interval = engine.get("stream_interval") or 1
        if commonest == "delivery" and on_host_cores:
            # The 2-core demo: one engine thread instead of two removed these stalls (gap p99 at concurrency 4
            # 16-19 ms against 42-230) but cost TTFT +62-72 % and 30 % of tokens/s; two detokenizer instances left
            # them as they were (perf/README, 2026-11-27). Most of those were the client waiting for a core across
            # scheduler autogroups, gone since the server stays in the caller's session (perf/README "Served").
            # engine.stream_interval 4 took the demo's 8-stream ITL from 11.5 to 8.0 ms (perf/README, 2026-11-28).
            threads = engine.get("cpu_threads") or "every core"
            response_path = ("the serving processes (Triton's frontend, the detokenizer, a client on this host) "
                             "wait for CPU beside an engine that fills the cores: engine.stream_interval above 1 "
                             f"(now {interval}) sends each stream's tokens every that many "
                             "steps, fewer responses through Triton and the detokenizer, at no cost in engine speed; "
                             f"engine.cpu_threads below the core count (now {threads}) leaves them a core, at the cost "
                             "of engine speed, or run the client on another host; else " + held_by)
        split = run.info.get("host_scheduling")
        if commonest == "delivery" and split:
            from toolkit.serve.server import AUTOGROUP_FIX, client_in_another_session

            response_path = (f"the sweep client ran {client_in_another_session(split)}, and the kernel shares the "
                             "cores between sessions: a client woken on a core the server fills waited up to 130 ms here "
                             f"(perf/README \"Served\"); {AUTOGROUP_FIX}. Beyond that, " + response_path)
        lever = {"prefill": "a prefill is blocking running decodes: " + PREFILL_STALL_LEVER,
                 "engine step": "single engine steps without prefill ran long: the host held the engine back "
                                "(other work on its cores, swapping, a pause in its process): check host CPU use"
                                + ("; the serving processes share the engine's cores, and a step waits for whichever "
                                   "of its threads lost its core to them (the demo's steps served ran 1.4-1.7x the "
                                   f"engine alone): engine.stream_interval above 1 (now {interval}) sends fewer "
                                   "responses"
                                   if on_host_cores else ""),
                 "delivery": response_path,
                 "engine idle": "the engine had nothing of these requests to step: they waited for a batch slot or "
                                "KV blocks (see the queueing and KV-cache findings)"}[commonest]
        return evidence, lever
    if step.get("mode") == "concurrency" and step.get("concurrency") == 1:
        return "; no other request was in flight", ("not another request's prefill: the host held the engine back, "
                                                    "or " + response_path)
    return "", ("a prefill blocking running decodes (" + PREFILL_STALL_LEVER + "), or the response path "
                "delivering tokens in bursts; the embedded engine's step timeline tells them apart")


ITL_GROWTH = 1.5


def check_itl_grows_with_load(run: RunDir) -> list[Finding]:
    """Decode that is truly bandwidth-bound costs about the same per step at batch 1 and batch N."""
    steps = sorted((s for s in run.steps if _m(s, "inter_token_latency")), key=step_level)
    if len(steps) < 2:
        return []
    low, high = steps[0], steps[-1]
    growth = _m(high, "inter_token_latency") / _m(low, "inter_token_latency")
    if growth < ITL_GROWTH:
        return []
    evidence = (f"ITL p50 {_m(low, 'inter_token_latency'):.1f} ms at {low['step']} → "
                f"{_m(high, 'inter_token_latency'):.1f} ms at {high['step']} (×{growth:.1f})")
    lever = ("a bandwidth-bound decode step costs about the same for 1 or N sequences; growth means the step is "
             "compute-bound or contended (CPU threads, host-side per-token work, prefill mixed into decode steps): "
             "compare with `toolkit plan` decode-by-batch, enable chunked prefill, and check host CPU use")
    # Every streamed token passes the detokenizer: its queue adds to each gap between tokens.
    detokenizer = _queue_ms(high, POSTPROCESSING)
    if detokenizer >= DETOKENIZER_SHARE * _m(high, "inter_token_latency"):
        evidence += (f"; each response waited {detokenizer:.2f} ms for the detokenizer (postprocessing) at "
                     f"{high['step']}, {100 * detokenizer / _m(high, 'inter_token_latency'):.0f} % of its ITL")
        lever += "; " + _python_models_lever(run)
    return [Finding("itl_grows_with_load", "warn", "ITL grows with load: batching is not free here", evidence, lever)]


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 5 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def check_itl_grows_with_context(run: RunDir) -> list[Finding]:
    findings = []
    # Across shape steps at the same load (ISL sweeps), else within a step with ISL variation.
    shape_steps = [s for s in run.steps if _m(s, "inter_token_latency")]
    isl_values = {s.get("input_tokens") for s in shape_steps}
    if len(isl_values) >= 2:
        xs = [s["input_tokens"] for s in shape_steps]
        ys = [_m(s, "inter_token_latency") for s in shape_steps]
        corr = _correlation(xs, ys) if len(xs) >= 5 else (1.0 if ys[xs.index(max(xs))] > 1.2 * ys[xs.index(min(xs))] else None)
        if corr and corr > CONTEXT_CORRELATION:
            findings.append(Finding("itl_grows_with_context", "warn", "ITL grows with context length",
                                    f"ITL p50 {min(ys):.1f} → {max(ys):.1f} ms over ISL {min(xs)} → {max(xs)}",
                                    "each decode step re-reads the whole KV cache: FP8 KV cache, fewer KV heads "
                                    "(GQA models), paged context FMHA, or shorter contexts"))
            return findings
    for step, records in run.measured_records_by_step().items():
        # Within each request class: a mixed workload's long prompts decode beside other traffic, so ITL
        # across classes says nothing about context.
        classes: dict[str | None, list] = {}
        for r in records:
            if r.inter_token_latency:
                classes.setdefault(r.request_class, []).append(r)
        for name, rs in classes.items():
            corr = _correlation([r.input_tokens for r in rs], [r.inter_token_latency for r in rs])
            if corr and corr > CONTEXT_CORRELATION:
                where = step if name is None else f"{step} ({name} requests)"
                findings.append(Finding("itl_grows_with_context", "warn", f"ITL grows with context length in {where}",
                                        f"correlation of ITL with input tokens {corr:.2f} over {len(rs)} requests",
                                        "each decode step re-reads the whole KV cache: FP8 KV cache, fewer KV heads "
                                        "(GQA models), or shorter contexts"))
    return findings


def check_memory_flat(run: RunDir) -> list[Finding]:
    samples = run.server_metrics()
    for name, label in (("nv_gpu_memory_used_bytes", "GPU"), ("nv_cpu_memory_used_bytes", "host")):
        series = metric_series(samples, name)
        if len(series) >= 3 and max(series) > 0:
            spread = (max(series) - min(series)) / max(series)
            if spread < MEMORY_FLAT:
                return [Finding("memory_flat", "info", f"{label} memory is flat from the first sample",
                                f"{min(series) / 1e9:.2f}–{max(series) / 1e9:.2f} GB over {len(series)} samples "
                                f"(spread {100 * spread:.1f} %)",
                                "the KV cache is reserved at start-up (kv_cache_free_gpu_mem_fraction / the CPU "
                                "engine's kv_cache_blocks), not grown per request: memory use says nothing about "
                                "load; watch KV blocks used instead")]
            return []
    return []


CHECKS = [check_decode_dominates, check_queueing, check_kv_cache, check_ttft_grows_itl_flat,
          check_itl_grows_with_load, check_itl_grows_with_context, check_memory_flat]


def all_checks() -> list:
    from toolkit.report.doctor_workloads import WORKLOAD_CHECKS  # they build on Finding: imported late

    return CHECKS + WORKLOAD_CHECKS


def diagnose(run: RunDir) -> list[Finding]:
    return [finding for check in all_checks() for finding in check(run)]


def write_doctor(run: RunDir, findings: list[Finding], path: Path | None = None) -> Path:
    path = path or run.path / "doctor.md"
    lines = [f"# Doctor: {run.name}", ""]
    if run.summary.get("aborted"):
        lines += [f"> Partial run: {run.summary['aborted']}", ""]
    lines += [f.markdown() for f in findings] or ["No findings: nothing in this run matches the checklist."]
    lines += ["", "Checks: " + ", ".join(c.__name__.removeprefix("check_") for c in all_checks())]
    path.write_text("\n".join(lines) + "\n")
    return path
