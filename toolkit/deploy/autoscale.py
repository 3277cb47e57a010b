"""Autoscaling on KV-cache occupancy and waiting requests: an autoscaling/v2 HPA (through
prometheus-adapter) or a KEDA ScaledObject (querying Prometheus itself). Pure dicts."""

from __future__ import annotations

from toolkit.config import DeploymentConfig
from toolkit.deploy import names as n
from toolkit.deploy.monitoring import INSTANCE_SERIES_LABEL
from toolkit.deploy.objects import meta, scale_target

KEDA_API = "keda.sh/v1alpha1"


def quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers plain, fractions in milli-units (0.7 → 700m)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def parse_quantity(text: str | int | float) -> float:
    """The inverse of `quantity` (plain numbers and milli-units)."""
    text = str(text)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def targets(config: DeploymentConfig) -> dict[str, float]:
    """Recorded series → per-pod target value."""
    return {n.KV_OCCUPANCY: config.deploy.kv_occupancy_target, n.WAITING: config.deploy.waiting_requests_target}


def behavior(config: DeploymentConfig) -> dict:
    d, period = config.deploy, config.deploy.scale_period_s
    return {"scaleUp": {"stabilizationWindowSeconds": d.scale_up_window_s, "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": period},
                                     {"type": "Percent", "value": 100, "periodSeconds": period}]},
            # One replica at a time: each drains its in-flight streams before the next goes.
            "scaleDown": {"stabilizationWindowSeconds": d.scale_down_window_s, "selectPolicy": "Max",
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": period}]}}


def hpa(config: DeploymentConfig) -> dict:
    d = config.deploy
    metrics = [{"type": "Pods", "pods": {"metric": {"name": n.ADAPTER_METRICS[series]},
                                         "target": {"type": "AverageValue", "averageValue": quantity(value)}}}
               for series, value in targets(config).items()]
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta(config),
            "spec": {"scaleTargetRef": scale_target(config), "minReplicas": d.min_replicas,
                     "maxReplicas": d.max_replicas, "metrics": metrics, "behavior": behavior(config)}}


def keda_query(config: DeploymentConfig, series: str) -> str:
    # KEDA's AverageValue divides this sum by the replica count, as the HPA averages per pod.
    return (f'sum({series}{{namespace="{config.deploy.namespace}",'
            f'{INSTANCE_SERIES_LABEL}="{config.name}"}})')


def scaled_object(config: DeploymentConfig) -> dict:
    d = config.deploy
    target = scale_target(config)
    ref = {"name": target["name"]}
    if target["kind"] != "Deployment":
        ref.update(apiVersion=target["apiVersion"], kind=target["kind"])
    triggers = [{"type": "prometheus", "metricType": "AverageValue", "name": n.ADAPTER_METRICS[series].replace("_", "-"),
                 "metadata": {"serverAddress": d.prometheus_url, "query": keda_query(config, series),
                              "threshold": f"{value:g}"}}
                for series, value in targets(config).items()]
    return {"apiVersion": KEDA_API, "kind": "ScaledObject", "metadata": meta(config),
            "spec": {"scaleTargetRef": ref, "minReplicaCount": d.min_replicas, "maxReplicaCount": d.max_replicas,
                     "pollingInterval": 15,
                     "advanced": {"horizontalPodAutoscalerConfig": {"name": f"keda-hpa-{config.name}",
                                                                    "behavior": behavior(config)}},
                     "triggers": triggers}}


def hpa_name(config: DeploymentConfig, autoscaler: str) -> str:
    """The HPA object kube-state-metrics reports (KEDA creates its own)."""
    return f"keda-hpa-{config.name}" if autoscaler == "keda" else config.name
