"""Prometheus recording rules and alerts for an LLM deployment. Pure: config in, rule groups out.

One rule file serves the cluster (inside the PrometheusRule), the local testbed's Prometheus, and
`promtool test rules`. Scale on KV-cache occupancy and waiting requests, not utilization: decode keeps
an accelerator busy while memory is what runs out.
"""

from __future__ import annotations

from toolkit.config import DeploymentConfig
from toolkit.deploy import names as n

ENGINE = f'model="{n.ENGINE_MODEL}"'
# Deployment-wide aggregates keep the scrape job (the PodMonitor's, or the testbed's) and namespace.
DEPLOYMENT_LABELS = "namespace, job"


def recording_rules() -> list[dict]:
    per_pod_drop = "model, version"
    return [
        {"record": n.KV_OCCUPANCY,
         "expr": f'{n.KV_BLOCKS}{{{n.KV_BLOCK_LABEL}="used"}} / ignoring({n.KV_BLOCK_LABEL}) '
                 f'({n.KV_BLOCKS}{{{n.KV_BLOCK_LABEL}="max"}} > 0)'},
        # Waiting for a batch slot (the engine's queue) or in Triton's queue for a model of the ensemble: a replica
        # whose tokenizer falls behind holds its queue there, where the engine's gauge does not see it. One
        # selector for both, so a Triton without the pending gauge still records the engine's.
        {"record": n.WAITING,
         "expr": f'sum without ({n.REQUEST_LABEL}, {per_pod_drop}) '
                 f'({{__name__=~"{n.REQUESTS}|{n.PENDING}", {n.REQUEST_LABEL}=~"waiting|"}})'},
        {"record": n.QUEUE_COMPUTE,
         "expr": f"sum without ({per_pod_drop}) (rate({n.QUEUE_US}{{{ENGINE}}}[1m])) / "
                 f"(sum without ({per_pod_drop}) (rate({n.COMPUTE_US}{{{ENGINE}}}[1m])) > 0)"},
        {"record": n.TTFT_P95,
         "expr": f"histogram_quantile(0.95, sum by (le, {DEPLOYMENT_LABELS}) (rate({n.PREFILL_SECONDS}_bucket[2m])))"},
        # Mean gap between tokens: decode seconds over (tokens − requests), since a request of k tokens has k−1 gaps.
        {"record": n.ITL_MEAN,
         "expr": f"sum by ({DEPLOYMENT_LABELS}) (rate({n.DECODE_SECONDS}_sum[2m])) / "
                 f"((sum by ({DEPLOYMENT_LABELS}) (rate({n.GENERATED_TOKENS}[2m])) - "
                 f"sum by ({DEPLOYMENT_LABELS}) (rate({n.DECODE_SECONDS}_count[2m]))) > 0)"},
    ]


def alert_rules(config: DeploymentConfig, hpa: str) -> list[dict]:
    """`hpa`: the HorizontalPodAutoscaler's name (autoscale.hpa_name), as kube-state-metrics labels it."""
    d = config.deploy
    ksm = f'horizontalpodautoscaler="{hpa}"'
    return [
        {"alert": "LLMKVCacheNearFull", "expr": f"{n.KV_OCCUPANCY} > {d.kv_alert_ratio:g}", "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "KV cache {{ $labels.pod }} is {{ $value | humanizePercentage }} full",
                         "description": "New requests wait for blocks; add replicas or shorten max_seq_len."}},
        {"alert": "LLMTTFTSLOBurn", "expr": f"{n.TTFT_P95} > {d.slo_ttft_ms / 1000:g}", "for": "5m",
         "labels": {"severity": "critical"},
         "annotations": {"summary": f"TTFT p95 {{{{ $value | humanizeDuration }}}} is over the {d.slo_ttft_ms:g} ms SLO",
                         "description": "Queueing or long prompts: check llm:queue_to_compute and the waiting requests."}},
        # kube-state-metrics' view of the HPA (for KEDA the HPA it creates is keda-hpa-<name>).
        {"alert": "LLMReplicasAtMax",
         "expr": f"kube_horizontalpodautoscaler_status_current_replicas{{{ksm}}} "
                 f">= kube_horizontalpodautoscaler_spec_max_replicas{{{ksm}}}", "for": "15m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": f"{hpa} has run at its maximum replicas for 15 minutes",
                         "description": "The autoscaler cannot add capacity: raise max_replicas or the GPU quota."}},
    ]


def rule_file(config: DeploymentConfig, hpa: str) -> dict:
    """The Prometheus rule file (also the PrometheusRule's spec)."""
    return {"groups": [
        # No group interval: each Prometheus evaluates at its own (the cluster's 30 s, the testbed's 2 s).
        {"name": f"{config.name}.recording", "rules": recording_rules()},
        {"name": f"{config.name}.alerts", "rules": alert_rules(config, hpa)},
    ]}
