"""`toolkit deploy k8s`: a kustomize folder of plain YAML, one file per object, from the typed config
(and the plan, for GPU targets and the disaggregated split). Checked before anything is written;
written to a temporary folder first, so a failure leaves no partial output."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import yaml

from toolkit.config import DeploymentConfig
from toolkit.deploy import autoscale, dynamo, monitoring, objects
from toolkit.deploy.lint import lint
from toolkit.deploy.rules import rule_file
from toolkit.errors import ToolkitError
from toolkit.targets import target_of

RULE_FILE = "prometheus/rules.yaml"  # the bare rule file: promtool, the local testbed's Prometheus
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_inputs(config: DeploymentConfig, autoscaler: str, disaggregated: bool) -> None:
    d = config.deploy
    if not DNS_LABEL.match(config.name) or len(config.name) > 50:
        raise ToolkitError(f"config name {config.name!r} is not a Kubernetes name (lower-case letters, digits, '-')",
                           "rename the config, e.g. --set name=llama3-8b")
    if d.artifacts is None:
        raise ToolkitError("deploy.artifacts is not set: the pods need to know where the engine and repository are",
                           "set deploy.artifacts.kind to pvc (with claim) or init-container (with image)")
    if autoscaler not in ("hpa", "keda"):
        raise ToolkitError(f"unknown autoscaler {autoscaler!r}", "use --autoscaler hpa or --autoscaler keda")
    world = config.parallel.world_size
    if objects.is_multi_node(config) and world % d.gpus_per_node:
        raise ToolkitError(f"TP × PP = {world} GPUs does not fill whole nodes of {d.gpus_per_node} GPUs",
                           f"make TP × PP a multiple of deploy.gpus_per_node, or at most {d.gpus_per_node}")
    if target_of(config).on_gpu:
        from toolkit.plan.gpus import gpu_spec

        gpu_spec(config.plan.gpu)  # a GPU the catalog lacks fails here, with the catalog's own message
    if disaggregated and not target_of(config).disaggregates:
        raise ToolkitError(f"--disaggregated needs engine.target llmapi (Dynamo's TensorRT-LLM workers run the "
                           f"LLM API), not {config.engine.target}", "set engine.target: llmapi")


def build_objects(config: DeploymentConfig, autoscaler: str = "hpa", split=None) -> list[dict]:
    """Every object of the folder, in apply order."""
    hpa = autoscale.hpa_name(config, autoscaler)
    out = [objects.scripts_config_map(config)]
    if objects.is_multi_node(config):
        out += objects.rbac(config) + [objects.leader_worker_set(config)]
    else:
        out.append(objects.deployment(config))
    out += [objects.service(config), objects.pod_disruption_budget(config),
            monitoring.pod_monitor(config), monitoring.prometheus_rule(config, hpa)]
    if autoscaler == "keda":
        out.append(autoscale.scaled_object(config))
    else:
        out += [monitoring.adapter_config_map(config), autoscale.hpa(config)]
    if split is not None:
        out.append(dynamo.graph_deployment(config, split))
    return out


def file_name(obj: dict) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def plan_split(config: DeploymentConfig, requests_per_s: float, ttft_ms: float, itl_ms: float):
    from toolkit import pipeline
    from toolkit.config import ArtifactLayout
    from toolkit.plan.disagg import split
    from toolkit.plan.gpus import gpu_spec
    from toolkit.plan.stage import make_plan

    spec = pipeline.model_spec_for(config, ArtifactLayout(config))
    plan = make_plan(spec, gpu_spec(config.plan.gpu), pipeline.deployment_for_plan(config))
    return split(plan, requests_per_s, ttft_ms / 1000, itl_ms / 1000)


def write_folder(objs: list[dict], config: DeploymentConfig, autoscaler: str, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    except OSError as exc:
        raise ToolkitError(f"cannot write to {out_dir}: {exc.strerror}", "pass a writable --out") from None
    try:
        names = []
        for obj in objs:
            names.append(file_name(obj))
            (staging / names[-1]).write_text(yaml.safe_dump(obj, sort_keys=False))
        kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                         "namespace": config.deploy.namespace, "resources": names}
        (staging / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        (staging / RULE_FILE).parent.mkdir()
        (staging / RULE_FILE).write_text(yaml.safe_dump(rule_file(config, autoscale.hpa_name(config, autoscaler)),
                                                        sort_keys=False))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [out_dir / name for name in ["kustomization.yaml", *names, RULE_FILE]]


def deploy_k8s(config: DeploymentConfig, out_dir: Path, autoscaler: str = "hpa", disaggregated: bool = False,
               requests_per_s: float | None = None, ttft_ms: float | None = None, itl_ms: float | None = None):
    """Check, build, lint, then write. Returns (written files, the disaggregated split or None)."""
    check_inputs(config, autoscaler, disaggregated)
    split = None
    if disaggregated:
        ttft_ms = ttft_ms or config.sweep.slo_ttft_ms
        itl_ms = itl_ms or config.sweep.slo_itl_ms
        if not (requests_per_s and ttft_ms and itl_ms):
            raise ToolkitError("--disaggregated sizes the phases for a target load and its objectives",
                               "pass --rate R and --slo ttft=500ms,itl=50ms")
        split = plan_split(config, requests_per_s, ttft_ms, itl_ms)
    objs = build_objects(config, autoscaler, split)
    findings = lint(objs, objects.gpus_per_pod(config))
    if findings:  # a bug of ours, not the user's: say so rather than write a broken folder
        raise ToolkitError(f"generated manifests fail their own check: {findings[0]}", "report this as a toolkit bug")
    return write_folder(objs, config, autoscaler, out_dir), split
