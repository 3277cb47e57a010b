"""Disaggregated serving: how many prefill and how many decode replicas a target load needs. Pure.

Prefill is compute-bound and handled one prompt at a time per replica, so it is a queue: with service
time S (the plan's expected prefill for the input length) and Poisson arrivals, M/D/1 gives a mean wait
of ρS / (2(1 − ρ)); the TTFT objective caps the utilization ρ each prefill replica may run at.
Decode is bandwidth-bound and batched: the ITL objective caps the batch (the largest whose step time
meets it), and each replica then finishes batch / (output tokens × step) requests per second.
Mean-value queueing: a p95 objective needs headroom on top (the docs say so).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from toolkit.errors import ToolkitError


@dataclass(frozen=True)
class DisaggSplit:
    prefill_replicas: int
    decode_replicas: int
    decode_batch: int  # sequences per decode replica that keep ITL within its objective
    prefill_seconds: float
    prefill_utilization: float  # per prefill replica, at the target load
    expected_ttft_s: float  # prefill + M/D/1 mean wait
    decode_step_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def max_prefill_utilization(prefill_s: float, ttft_slo_s: float) -> float:
    """Largest ρ with S + ρS / (2(1 − ρ)) ≤ TTFT objective."""
    if prefill_s >= ttft_slo_s:
        raise ToolkitError(f"one prefill takes {prefill_s * 1000:.0f} ms, over the TTFT objective of "
                           f"{ttft_slo_s * 1000:.0f} ms: no replica count meets it",
                           "relax the TTFT objective, shorten the input, or add TP to the prefill replicas")
    headroom = ttft_slo_s / prefill_s - 1
    return 2 * headroom / (1 + 2 * headroom)


def decode_batch_for(decode_by_batch: list[dict], itl_slo_s: float) -> dict:
    """The largest planned batch whose decode step meets the ITL objective (within KV capacity)."""
    fitting = [p for p in decode_by_batch if p["step_seconds"] <= itl_slo_s and p["bound"] != "capacity"]
    if not fitting:
        fastest = min(p["step_seconds"] for p in decode_by_batch) * 1000
        raise ToolkitError(f"a decode step takes at least {fastest:.1f} ms, over the ITL objective of "
                           f"{itl_slo_s * 1000:.1f} ms: no replica count meets it",
                           "relax the ITL objective or add TP to the decode replicas")
    return max(fitting, key=lambda p: p["batch"])


def split(plan: dict, requests_per_s: float, ttft_slo_s: float, itl_slo_s: float) -> DisaggSplit:
    """Replica counts per phase for `plan` (toolkit.plan.stage.make_plan) at the target load."""
    if requests_per_s <= 0:
        raise ToolkitError(f"target load must be positive (got {requests_per_s} requests/s)", "pass e.g. --rate 10")
    roofline, osl = plan["roofline"], plan["deployment"]["osl"]
    prefill_s = roofline["prefill_expected_s"]
    rho_max = max_prefill_utilization(prefill_s, ttft_slo_s)
    prefill = max(1, math.ceil(requests_per_s * prefill_s / rho_max))
    rho = requests_per_s * prefill_s / prefill
    point = decode_batch_for(roofline["decode_by_batch"], itl_slo_s)
    per_replica = point["batch"] / (osl * point["step_seconds"])
    decode = max(1, math.ceil(requests_per_s / per_replica))
    return DisaggSplit(prefill_replicas=prefill, decode_replicas=decode, decode_batch=point["batch"],
                       prefill_seconds=prefill_s, prefill_utilization=rho,
                       expected_ttft_s=prefill_s + rho * prefill_s / (2 * (1 - rho)),
                       decode_step_s=point["step_seconds"])


def render_split(result: DisaggSplit, requests_per_s: float, ttft_slo_s: float, itl_slo_s: float) -> str:
    return (f"disaggregated at {requests_per_s:g} requests/s (TTFT ≤ {ttft_slo_s * 1000:g} ms, ITL ≤ "
            f"{itl_slo_s * 1000:g} ms): {result.prefill_replicas} prefill replica(s) at "
            f"{result.prefill_utilization:.0%} busy (prefill {result.prefill_seconds * 1000:.1f} ms, expected mean "
            f"TTFT {result.expected_ttft_s * 1000:.1f} ms) + {result.decode_replicas} decode replica(s) of batch "
            f"{result.decode_batch} (step {result.decode_step_s * 1000:.2f} ms)")
