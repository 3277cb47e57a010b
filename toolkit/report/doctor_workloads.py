"""Doctor checks for the failures workloads provoke (registered in doctor.py): ITL spikes that
coincide with other requests' prefill, TTFT growing with prompt length beyond the prefill floor, KV
cache exhaustion, and low prefix reuse on a workload that shares prefixes. (ITL growing with
context is doctor.py's check_itl_grows_with_context; multi-turn runs feed it.)

Each check is a pure function of the run folder: records, server metrics, and the engine's step
timeline (engine_timeline.jsonl, written by the embedded engine) where there is one.
"""

from __future__ import annotations

import bisect
import math
import statistics

from toolkit.bench.rundir import RunDir, step_level
from toolkit.bench.server_metrics import sum_metric
from toolkit.report.doctor import ITL_SPIKE_RATIO, Finding

SPIKE_MIN_MS = 1.0  # a gap must also be this long to count as a stall (sub-ms jitter is not one)
MIN_SPIKES = 5
PREFILL_COINCIDENCE = 0.3  # share of stalls that prefill explains...
PREFILL_EXCESS = 3.0  # ...and this many times the share of ordinary gaps it does
PREFILL_COVER = 0.5  # a stall is prefill's when steps carrying prefill fill this much of it
FLOOR_RATIO = 3.0  # TTFT's growth per prompt token vs the prefill floor's
LOW_REUSE = 0.2  # prompt-block hit rate below which a prefix-sharing workload is not being reused
SHARING_WORKLOADS = ("shared_prefix", "multi_turn", "trace")

# Counters whose increase over a run the checks and scenario reports read (name → label filter).
COUNTERS = {
    "toolkit_kv_cache_reuse_hits_total": {}, "toolkit_kv_cache_reuse_misses_total": {},
    "toolkit_preemptions_total": {}, "toolkit_kv_cache_admission_waits_total": {},
    "toolkit_spec_draft_tokens_total": {}, "toolkit_spec_accepted_tokens_total": {},
}


def counter_deltas(samples: list[dict]) -> dict[str, float]:
    """Increase of each counter from the first to the last sample that exposes it."""
    out = {}
    for name, labels in COUNTERS.items():
        having = [s["metrics"] for s in samples if any(k.split("{")[0] == name for k in s["metrics"])]
        if len(having) >= 2:
            out[name] = sum_metric(having[-1], name, **labels) - sum_metric(having[0], name, **labels)
    return out


def _engine(run: RunDir) -> dict:
    return run.info.get("engine") or {}


def _workload(run: RunDir) -> dict:
    return (run.info.get("sweep") or {}).get("workload") or {}


# --- ITL spikes that coincide with prefill -------------------------------------------------------

def _prefill_windows(run: RunDir, records) -> tuple[list[tuple[float, float, int]], str]:
    """When prefill happened: the engine's steps that carried prefill tokens (its timeline), else each
    request's first token, which marks the end of its prefill (any server)."""
    steps = run.engine_steps()
    if steps:
        return [(s["mono"], s["mono"] + s["duration"], s["prefill_tokens"]) for s in steps
                if s.get("prefill_tokens")], "engine steps carrying prefill tokens"
    return [(r.chunk_times[0], r.chunk_times[0], r.input_tokens) for r in records if r.chunk_times], \
        "other requests' first tokens"


def _explained(gap: tuple[float, float, int], windows, timeline: bool, first_token: dict[int, float]) -> bool:
    """Whether a gap is prefill's doing: engine steps carrying prefill fill at least half of it (timeline),
    or another request's first token, which ends its prefill, arrives within it (records alone)."""
    a, b, me = gap
    if timeline:
        return sum(_overlap(a, b, start, end) for start, end, _ in windows) >= PREFILL_COVER * (b - a)
    return any(a <= start <= b and first_token.get(me) != start for start, _, _ in windows)


def _overlap(a: float, b: float, start: float, end: float) -> float:
    """Seconds of [start, end] inside the gap [a, b] (0 where they do not meet)."""
    return max(0.0, min(b, end) - max(a, start))


def check_itl_spikes_with_prefill(run: RunDir) -> list[Finding]:
    findings = []
    for step, records in run.measured_records_by_step().items():
        gaps = [(a, b, r.request_index) for r in records for a, b in zip(r.chunk_times, r.chunk_times[1:])]
        # Against the typical ITL (per gap, so long streams weigh by their length), not the median gap:
        # streamed tokens often arrive in bursts.
        itls = [r.inter_token_latency for r in records if r.inter_token_latency for _ in r.chunk_gaps]
        if len(gaps) < 4 * MIN_SPIKES or not itls:
            continue
        typical = statistics.median(itls)
        threshold = max(ITL_SPIKE_RATIO * typical, SPIKE_MIN_MS / 1e3)
        spikes = [g for g in gaps if g[1] - g[0] > threshold]
        ordinary = [g for g in gaps if g[1] - g[0] <= threshold]
        if len(spikes) < MIN_SPIKES or not ordinary:
            continue
        windows, source = _prefill_windows(run, records)
        timeline = source.startswith("engine")
        first_token = {r.request_index: r.chunk_times[0] for r in records if r.chunk_times}
        share = sum(_explained(g, windows, timeline, first_token) for g in spikes) / len(spikes)
        base = sum(_explained(g, windows, timeline, first_token) for g in ordinary) / len(ordinary)
        if share < PREFILL_COINCIDENCE or share < PREFILL_EXCESS * base:
            continue
        largest = max((w[2] for w in windows), default=0)
        engine = _engine(run)
        if engine.get("enable_chunked_context") is False:
            lever = ("enable chunked prefill (engine.enable_chunked_context: true) with a smaller max_num_tokens, "
                     "so a long prompt is read in chunks that share steps with the running decodes")
        else:
            lever = (f"lower max_num_tokens (now {engine.get('max_num_tokens', '?')}) so each prefill chunk is smaller "
                     "and decodes wait less per step; or send long prompts to separate prefill capacity "
                     "(disaggregated serving)")
        findings.append(Finding(
            "itl_spikes_with_prefill", "warn", f"Streams stall while other requests prefill in {step}",
            f"{len(spikes)} of {len(gaps)} gaps between streamed tokens exceed {threshold * 1e3:.1f} ms "
            f"({ITL_SPIKE_RATIO:g}× the median ITL {typical * 1e3:.1f} ms); {100 * share:.0f} % of them are "
            f"{'mostly filled by ' if timeline else 'crossed by '}{source} (up to {largest} prompt tokens) against "
            f"{100 * base:.0f} % of ordinary gaps", lever))
    return findings


# --- what each long gap between streamed tokens was, by the engine's step timeline ---------------

STEPPED_THROUGH = 2  # whole engine steps with decode tokens inside a gap: the engine kept its pace through it
STALL_CAUSES = ("prefill", "engine step", "delivery", "engine idle")


def stall_causes(run: RunDir, gaps: list[tuple[float, float]]) -> dict[str, int] | None:
    """How many of `gaps` (start, end on the records' clock) each cause in STALL_CAUSES explains, by the engine's
    step timeline; None without one (a server other than the embedded engine):
    - prefill: steps carrying prefill tokens fill at least half of the gap (as check_itl_spikes_with_prefill);
    - engine step: one step without prefill fills half of it: the step itself ran long (host contention, a pause);
    - delivery: the engine took STEPPED_THROUGH or more whole steps with decode tokens inside it and preempted
      nothing: a request in the batch gets a token every step, so its tokens were made on time and reached the
      client late, together (the response path: detokenizer, Triton's streaming, the network, the client);
    - engine idle: the rest (no step of it running: the request waited for a slot or for blocks)."""
    steps = run.engine_steps()
    if not steps:
        return None
    starts = [s["mono"] for s in steps]
    longest = max(s["duration"] for s in steps)
    counts = dict.fromkeys(STALL_CAUSES, 0)
    for a, b in gaps:
        first = bisect.bisect_left(starts, a - longest)
        inside = [s for s in steps[first:bisect.bisect_left(starts, b)] if s["mono"] + s["duration"] > a]
        covered = [(_overlap(a, b, s["mono"], s["mono"] + s["duration"]), s) for s in inside]
        if sum(seconds for seconds, s in covered if s.get("prefill_tokens")) >= PREFILL_COVER * (b - a):
            counts["prefill"] += 1
        elif max((seconds for seconds, _ in covered), default=0.0) >= PREFILL_COVER * (b - a):
            counts["engine step"] += 1
        elif sum(s["mono"] >= a and s["mono"] + s["duration"] <= b and s.get("decode_tokens", 0) > 0
                 for s in inside) >= STEPPED_THROUGH and not any(s.get("preempted") for s in inside):
            counts["delivery"] += 1
        else:
            counts["engine idle"] += 1
    return counts


# --- TTFT growing with prompt length beyond the prefill floor ------------------------------------

def prefill_floor_ms(run: RunDir, tokens: int) -> float | None:
    """The planner's prefill floor (toolkit/plan/roofline.py) for `tokens` prompt tokens, on the model,
    hardware and deployment of the plan the sweep wrote beside the run (plan.json; never re-planned or
    re-probed here); None without one."""
    plan = run.plan()
    if plan is None:
        return None
    from toolkit.model.spec import ModelSpec
    from toolkit.plan.hardware import HardwareSpec
    from toolkit.plan.memory import Deployment
    from toolkit.plan.roofline import prefill_seconds

    try:
        spec = ModelSpec(**{k: v for k, v in plan["model"].items() if k != "total_params"})
        return prefill_seconds(spec, HardwareSpec(**plan["gpu"]), Deployment(**plan["deployment"]), int(tokens)) * 1e3
    except (TypeError, KeyError, ValueError):
        return None  # a plan written by another version of the planner: no floor rather than a wrong one


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def ttft_by_length(run: RunDir) -> list[tuple[int, float]]:
    """(prompt tokens, median TTFT ms) at the run's lowest load: one point per step when several steps
    sweep the length, else one per distinct prompt length within the step."""
    steps = [s for s in run.steps if s.get("request_count")]
    if not steps:
        return []
    lowest = min(step_level(s) for s in steps)
    groups = [run.measured_records_by_step().get(s["step"], []) for s in steps if step_level(s) == lowest]
    if len(groups) == 1:
        by_length: dict[int, list] = {}
        for r in groups[0]:
            by_length.setdefault(r.input_tokens, []).append(r)
        groups = list(by_length.values())
    return sorted((round(statistics.median(r.input_tokens for r in g)), statistics.median(r.ttft * 1e3 for r in g))
                  for g in groups if g)


def check_ttft_beyond_prefill_floor(run: RunDir) -> list[Finding]:
    # Only one request at a time shows prefill alone: under load, or beside a mixed workload's other
    # class, TTFT also holds waiting (doctor.py's queueing check reads that).
    if _workload(run).get("kind") == "mixed" or min((step_level(s) for s in run.steps), default=0) != 1:
        return []
    points = ttft_by_length(run)
    if len(points) < 2 or points[-1][0] < 2 * points[0][0]:
        return []
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    low, high = prefill_floor_ms(run, xs[0]), prefill_floor_ms(run, xs[-1])
    if low is None or high is None:
        return []
    measured = _slope(xs, ys)
    floor = (high - low) / (xs[-1] - xs[0])
    if measured <= 0 or measured < FLOOR_RATIO * floor or ys[-1] < FLOOR_RATIO * high:
        return []
    if _workload(run).get("kind") == "shared_prefix" and not _engine(run).get("enable_kv_cache_reuse"):
        lever = ("these prompts share their opening: enable KV-cache reuse (engine.enable_kv_cache_reuse) so the "
                 "shared part is read once")
    else:
        lever = ("prefill runs far below the hardware's compute peak: on GPU, context FMHA / paged context FMHA "
                 "and FP8 context attention, more GPUs (TP) for long prompts; KV reuse when prompts share a "
                 "prefix; on the CPU engine, the kernels (see toolkit plan --gpu cpu)")
    return [Finding("ttft_beyond_prefill_floor", "warn", "TTFT grows with prompt length far beyond the prefill floor",
                    f"TTFT p50 {ys[0]:.1f} → {ys[-1]:.1f} ms over {xs[0]} → {xs[-1]} prompt tokens "
                    f"(+{100 * measured:.2f} ms per 100 tokens) against the planner's floor {low:.2f} → {high:.2f} ms "
                    f"(+{100 * floor:.3f} ms per 100 tokens): ×{measured / floor:.0f} the floor's slope", lever)]


# --- KV cache exhaustion -------------------------------------------------------------------------

def _step_samples(run: RunDir) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for sample in run.server_metrics():
        out.setdefault(sample.get("step"), []).append(sample)
    return out


def check_kv_exhaustion(run: RunDir) -> list[Finding]:
    findings = []
    engine = _engine(run)
    by_step = _step_samples(run)
    failures: dict[str, int] = {}
    for r in run.records():
        if r.error and not r.warmup and any(w in r.error.lower() for w in ("kv", "block", "cache")):
            failures[r.step] = failures.get(r.step, 0) + 1
    for step in run.steps:
        counters = counter_deltas(by_step.get(step["step"], []))
        waits = counters.get("toolkit_kv_cache_admission_waits_total", 0)
        paused = counters.get("toolkit_preemptions_total", 0)
        refused = failures.get(step["step"], 0)
        if not (waits or paused or refused):
            continue
        kv = (step.get("server") or {}).get("kv_cache") or {}
        parts = [f"{waits:.0f} requests waited for KV blocks" if waits else "",
                 f"{paused:.0f} running requests were paused for blocks (preempted)" if paused else "",
                 f"{refused} requests failed naming the KV cache" if refused else "",
                 f"peak use {kv['blocks_used_max']:g} of {kv['blocks_max']:g} blocks" if kv else ""]
        lever = "FP8 KV cache, a smaller max_batch_size or max_seq_len, or a cache sized for the batch"
        if engine.get("kv_cache_blocks") and engine.get("max_seq_len") and engine.get("tokens_per_block"):
            needed = engine["max_batch_size"] * math.ceil(engine["max_seq_len"] / engine["tokens_per_block"])
            if needed > engine["kv_cache_blocks"]:
                lever = (f"size the cache for the batch: {engine['max_batch_size']} sequences × "
                         f"{engine['max_seq_len']} tokens need {needed} blocks of {engine['tokens_per_block']}, the "
                         f"cache has {engine['kv_cache_blocks']} (engine.kv_cache_blocks; on GPU "
                         "kv_cache_free_gpu_mem_fraction, checked by `toolkit plan`); or " + lever)
        findings.append(Finding("kv_exhaustion", "warn", f"KV cache exhausted in {step['step']}",
                                "; ".join(p for p in parts if p), lever))
    return findings


# --- Low prefix reuse ----------------------------------------------------------------------------

def _sharing(run: RunDir) -> str | None:
    """How the run's workload shares prompt prefixes, in words; None if it does not."""
    w = _workload(run)
    kind = w.get("kind")
    if kind == "shared_prefix":
        return (f"{w.get('prefixes')} system prompt(s) of {w.get('prefix_tokens')} tokens shared by "
                f"{w.get('users_per_prefix')} users each")
    if kind == "multi_turn":
        return f"conversations of {w.get('turns')} turns, each re-sending its history"
    if kind == "trace" and w.get("path"):
        from toolkit.bench.workloads.trace import read_trace, shared_block_fraction
        from toolkit.errors import ToolkitError

        try:
            fraction = shared_block_fraction(read_trace(w["path"]))
        except ToolkitError:
            return None
        return f"a trace whose hashed blocks repeat ({100 * fraction:.0f} % seen before)" if fraction >= LOW_REUSE else None
    return None


def check_low_prefix_reuse(run: RunDir) -> list[Finding]:
    sharing = _sharing(run)
    if sharing is None:
        return []
    counters = counter_deltas(run.server_metrics())
    hits = counters.get("toolkit_kv_cache_reuse_hits_total")
    misses = counters.get("toolkit_kv_cache_reuse_misses_total")
    enabled = _engine(run).get("enable_kv_cache_reuse")
    if enabled is False:
        evidence = f"the workload is {sharing}, and this run's engine has enable_kv_cache_reuse: false"
        if hits is not None:
            evidence += f" ({hits:.0f} blocks reused)"
    elif hits is not None and misses is not None and hits + misses > 0 and hits / (hits + misses) < LOW_REUSE:
        evidence = (f"the workload is {sharing}, yet the server reused {hits:.0f} of {hits + misses:.0f} prompt blocks "
                    f"looked up ({100 * hits / (hits + misses):.0f} %)")
    else:
        return []
    return [Finding("low_prefix_reuse", "warn", "Prompts share prefixes the server does not reuse", evidence,
                    "enable KV-cache reuse (engine.enable_kv_cache_reuse: true; TensorRT-LLM's prefix caching) and "
                    "keep the shared text byte-identical at the start of the prompt; prefixes shorter than one "
                    "KV block (tokens_per_block) cannot be reused; a cache too small evicts them between users")]


WORKLOAD_CHECKS = [check_itl_spikes_with_prefill, check_ttft_beyond_prefill_floor, check_kv_exhaustion,
                   check_low_prefix_reuse]
