"""A scenario's verdict from its runs, pure: per-request values by class, the A/B comparison of the
judged metric (two-level bootstrap, toolkit/ab/stats.py), the server's counters, and the sentence."""

from __future__ import annotations

from toolkit.ab.stats import compare
from toolkit.bench.records import RequestRecord
from toolkit.bench.rundir import RunDir
from toolkit.report.doctor_workloads import counter_deltas

# Per-request values in ms; None where a request has none.
VALUES = {
    "ttft": lambda r: r.ttft * 1e3,
    "itl": lambda r: r.inter_token_latency * 1e3 if r.inter_token_latency else None,
    "max_gap": lambda r: max(r.chunk_gaps) * 1e3 if r.chunk_gaps else None,
    "latency": lambda r: r.e2e_latency * 1e3,
}


def values(records: list[RequestRecord], metric: str, request_class: str | None) -> list[float]:
    out = [VALUES[metric](r) for r in records if request_class is None or r.request_class == request_class]
    return [v for v in out if v is not None]


def judge(runs: dict[str, list[RunDir]], judged, boot: int = 2000) -> list[dict]:
    """Baseline (first label) vs fix per step, for each judged metric."""
    baseline, fix = list(runs)
    results = []
    for j in judged:
        for step in [s["step"] for s in runs[baseline][0].steps]:
            reps = {label: [values(run.measured_records_by_step().get(step, []), j.metric, j.request_class)
                            for run in runs[label]] for label in (baseline, fix)}
            try:
                c = compare(f"{j.metric}" + (f"[{j.request_class}]" if j.request_class else ""), step, baseline, fix,
                            reps[baseline], reps[fix], lower_is_better=True, boot=boot)
            except ValueError:
                continue
            results.append(c.to_dict() | {"title": j.title or j.metric})
    return results


def server_evidence(runs: dict[str, list[RunDir]]) -> dict[str, dict]:
    """Per variant, the engine counters summed over its repetitions, and the peak KV use."""
    out = {}
    for label, reps in runs.items():
        total: dict[str, float] = {}
        for run in reps:
            for name, value in counter_deltas(run.server_metrics()).items():
                total[name] = total.get(name, 0.0) + value
        kv = [s["server"]["kv_cache"]["utilization_max"] for run in reps for s in run.steps
              if (s.get("server") or {}).get("kv_cache")]
        errors = sum(s.get("error_count", 0) for run in reps for s in run.steps)
        out[label] = {"counters": total, "kv_utilization_max": max(kv) if kv else None, "errors": errors}
    return out


def sentence(result: dict) -> str:
    """`short streams' longest pause, concurrency_2: 41.0 → 12.5 ms (−70 %, 95 % CI [−78 %, −61 %]): better`."""
    return (f"{result['title']}, {result['step']}: {result['baseline_value']:,.1f} → {result['candidate_value']:,.1f} ms "
            f"({100 * result['relative_change']:+.0f} %, 95 % CI [{100 * result['ci_low']:+.0f} %, "
            f"{100 * result['ci_high']:+.0f} %]): {result['verdict']}"
            + ("" if result["verdict"] != "noise" else f" ({result['reason']})"))


def evidence_lines(evidence: dict[str, dict]) -> list[str]:
    names = {"toolkit_kv_cache_reuse_hits_total": "KV blocks reused", "toolkit_kv_cache_reuse_misses_total":
             "KV blocks missed", "toolkit_preemptions_total": "preemptions", "toolkit_kv_cache_admission_waits_total":
             "requests waiting for KV blocks", "toolkit_spec_draft_tokens_total": "draft tokens",
             "toolkit_spec_accepted_tokens_total": "accepted draft tokens"}
    lines = []
    for label, e in evidence.items():
        parts = [f"{names[k]} {v:,.0f}" for k, v in e["counters"].items() if k in names and v]
        if not parts and e["counters"]:
            parts.append("no KV reuse, waits for blocks, preemptions or draft tokens counted")
        drafted = e["counters"].get("toolkit_spec_draft_tokens_total")
        if drafted:
            parts.append(f"acceptance {100 * e['counters'].get('toolkit_spec_accepted_tokens_total', 0) / drafted:.0f} %")
        if e["kv_utilization_max"] is not None:
            parts.append(f"KV cache peak {100 * e['kv_utilization_max']:.0f} %")
        parts.append(f"{e['errors']} failed requests")
        lines.append(f"- {label}: " + ", ".join(parts))
    return lines
