"""The engine's Prometheus metrics, under the names TensorRT-LLM's Triton backend uses, so one
dashboard, one alert rule file and one autoscaler read the CPU engine and a GPU deployment alike.

TensorRT-LLM's backend (triton_backend/inflight_batcher_llm/src/custom_metrics_reporter) exports
gauges, one family per group, each value under a category label:
  nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}
  nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|reused|fraction}
  nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric=total_context_tokens|
                                      generation_requests|micro_batch_id|paused_requests}
  nv_trt_llm_general_metrics{general_type=timestamp|iteration_counter}
with the meanings of its iteration statistics: `active` requests admitted to the batch (holding KV
blocks, scheduled this step or not), `max` the batch limit, `scheduled` and `context` requests in the
last iteration, `waiting` requests queued for admission; `paused_requests` those paused by the last
iteration (max_utilization); `reused` counts reused KV blocks since start. What TensorRT-LLM lacks keeps the toolkit's
prefix: per-request phase histograms, the step time, reuse hits and misses, preemptions and
admission waits, speculative decoding's draft and accepted tokens.

`MetricsExporter` writes them through Triton's python-backend custom metrics (`pb_utils`, passed
in, so this module imports without Triton); the values come from pure functions of engine state.
"""

from __future__ import annotations

from dataclasses import dataclass

LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
STEP_BUCKETS = [0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1, 2]


@dataclass(frozen=True)
class LabelledGauges:
    """One TensorRT-LLM metric family: gauges told apart by one label."""
    name: str
    description: str
    label: str
    values: tuple[str, ...]


TRTLLM_FAMILIES = (
    LabelledGauges("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type",
                   ("active", "max", "scheduled", "context", "waiting")),
    LabelledGauges("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type",
                   ("max", "free", "used", "tokens_per", "reused", "fraction")),
    LabelledGauges("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics",
                   "inflight_batcher_specific_metric",
                   ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests")),
    LabelledGauges("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type",
                   ("timestamp", "iteration_counter")),
)

# name, kind, description (gauges set, counters incremented by their change, histograms observed)
TOOLKIT_METRICS = (
    ("toolkit_prefill_time_seconds", "histogram", "Arrival to first token per request (queue + prefill), seconds"),
    ("toolkit_decode_time_seconds", "histogram", "First to last token per request (decode), seconds"),
    ("toolkit_step_time_seconds", "histogram", "Duration of one engine step (schedule, forward, sample), seconds"),
    ("toolkit_kv_cache_blocks_used", "gauge", "KV cache blocks held by requests"),
    ("toolkit_kv_cache_blocks_max", "gauge", "KV cache blocks in the paged cache"),
    ("toolkit_active_requests", "gauge", "Requests in the engine (queued or running)"),
    ("toolkit_generated_tokens_total", "counter", "Output tokens generated"),
    ("toolkit_kv_cache_reuse_hits_total", "counter", "Full prompt blocks found in the reuse cache"),
    ("toolkit_kv_cache_reuse_misses_total", "counter", "Full prompt blocks looked up and not found"),
    ("toolkit_preemptions_total", "counter", "Running requests paused for KV blocks (max_utilization)"),
    ("toolkit_kv_cache_admission_waits_total", "counter", "Requests that waited in the queue for KV blocks"),
    ("toolkit_spec_draft_tokens_total", "counter", "Speculative draft tokens verified"),
    ("toolkit_spec_accepted_tokens_total", "counter", "Speculative draft tokens accepted"),
    ("toolkit_spec_acceptance_rate", "gauge", "Accepted / drafted tokens since start"),
)


def trtllm_values(engine) -> dict[str, dict[str, float]]:
    """TensorRT-LLM's gauges from an Engine's state after a step: {family: {label value: number}}."""
    scheduler, blocks, step = engine.scheduler, engine.scheduler.blocks, engine.last_step
    used = blocks.num_used
    return {
        "nv_trt_llm_request_metrics": {
            "active": len(scheduler.running), "max": engine.config.max_batch_size,
            "scheduled": step.batch_size if step else 0, "context": step.context_requests if step else 0,
            "waiting": len(scheduler.waiting)},
        "nv_trt_llm_kv_cache_block_metrics": {
            "max": blocks.num_blocks, "free": blocks.num_free, "used": used, "tokens_per": blocks.block_size,
            "reused": blocks.counters.reused, "fraction": used / blocks.num_blocks},
        "nv_trt_llm_inflight_batcher_metrics": {
            "total_context_tokens": step.prefill_tokens if step else 0,
            "generation_requests": step.generation_requests if step else 0, "micro_batch_id": 0,
            "paused_requests": step.preempted if step else 0},
        "nv_trt_llm_general_metrics": {
            "timestamp": int(step.start * 1e6) if step else 0, "iteration_counter": step.step if step else 0},
    }


def toolkit_values(engine) -> dict[str, float]:
    """The toolkit's own gauges and counters (cumulative values) from an Engine's state."""
    scheduler, blocks = engine.scheduler, engine.scheduler.blocks
    return {
        "toolkit_kv_cache_blocks_used": blocks.num_used,
        "toolkit_kv_cache_blocks_max": blocks.num_blocks,
        "toolkit_active_requests": engine.num_requests,
        "toolkit_generated_tokens_total": engine.totals.generated_tokens,
        "toolkit_kv_cache_reuse_hits_total": blocks.counters.reused,
        "toolkit_kv_cache_reuse_misses_total": blocks.counters.missed,
        "toolkit_preemptions_total": scheduler.counters.preemptions,
        "toolkit_kv_cache_admission_waits_total": scheduler.counters.admission_waits,
        "toolkit_spec_draft_tokens_total": scheduler.spec.draft_tokens,
        "toolkit_spec_accepted_tokens_total": scheduler.spec.accepted_tokens,
        "toolkit_spec_acceptance_rate": scheduler.spec.acceptance_rate,
    }


class MetricsExporter:
    """Triton custom metrics for one model; call `update` after steps, `observe_request` per output."""

    def __init__(self, pb_utils, model: str, version: str = "1"):
        kinds = {"gauge": pb_utils.MetricFamily.GAUGE, "counter": pb_utils.MetricFamily.COUNTER,
                 "histogram": pb_utils.MetricFamily.HISTOGRAM}
        labels = {"model": model, "version": version}
        # Keep the families alive as long as their metrics (Triton refuses metrics of a deleted family).
        self._families = []
        self._trtllm: dict[str, dict[str, object]] = {}
        for family in TRTLLM_FAMILIES:
            f = pb_utils.MetricFamily(family.name, family.description, kinds["gauge"])
            self._families.append(f)
            self._trtllm[family.name] = {v: f.Metric(labels=labels | {family.label: v}) for v in family.values}
        self._own, self._kind, self._last = {}, {}, {}
        for name, kind, description in TOOLKIT_METRICS:
            f = pb_utils.MetricFamily(name, description, kinds[kind])
            self._families.append(f)
            buckets = STEP_BUCKETS if name == "toolkit_step_time_seconds" else LATENCY_BUCKETS
            self._own[name] = f.Metric(labels=labels, buckets=buckets) if kind == "histogram" else f.Metric(labels=labels)
            self._kind[name] = kind
            self._last[name] = 0.0

    def update(self, engine) -> None:
        for family, values in trtllm_values(engine).items():
            for label, value in values.items():
                self._trtllm[family][label].set(float(value))
        for name, value in toolkit_values(engine).items():
            if self._kind[name] == "counter":
                delta = value - self._last[name]
                if delta > 0:
                    self._own[name].increment(delta)
            else:
                self._own[name].set(float(value))
            self._last[name] = value

    def observe_step(self, duration: float) -> None:
        self._own["toolkit_step_time_seconds"].observe(duration)

    def observe_request(self, output) -> None:
        """Phase histograms from a RequestOutput: prefill at the first token, decode at the end."""
        if output.new_tokens and output.first_token_at == output.at:
            self._own["toolkit_prefill_time_seconds"].observe(output.at - output.arrival)
        if output.finished and output.first_token_at is not None:
            self._own["toolkit_decode_time_seconds"].observe(output.at - output.first_token_at)
