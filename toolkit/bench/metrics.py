"""Metric math, pure: records in, statistics out. Definitions follow genai-perf / AIPerf.

One class per metric (AIPerf style) with its unit, which direction is better, and its names in
AIPerf's and genai-perf's exports: the sweep summary, the exports, the reports and A/B all read them
from here. Record metrics give one value per request (or several, for per-chunk gaps); step metrics
give one number per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.bench.records import RequestRecord

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
# Below this many requests a step's tail percentiles are one or two samples (p99 of 10 is the max):
# summaries flag the step so that consoles and reports can say so.
SMALL_SAMPLE = 20


class Metric:
    """What a metric is beyond its values: its unit, which way is better, and its names elsewhere.

    `tag` is the key in our summaries; `aiperf_tag` the key AIPerf (and genai-perf, for the metrics it
    has) use in their JSON exports, `export_unit` their unit string, `aiperf_header` the CSV label AIPerf
    writes (None: AIPerf has no such metric, ours only) and `genai_perf_header` genai-perf's CSV label.
    """

    tag: str
    unit: str
    header: str  # row label in our reports
    lower_is_better: bool | None = True  # None: neither direction is better (a count, a length)
    aiperf_tag: str | None = None  # defaults to tag
    aiperf_header: str | None = None
    genai_perf_header: str | None = None
    export_unit: str | None = None  # defaults to unit

    @property
    def export_tag(self) -> str:
        return self.aiperf_tag or self.tag

    @property
    def exported_unit(self) -> str:
        return self.export_unit or self.unit

    @property
    def direction(self) -> str:
        return {True: "lower is better", False: "higher is better", None: ""}[self.lower_is_better]

    def improved(self, baseline: float, candidate: float) -> bool | None:
        """Is candidate better than baseline? None where no direction is better."""
        if self.lower_is_better is None or candidate == baseline:
            return None
        return (candidate < baseline) == self.lower_is_better


class RecordMetric(Metric):
    """One value per request (or several, for per-chunk gaps): reported as a distribution."""

    def values(self, record: RequestRecord) -> list[float]:
        raise NotImplementedError


class StepMetric(Metric):
    """One number per step (a throughput, a count), from the step's successful records and its window."""

    def compute(self, ok: list[RequestRecord], duration: float) -> float:
        raise NotImplementedError

    def of(self, step: dict) -> float | None:
        """The value a step summary holds."""
        value = step.get(self.tag)
        return value["avg"] if isinstance(value, dict) else value


class TimeToFirstToken(RecordMetric):
    tag, unit, header = "time_to_first_token", "ms", "Time to first token"
    aiperf_header, genai_perf_header = "Time to First Token", "Time To First Token"

    def values(self, r):
        return [r.ttft * 1e3]


class TimeToSecondToken(RecordMetric):
    tag, unit, header = "time_to_second_token", "ms", "Time to second token"
    aiperf_header, genai_perf_header = "Time to Second Token", "Time To Second Token"

    def values(self, r):
        return [(r.chunk_times[1] - r.chunk_times[0]) * 1e3] if len(r.chunk_times) > 1 else []


class InterTokenLatency(RecordMetric):
    """(end-to-end − TTFT) / (output tokens − 1). vLLM calls this TPOT."""

    tag, unit, header = "inter_token_latency", "ms", "Inter-token latency"
    aiperf_header, genai_perf_header = "Inter Token Latency", "Inter Token Latency"

    def values(self, r):
        itl = r.inter_token_latency
        return [itl * 1e3] if itl is not None else []


class InterChunkGap(RecordMetric):
    """Every gap between consecutive streamed responses (vLLM's ITL): shows stalls the mean hides."""

    tag, unit, header = "inter_chunk_gap", "ms", "Inter-chunk gap"
    aiperf_tag, aiperf_header = "inter_chunk_latency", "Inter Chunk Latency"

    def values(self, r):
        return [g * 1e3 for g in r.chunk_gaps]


class RequestLatency(RecordMetric):
    tag, unit, header = "request_latency", "ms", "Request latency"
    aiperf_header, genai_perf_header = "Request Latency", "Request Latency"

    def values(self, r):
        return [r.e2e_latency * 1e3]


class PrefillShare(RecordMetric):
    """TTFT as a share of the request latency: which phase a request's latency is spent in (ours only)."""

    tag, unit, header = "prefill_share", "%", "TTFT share of latency"
    lower_is_better = None

    def values(self, r):
        return [100 * r.ttft / r.e2e_latency] if r.e2e_latency else []


class InputSequenceLength(RecordMetric):
    tag, unit, header = "input_sequence_length", "tokens", "Input sequence length"
    aiperf_header, genai_perf_header = "Input Sequence Length", "Input Sequence Length"
    lower_is_better = None

    def values(self, r):
        return [r.input_tokens]


class OutputSequenceLength(RecordMetric):
    tag, unit, header = "output_sequence_length", "tokens", "Output sequence length"
    aiperf_header, genai_perf_header = "Output Sequence Length", "Output Sequence Length"
    lower_is_better = None

    def values(self, r):
        return [r.output_tokens]


class OutputTokenThroughputPerUser(RecordMetric):
    """1 / ITL: the decode speed one user sees."""

    tag, unit, header = "output_token_throughput_per_user", "tokens/s", "Output tokens/s per user"
    aiperf_header = genai_perf_header = "Output Token Throughput Per User"
    lower_is_better, export_unit = False, "tokens/sec/user"

    def values(self, r):
        itl = r.inter_token_latency
        return [1.0 / itl] if itl else []


class OutputTokenThroughput(StepMetric):
    """Output tokens of the step / its window (first send → last completion)."""

    tag, unit, header = "output_token_throughput", "tokens/s", "Output token throughput"
    aiperf_header = genai_perf_header = "Output Token Throughput"
    lower_is_better, export_unit = False, "tokens/sec"

    def compute(self, ok, duration):
        return sum(r.output_tokens for r in ok) / duration if duration else 0.0


class RequestThroughput(StepMetric):
    tag, unit, header = "request_throughput", "requests/s", "Request throughput"
    aiperf_header, genai_perf_header = "Request Throughput", "Request Throughput"
    lower_is_better, export_unit = False, "requests/sec"

    def compute(self, ok, duration):
        return len(ok) / duration if duration else 0.0


class Goodput(StepMetric):
    """Requests per second that met every SLO (computed in calculate_metrics, which holds the SLO)."""

    tag, unit, header = "goodput", "requests/s", "Goodput"
    aiperf_header, genai_perf_header = "Goodput", "Request Goodput"
    lower_is_better, export_unit = False, "requests/sec"


class RequestCount(StepMetric):
    tag, unit, header = "request_count", "requests", "Successful requests"
    aiperf_header, genai_perf_header = "Request Count", "Request Count"
    lower_is_better = False

    def compute(self, ok, duration):
        return len(ok)


class ErrorRequestCount(StepMetric):
    tag, unit, header = "error_count", "requests", "Failed requests"
    aiperf_tag, aiperf_header = "error_request_count", "Error Request Count"

    def of(self, step):
        return step.get("error_count", 0)


class BenchmarkDuration(StepMetric):
    tag, unit, header = "duration_s", "s", "Step window"
    aiperf_tag, aiperf_header, export_unit = "benchmark_duration", "Benchmark Duration", "sec"
    lower_is_better = None


RECORD_METRICS: list[RecordMetric] = [
    TimeToFirstToken(), TimeToSecondToken(), InterTokenLatency(), InterChunkGap(), RequestLatency(),
    PrefillShare(), InputSequenceLength(), OutputSequenceLength(), OutputTokenThroughputPerUser(),
]
STEP_METRICS: list[StepMetric] = [OutputTokenThroughput(), RequestThroughput(), Goodput(), RequestCount(),
                                  ErrorRequestCount(), BenchmarkDuration()]
# Every metric by its tag: what reports, exports and A/B look up for unit, direction and names.
METRICS: dict[str, Metric] = {m.tag: m for m in [*RECORD_METRICS, *STEP_METRICS]}


def distribution(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    out = {"avg": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max()), "std": float(arr.std()),
           "count": int(arr.size), "sum": float(arr.sum())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"p{p}"] = float(v)
    return out


@dataclass(frozen=True)
class Slo:
    """Service-level objectives for goodput, in milliseconds (None = no bound)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    latency_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        checks = ((self.ttft_ms, r.ttft), (self.itl_ms, r.inter_token_latency), (self.latency_ms, r.e2e_latency))
        return all(bound is None or (value is not None and value * 1e3 <= bound) for bound, value in checks)


def step_window(records: list[RequestRecord]) -> float:
    """Seconds from the first send to the last completion (the denominator of throughputs)."""
    ends = [r.end_time for r in records if r.end_time is not None] + [t for r in records for t in r.chunk_times[-1:]]
    if not records or not ends:
        return 0.0
    return max(ends) - min(r.send_time for r in records)


def calculate_metrics(records: list[RequestRecord], slo: Slo | None = None) -> dict:
    """Summary of one step. Warm-up records are excluded; failed ones are counted by kind."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    duration = step_window(measured)
    metrics = {}
    for metric in RECORD_METRICS:
        values = [v for r in ok for v in metric.values(r)]
        stats = distribution(values)
        if stats is not None:
            metrics[metric.tag] = {"unit": metric.unit, **stats}
    errors_by_kind: dict[str, int] = {}
    for r in failed:
        kind = r.error_kind or ("no_output" if r.error is None else "client")
        errors_by_kind[kind] = errors_by_kind.get(kind, 0) + 1
    summary = {
        "request_count": len(ok),
        "small_sample": len(ok) < SMALL_SAMPLE,
        "error_count": len(failed),
        "errors_by_kind": errors_by_kind,
        "duration_s": duration,
        "metrics": metrics,
    }
    for metric in (OutputTokenThroughput(), RequestThroughput()):
        summary[metric.tag] = {"unit": metric.unit, "avg": metric.compute(ok, duration)}
    if slo is not None:
        good = sum(1 for r in ok if slo.met_by(r))
        summary[Goodput.tag] = {"unit": Goodput.unit, "avg": good / duration if duration else 0.0,
                                "good_requests": good, "slo": slo.__dict__}
    return summary


def phase_split(summary: dict) -> dict[str, float] | None:
    """Mean prefill (TTFT) vs decode (latency − TTFT) time of a step, and which dominates."""
    m = summary.get("metrics", {})
    if "time_to_first_token" not in m or "request_latency" not in m:
        return None
    prefill = m["time_to_first_token"]["avg"]
    total = m["request_latency"]["avg"]
    decode = max(total - prefill, 0.0)
    share = prefill / total if total and not math.isclose(total, 0.0) else 0.0
    return {"prefill_ms": prefill, "decode_ms": decode, "prefill_share": share, "decode_share": 1 - share,
            "dominant": "decode" if decode >= prefill else "prefill"}
