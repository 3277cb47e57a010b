"""Validators for emitted manifests: Kubernetes' OpenAPI schemas (kubernetes-validate) for core objects,
and the vendored published CRD schemas (tests/data/crds/) for custom resources, both strict about
unknown fields, as the API server's strict field validation (kubectl's default) is."""

from __future__ import annotations

import copy
import gzip
from functools import lru_cache
from pathlib import Path

import yaml

CRD_DIR = Path(__file__).parent / "data" / "crds"
CRD_FILES = {("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "leaderworkerset.yaml.gz",
             ("monitoring.coreos.com", "PodMonitor"): "podmonitor.yaml.gz",
             ("monitoring.coreos.com", "PrometheusRule"): "prometheusrule.yaml.gz",
             ("keda.sh", "ScaledObject"): "scaledobject.yaml.gz",
             ("nvidia.com", "DynamoGraphDeployment"): "dynamographdeployment.yaml.gz"}
# Three recent minor versions of Kubernetes whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")


def is_custom(obj: dict) -> bool:
    return (obj["apiVersion"].split("/")[0], obj["kind"]) in CRD_FILES


def _strict(schema: dict) -> dict:
    """Unknown fields are errors, except where the CRD preserves them (as the API server decides)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) if k != "enum" else v for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        if schema.get("x-kubernetes-int-or-string"):
            schema.pop("type", None)
            schema.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    elif isinstance(schema, list):
        schema = [_strict(s) for s in schema]
    return schema


@lru_cache(maxsize=None)
def crd_schema(group: str, kind: str, version: str) -> dict:
    crd = yaml.safe_load(gzip.open(CRD_DIR / CRD_FILES[(group, kind)]))
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            # metadata is checked by the API server's ObjectMeta, not the CRD: name and namespace suffice here.
            schema["properties"]["metadata"] = {"type": "object", "required": ["name"]}
            return _strict(schema)
    raise KeyError(f"{kind} {version} not in {CRD_FILES[(group, kind)]}")


def validate_custom(obj: dict) -> list[str]:
    import jsonschema

    group, version = obj["apiVersion"].split("/")
    validator = jsonschema.Draft7Validator(crd_schema(group, obj["kind"], version))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def validate_core(obj: dict, version: str) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def validate(obj: dict) -> list[str]:
    if is_custom(obj):
        return validate_custom(obj)
    return [f"k8s {v}: {err}" for v in K8S_VERSIONS for err in validate_core(obj, v)]
