"""Writes docker/grafana/dashboards/llm-serving.json (run: python docker/make_dashboard.py).

Panels use Triton core metrics, the TensorRT-LLM backend's (nv_trt_llm_*, which the CPU engine
exports as well), and the toolkit's phase histograms (toolkit_*, which TensorRT-LLM lacks).
"""

import json
from pathlib import Path

RATE = "1m"
PANELS = [
    ("Time to first token p50 / p99 / mean (server side, ms)", "ms", [
        ("p50 (CPU engine)", f"1000 * histogram_quantile(0.5, sum by (le) (rate(toolkit_prefill_time_seconds_bucket[{RATE}])))"),
        ("p99 (CPU engine)", f"1000 * histogram_quantile(0.99, sum by (le) (rate(toolkit_prefill_time_seconds_bucket[{RATE}])))"),
        # Triton's first-response histogram (--metrics-config=histogram_latencies=true) has fixed buckets
        # (100/500/2000/5000 ms) that cannot resolve TTFT quantiles: its exact mean (sum / count) instead.
        ("mean (Triton first response, GPU)", f'increase(nv_inference_first_response_histogram_ms_sum{{model="ensemble"}}[{RATE}]) / '
                                              f'increase(nv_inference_first_response_histogram_ms_count{{model="ensemble"}}[{RATE}])'),
    ]),
    ("Prefill (arrival → first token) and decode (first → last token) per request, mean (s)", "s", [
        ("prefill", f"increase(toolkit_prefill_time_seconds_sum[{RATE}]) / increase(toolkit_prefill_time_seconds_count[{RATE}])"),
        ("decode", f"increase(toolkit_decode_time_seconds_sum[{RATE}]) / increase(toolkit_decode_time_seconds_count[{RATE}])"),
    ]),
    ("Inter-token latency, mean (ms)", "ms", [
        ("ITL", f"1000 * increase(toolkit_decode_time_seconds_sum[{RATE}]) / "
                f"(increase(toolkit_generated_tokens_total[{RATE}]) - increase(toolkit_decode_time_seconds_count[{RATE}]))"),
    ]),
    ("Queue time per request by model (ms)", "ms", [
        ("{{model}}", f"rate(nv_inference_queue_duration_us[{RATE}]) / clamp_min(rate(nv_inference_request_success[{RATE}]), 1e-9) / 1000"),
    ]),
    ("Compute time per request by model (ms)", "ms", [
        ("{{model}}", f"rate(nv_inference_compute_infer_duration_us[{RATE}]) / clamp_min(rate(nv_inference_request_success[{RATE}]), 1e-9) / 1000"),
    ]),
    # TensorRT-LLM's Triton backend families: the CPU engine exports them too (toolkit/engine/runtime/metrics.py).
    ("KV-cache blocks", "short", [
        ("used", 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"}'),
        ("max", 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}'),
    ]),
    ("KV-cache occupancy (what the autoscaler targets)", "percentunit", [
        ("{{pod}}", 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"} / ignoring(kv_cache_block_type) '
                    '(nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"} > 0)'),
    ]),
    ("Requests in flight and waiting", "short", [
        ("active", 'nv_trt_llm_request_metrics{request_type="active"}'),
        ("waiting (queued for a batch slot)", 'nv_trt_llm_request_metrics{request_type="waiting"}'),
        ("generation requests", 'nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="generation_requests"}'),
        ("pending {{model}}", "nv_inference_pending_request_count"),
    ]),
    ("Throughput", "short", [
        ("requests/s", f'rate(nv_inference_request_success{{model="ensemble"}}[{RATE}])'),
        ("output tokens/s (CPU engine)", f"rate(toolkit_generated_tokens_total[{RATE}])"),
    ]),
]


def dashboard() -> dict:
    panels = []
    for index, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": index + 1, "type": "timeseries", "title": title,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "datasource": {"type": "prometheus", "uid": "prometheus"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend}
                        for i, (legend, expr) in enumerate(targets)],
        })
    return {"title": "LLM serving", "uid": "llm-serving", "schemaVersion": 39, "refresh": "5s",
            "time": {"from": "now-15m", "to": "now"}, "panels": panels}


if __name__ == "__main__":
    out = Path(__file__).parent / "grafana" / "dashboards" / "llm-serving.json"
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(out)
