"""Metric names the cluster side reads: one set for the GPU engine and the CPU engine.

The nv_trt_llm_* families and their labels are those TensorRT-LLM's Triton backend exports
(triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc in
NVIDIA/TensorRT-LLM): every series carries `model` and `version`, plus the family's category label.
Phase histograms TensorRT-LLM lacks keep the toolkit's prefix. The recorded series (`llm:*`) are what
the dashboard, the HPA (through prometheus-adapter) and KEDA read.
"""

KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
KV_BLOCK_LABEL = "kv_cache_block_type"  # max | free | used | tokens_per (| reused | fraction on newer releases)
REQUESTS = "nv_trt_llm_request_metrics"
REQUEST_LABEL = "request_type"  # active | max | scheduled | context | waiting
INFLIGHT = "nv_trt_llm_inflight_batcher_metrics"
INFLIGHT_LABEL = "inflight_batcher_specific_metric"

# Triton core, per model; the engine model is `tensorrt_llm` on both targets.
QUEUE_US = "nv_inference_queue_duration_us"
REQUEST_SUCCESS = "nv_inference_request_success"  # requests a model completed
PENDING = "nv_inference_pending_request_count"  # requests in a model's queue, not yet executing
COMPUTE_US = "nv_inference_compute_infer_duration_us"
ENGINE_MODEL = "tensorrt_llm"

# The toolkit's own phase histograms and counters (the CPU engine exports them).
PREFILL_SECONDS = "toolkit_prefill_time_seconds"  # arrival → first token: the server's TTFT
DECODE_SECONDS = "toolkit_decode_time_seconds"  # first → last token
GENERATED_TOKENS = "toolkit_generated_tokens_total"

# Recorded series (PrometheusRule / the testbed's rule file).
KV_OCCUPANCY = "llm:kv_cache_occupancy:ratio"
WAITING = "llm:waiting_requests:sum"
QUEUE_COMPUTE = "llm:queue_to_compute:ratio_rate1m"
TTFT_P95 = "llm:ttft_seconds:p95_rate2m"
ITL_MEAN = "llm:itl_seconds:mean_rate2m"

# What prometheus-adapter calls the per-pod recorded series in the custom metrics API (the HPA's names).
ADAPTER_METRICS = {KV_OCCUPANCY: "llm_kv_cache_occupancy", WAITING: "llm_waiting_requests"}
