"""Kubernetes objects of one deployment: the serving pods (Deployment, or LeaderWorkerSet across nodes),
Service, PodDisruptionBudget, the scripts ConfigMap and the RBAC multi-node launch needs. Pure dicts."""

from __future__ import annotations

import math

from toolkit.config import DeploymentConfig
from toolkit.deploy import launch
from toolkit.targets import target_of

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
GPU = "nvidia.com/gpu"
STARTUP_PERIOD_S = 10


def labels(config: DeploymentConfig) -> dict:
    return {"app.kubernetes.io/name": "triton-llm", "app.kubernetes.io/instance": config.name,
            "app.kubernetes.io/managed-by": "llm-deploy-toolkit"}


def meta(config: DeploymentConfig, name: str | None = None, **extra) -> dict:
    return {"name": name or config.name, "namespace": config.deploy.namespace, "labels": labels(config), **extra}


def is_multi_node(config: DeploymentConfig) -> bool:
    return config.parallel.world_size > config.deploy.gpus_per_node


def gpus_per_pod(config: DeploymentConfig) -> int:
    if not target_of(config).on_gpu:
        return 0
    return min(config.parallel.world_size, config.deploy.gpus_per_node)


def group_size(config: DeploymentConfig) -> int:
    return math.ceil(config.parallel.world_size / config.deploy.gpus_per_node)


def serving_selector(config: DeploymentConfig) -> dict:
    """Pods that serve: every pod of a Deployment; only the leaders of a LeaderWorkerSet."""
    if is_multi_node(config):
        return {LWS_NAME_LABEL: config.name, "role": "leader"}
    return dict(labels(config))


def _resources(config: DeploymentConfig) -> dict:
    gpus = gpus_per_pod(config)
    if gpus:
        return {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}
    # The CPU engine: what one replica of the embedded default needs (see perf/README.md).
    return {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}


def _probe(path: str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 5}


def artifact_volumes(config: DeploymentConfig) -> tuple[list[dict], list[dict], list[dict]]:
    """(volumes, serving container mounts, init containers) for where engine and repository come from."""
    src = config.deploy.artifacts
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
               {"name": "scripts", "configMap": {"name": f"{config.name}-scripts", "defaultMode": 0o755}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "scripts", "mountPath": launch.SCRIPTS_DIR}]
    inits: list[dict] = []
    if src.kind == "pvc":
        volumes.append({"name": "artifacts", "persistentVolumeClaim": {"claimName": src.claim, "readOnly": True}})
        mounts.append({"name": "artifacts", "mountPath": src.path, "readOnly": True})
    else:
        volumes.append({"name": "artifacts", "emptyDir": {}})
        mounts.append({"name": "artifacts", "mountPath": src.path})
        inits.append({"name": "artifacts", "image": src.image, "command": ["/bin/sh", "-c"],
                      "args": [f"cp -a {src.path}/. /mnt/artifacts/"],
                      "volumeMounts": [{"name": "artifacts", "mountPath": "/mnt/artifacts"}]})
    return volumes, mounts, inits


def server_container(config: DeploymentConfig, command: str) -> dict:
    d = config.deploy
    startup_failures = max(1, math.ceil(config.server.startup_timeout_s / STARTUP_PERIOD_S))
    _, mounts, _ = artifact_volumes(config)
    return {
        "name": "triton", "image": d.image, "command": ["/bin/sh", "-c"], "args": [command],
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in launch.PORTS.items()],
        "resources": _resources(config),
        # Engine load can take minutes: the startup probe holds the others off until the server is ready once.
        "startupProbe": _probe("/v2/health/ready", STARTUP_PERIOD_S, startup_failures),
        "readinessProbe": _probe("/v2/health/ready", 5, 3),
        "livenessProbe": _probe("/v2/health/live", 10, 6),
        "lifecycle": {"preStop": {"exec": {"command": ["python3", f"{launch.SCRIPTS_DIR}/drain.py",
                                                       str(d.drain_timeout_s)]}}},
        "volumeMounts": mounts,
    }


def pod_spec(config: DeploymentConfig, container: dict, service_account: str | None = None) -> dict:
    volumes, _, inits = artifact_volumes(config)
    spec = {"containers": [container], "volumes": volumes,
            # preStop drain, then Triton's own exit timeout for what is still in flight.
            "terminationGracePeriodSeconds": config.deploy.drain_timeout_s + launch.EXIT_TIMEOUT_S}
    if inits:
        spec["initContainers"] = inits
    if config.deploy.node_selector:
        spec["nodeSelector"] = dict(config.deploy.node_selector)
    if service_account:
        spec["serviceAccountName"] = service_account
    return spec


def deployment(config: DeploymentConfig) -> dict:
    """One node: TP × PP GPUs in one pod. replicas is left to the autoscaler (min_replicas at first)."""
    container = server_container(config, launch.server_command(config))
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(config),
            "spec": {"replicas": config.deploy.min_replicas,
                     "selector": {"matchLabels": labels(config)},
                     # Never below the serving count during a rollout: a new pod is ready before an old one drains.
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": {"metadata": {"labels": labels(config)}, "spec": pod_spec(config, container)}}}


def leader_worker_set(config: DeploymentConfig) -> dict:
    """Multi-node: one group per replica; the leader (rank 0) serves, the workers join its MPI world."""
    size = group_size(config)
    sa = f"{config.name}-launcher"
    leader = server_container(config, f"{launch.SCRIPTS_DIR}/leader.sh")
    leader["env"] = [{"name": "GROUP_KEY", "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{LWS_GROUP_KEY_LABEL}']"}}}]
    worker = {key: value for key, value in leader.items()
              if key not in ("startupProbe", "readinessProbe", "livenessProbe", "lifecycle", "env", "ports")}
    worker.update({"name": "worker", "args": ["sleep infinity"]})
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta(config),
            "spec": {"replicas": config.deploy.min_replicas,
                     "startupPolicy": "LeaderReady",
                     "leaderWorkerTemplate": {
                         "size": size,
                         # A group is one MPI world: if any pod fails, restart them all.
                         "restartPolicy": "RecreateGroupOnPodRestart",
                         "leaderTemplate": {"metadata": {"labels": {**labels(config), "role": "leader"}},
                                            "spec": pod_spec(config, leader, sa)},
                         "workerTemplate": {"metadata": {"labels": {**labels(config), "role": "worker"}},
                                            "spec": pod_spec(config, worker, sa)}}}}


def rbac(config: DeploymentConfig) -> list[dict]:
    """The leader lists its group's pods and reaches the workers through `kubectl exec`."""
    name = f"{config.name}-launcher"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(config, name)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(config, name),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(config, name),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": config.deploy.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def scripts_config_map(config: DeploymentConfig) -> dict:
    data = {"drain.py": launch.drain_script()}
    if is_multi_node(config):
        data["leader.sh"] = launch.leader_script(config, group_size(config))
        data["kubessh"] = launch.KUBESSH
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(config, f"{config.name}-scripts"), "data": data}


def service(config: DeploymentConfig) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(config),
            "spec": {"type": "ClusterIP", "selector": serving_selector(config),
                     "ports": [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
                               for name, port in launch.PORTS.items()]}}


def pod_disruption_budget(config: DeploymentConfig) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(config),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": serving_selector(config)}}}


def scale_target(config: DeploymentConfig) -> dict:
    if is_multi_node(config):
        return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": config.name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": config.name}
