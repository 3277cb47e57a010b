"""Checks on a cluster folder that schemas cannot make: do the pieces fit each other and Triton?
Ports Triton listens on, probe paths it serves, GPU requests = limits = what the engine needs,
selectors that select the serving pods, and HPA / KEDA metrics that the rules actually record.
Each finding names the object, the problem and the fix."""

from __future__ import annotations

import re

import yaml

from toolkit.deploy import launch
from toolkit.deploy import names as n
from toolkit.deploy.objects import GPU, LWS_NAME_LABEL

SERVING_KINDS = ("Deployment", "LeaderWorkerSet")


def _pod_templates(obj: dict) -> list[tuple[str, dict]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Deployment":
        return [("template", spec.get("template", {}))]
    if obj["kind"] == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate", {})
        return [(key, lwt[key]) for key in ("leaderTemplate", "workerTemplate") if key in lwt]
    return []


def _where(obj: dict) -> str:
    return f"{obj['kind']}/{obj.get('metadata', {}).get('name', '?')}"


def _check_container(where: str, c: dict, gpus: int) -> list[str]:
    out = []
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    for name, port in ports.items():
        if launch.PORTS.get(name) != port:
            out.append(f"{where}: container port {name}={port} is not where Triton listens "
                       f"({launch.PORTS}) — use Triton's ports")
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(probe_name)
        if not probe:
            if ports:  # the serving container (workers have no ports and no probes)
                out.append(f"{where}: no {probe_name} — add one on {launch.TRITON_HEALTH_PATHS[0]}")
            continue
        get = probe.get("httpGet", {})
        path, port = get.get("path"), get.get("port")
        if path not in launch.TRITON_HEALTH_PATHS:
            out.append(f"{where}: {probe_name} asks {path!r}, which Triton does not serve — "
                       f"use one of {', '.join(launch.TRITON_HEALTH_PATHS)}")
        if port not in ("http", launch.PORTS["http"]):
            out.append(f"{where}: {probe_name} on port {port!r}, not Triton's HTTP port — use port: http")
    if gpus:
        res = c.get("resources", {})
        for side in ("requests", "limits"):
            have = res.get(side, {}).get(GPU)
            if str(have) != str(gpus):
                out.append(f"{where}: {GPU} {side} is {have}, the engine needs {gpus} per pod (TP × PP) — "
                           f"set requests = limits = {gpus}")
    return out


def _matches(selector: dict, pod_labels: dict) -> bool:
    return all(pod_labels.get(k) == v for k, v in selector.items())


def lint(objects: list[dict], gpus_per_pod: int) -> list[str]:
    findings: list[str] = []
    by_kind: dict[str, list[dict]] = {}
    for obj in objects:
        by_kind.setdefault(obj.get("kind"), []).append(obj)
    serving_labels, port_names = [], set()
    for obj in objects:
        if obj.get("kind") not in SERVING_KINDS:
            continue
        for key, tpl in _pod_templates(obj):
            containers = tpl.get("spec", {}).get("containers", [])
            for c in containers:
                findings += _check_container(f"{_where(obj)} {key} container {c.get('name')}", c, gpus_per_pod)
                port_names |= {p.get("name") for p in c.get("ports", [])}
            if key != "workerTemplate":
                pod_labels = dict(tpl.get("metadata", {}).get("labels", {}))
                if obj["kind"] == "LeaderWorkerSet":  # the LWS controller adds its name label to every pod
                    pod_labels[LWS_NAME_LABEL] = obj["metadata"]["name"]
                serving_labels.append(pod_labels)
    for obj in by_kind.get("Service", []):
        for p in obj["spec"].get("ports", []):
            if p.get("targetPort") not in port_names and p.get("targetPort") not in launch.PORTS.values():
                findings.append(f"{_where(obj)}: targetPort {p.get('targetPort')!r} is no container port — "
                                f"use one of {sorted(port_names)}")
    selectors = [(o, o["spec"].get("selector", {})) for o in by_kind.get("Service", [])]
    selectors += [(o, o["spec"].get("selector", {}).get("matchLabels", {}))
                  for kind in ("PodDisruptionBudget", "PodMonitor") for o in by_kind.get(kind, [])]
    for obj, selector in selectors:
        if not any(_matches(selector, labels) for labels in serving_labels):
            findings.append(f"{_where(obj)}: selector {selector} selects no serving pod — match the pod labels")
    for obj in by_kind.get("PodMonitor", []):
        for ep in obj["spec"].get("podMetricsEndpoints", []):
            if ep.get("port") != "metrics":
                findings.append(f"{_where(obj)}: scrapes port {ep.get('port')!r}, not Triton's metrics port — "
                                "use port: metrics")
    findings += _check_metrics(by_kind)
    return findings


def _recorded(by_kind: dict) -> set[str]:
    return {rule["record"] for obj in by_kind.get("PrometheusRule", [])
            for group in obj["spec"].get("groups", []) for rule in group.get("rules", []) if "record" in rule}


def _check_metrics(by_kind: dict) -> list[str]:
    out = []
    recorded = _recorded(by_kind)
    exposed = {}
    for obj in by_kind.get("ConfigMap", []):
        text = obj.get("data", {}).get("config.yaml")
        if not text:
            continue
        for rule in yaml.safe_load(text).get("rules", []):
            series = rule["seriesQuery"].split("{", 1)[0]
            if series not in recorded:
                out.append(f"{_where(obj)}: adapter rule reads {series!r}, which no PrometheusRule records — "
                           f"use one of {sorted(recorded)}")
            exposed[rule["name"]["as"]] = series
    for obj in by_kind.get("HorizontalPodAutoscaler", []):
        for metric in obj["spec"].get("metrics", []):
            name = metric.get("pods", {}).get("metric", {}).get("name")
            if name not in exposed:
                out.append(f"{_where(obj)}: metric {name!r} is not in the custom metrics API the adapter serves — "
                           f"use one of {sorted(exposed) or sorted(n.ADAPTER_METRICS.values())}")
    for obj in by_kind.get("ScaledObject", []):
        for trig in obj["spec"].get("triggers", []):
            query = trig.get("metadata", {}).get("query", "")
            series = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+", query))
            if not series or not series <= recorded:
                out.append(f"{_where(obj)}: trigger query {query!r} reads no recorded series — "
                           f"use one of {sorted(recorded)}")
    return out
