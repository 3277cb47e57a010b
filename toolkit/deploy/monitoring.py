"""Monitoring objects: PodMonitor (scrape the serving pods), PrometheusRule (rules.py's file), and the
prometheus-adapter rules that expose the recorded per-pod series to the HPA. Pure dicts."""

from __future__ import annotations

import yaml

from toolkit.config import DeploymentConfig
from toolkit.deploy import names as n
from toolkit.deploy.objects import labels, meta, serving_selector
from toolkit.deploy.rules import rule_file

MONITORING_API = "monitoring.coreos.com/v1"
# A label every scraped series gets from the pod, so queries can pick this deployment's pods.
INSTANCE_LABEL = "app.kubernetes.io/instance"
INSTANCE_SERIES_LABEL = "app_kubernetes_io_instance"


def pod_monitor(config: DeploymentConfig) -> dict:
    return {"apiVersion": MONITORING_API, "kind": "PodMonitor", "metadata": meta(config),
            "spec": {"selector": {"matchLabels": serving_selector(config)},
                     "podTargetLabels": [INSTANCE_LABEL],
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}}


def prometheus_rule(config: DeploymentConfig, hpa: str) -> dict:
    return {"apiVersion": MONITORING_API, "kind": "PrometheusRule", "metadata": meta(config),
            "spec": rule_file(config, hpa)}


def adapter_rules() -> dict:
    """prometheus-adapter's `rules:` (custom metrics API): each recorded per-pod series under its HPA name."""
    return {"rules": [
        {"seriesQuery": f'{series}{{namespace!="",pod!=""}}',
         "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
         "name": {"matches": f"^{series}$", "as": metric},
         "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}
        for series, metric in n.ADAPTER_METRICS.items()]}


def adapter_config_map(config: DeploymentConfig) -> dict:
    """For the adapter's install (e.g. its Helm chart's `rules.custom`); kept beside the deployment."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{config.name}-prometheus-adapter-rules", "namespace": config.deploy.namespace,
                         "labels": labels(config)},
            "data": {"config.yaml": yaml.safe_dump(adapter_rules(), sort_keys=False)}}
