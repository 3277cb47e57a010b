"""What runs inside a cluster pod: the Triton command line and the small scripts beside it. Pure strings.

The command line is the one `toolkit serve` uses (toolkit/serve/server.py: one MPI rank per GPU when
TP × PP > 1, each wrapped in `trtllm-llmapi-launch` for the LLM-API target), bound to all interfaces on
Triton's standard ports, logging to stdout where the cluster collects it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from toolkit.config import ArtifactLayout, DeploymentConfig
from toolkit.deploy import names as n
from toolkit.targets import target_of

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# Paths Triton's HTTP endpoint answers without a model name; probes must use one of these.
TRITON_HEALTH_PATHS = ("/v2/health/ready", "/v2/health/live")
SCRIPTS_DIR = "/opt/deploy"
EXIT_TIMEOUT_S = 30  # the `--exit-timeout-secs` of tritonserver_command


def pod_layout(config: DeploymentConfig) -> ArtifactLayout:
    """Where the stages' artifacts lie inside a pod: the same layout, rooted at the artifacts' path."""
    return ArtifactLayout(config, Path(config.deploy.artifacts.path if config.deploy.artifacts else "/work"))


def repo_path(config: DeploymentConfig) -> str:
    return str(pod_layout(config).repo_dir)


def _rank_commands(config: DeploymentConfig) -> list[str]:
    from toolkit.serve.install import TritonInstall
    from toolkit.serve.server import tritonserver_command

    install = TritonInstall(binary=Path("tritonserver"))
    cmd = tritonserver_command(install, Path(repo_path(config)), "0.0.0.0", PORTS, Path("-"),
                               config.parallel.world_size, target_of(config).rank_launcher)
    # In a pod Triton logs to stdout, where the cluster collects it.
    return [arg for arg in cmd if not arg.startswith("--log-file=")]


def server_command(config: DeploymentConfig, hosts: str | None = None) -> str:
    """The shell command of the serving container (rank 0). `hosts`: an mpirun --host list (multi-node)."""
    cmd = _rank_commands(config)
    if hosts and cmd[0] == "mpirun":
        cmd = cmd[:2] + ["--host", "$HOSTS", "-mca", "plm_rsh_agent", f"{SCRIPTS_DIR}/kubessh"] + cmd[2:]
    text = shlex.join(cmd)
    return text.replace("'$HOSTS'", '"$HOSTS"')


# A request is in flight while the engine holds it, admitted to the batch (`active`) or queued for admission
# (`waiting`), under TensorRT-LLM's backend metric names, which the CPU engine exports too; or while it waits in
# Triton's queue for a model of the ensemble (`nv_inference_pending_request_count`): on a busy replica, requests
# queue for the tokenizer before the engine sees them (the drain test saw 5 there and 1 in the engine). Not
# `active` alone: a request between one finishing and its own admission reads 0 there.
IN_FLIGHT_METRIC = (rf'^(?:{n.REQUESTS}\{{[^}}]*{n.REQUEST_LABEL}="(?:active|waiting)"[^}}]*\}}'
                    rf'|{n.PENDING}\{{[^}}]*\}}) ([0-9.eE+-]+)$')


def drain_script(metrics_port: int = PORTS["metrics"], endpoint_settle_s: float = 5, scrape_timeout_s: float = 2) -> str:
    """preStop: the pod is already leaving the Service's endpoints (given `endpoint_settle_s` to take
    effect); wait until no request is in flight (the engine's active and waiting gauges and Triton's
    pending request counts read 0), then let SIGTERM stop Triton. A scrape that times out is a busy
    server, not a gone one: only a refused connection ends the wait early."""
    return f"""#!/usr/bin/env python3
# preStop drain: give the endpoint controller time to stop routing here, then wait for in-flight streams.
import re, sys, time, urllib.request
time.sleep({endpoint_settle_s:g})
deadline = time.time() + float(sys.argv[1]) if len(sys.argv) > 1 else time.time() + 120
in_flight = re.compile({IN_FLIGHT_METRIC!r}, re.M)
why = "the deadline passed with requests still in flight"
while time.time() < deadline:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:{metrics_port}/metrics", timeout={scrape_timeout_s:g}).read().decode()
    except OSError as exc:  # urllib's URLError (its reason inside) or a read that timed out
        if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
            why = "the server no longer answers"
            break
        time.sleep(1)  # timed out or reset: a busy server; ask again
        continue
    values = [float(v) for v in in_flight.findall(text)]
    if not values or sum(values) == 0:
        why = "no request in flight" if values else "no in-flight metric exported"
        break
    time.sleep(1)
print(f"preStop drain: {{why}}", file=sys.stderr)
"""


def leader_script(config: DeploymentConfig, group_size: int) -> str:
    """Multi-node leader: wait until every pod of its LeaderWorkerSet group runs, then start MPI across them."""
    slots = config.deploy.gpus_per_node
    return f"""#!/bin/sh
# Leader of a LeaderWorkerSet group: the workers idle until mpirun reaches them through kubessh.
set -eu
want={group_size}
while :; do
  pods=$(kubectl get pods -l "leaderworkerset.sigs.k8s.io/group-key=$GROUP_KEY" \\
         --field-selector status.phase=Running -o jsonpath='{{.items[*].metadata.name}}')
  n=$(echo $pods | wc -w)
  [ "$n" -ge "$want" ] && break
  echo "waiting for the group's pods: $n of $want running"; sleep 5
done
HOSTS=$(for p in $pods; do printf '%s:{slots},' "$p"; done | sed 's/,$//')
export HOSTS
exec {server_command(config, hosts="$HOSTS")}
"""


KUBESSH = """#!/bin/sh
# mpirun's remote shell: run the rank's command inside the named pod of the group.
pod="$1"; shift
exec kubectl exec "$pod" -- /bin/sh -c "$*"
"""
