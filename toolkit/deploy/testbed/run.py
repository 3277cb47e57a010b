"""`toolkit deploy testbed`: the autoscaling loop on this machine with real parts.

Builds the CPU deployment, emits its cluster folder (`toolkit deploy k8s`), then runs haproxy,
Prometheus with that folder's rule file, the first replicas, and the controller holding the folder's
HPA; sweeps a rate ramp (low → high → low) through haproxy, and writes the timeline, the request
records, a plot and a summary. What one 2-core machine can show: the control loop (metric → decision
→ replicas started and drained without losing a request), not more capacity — every replica shares
the same two cores.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import yaml

from toolkit import pipeline
from toolkit.bench.sweep import Target
from toolkit.config import ArtifactLayout, DeploymentConfig, validate_config
from toolkit.deploy import names as n
from toolkit.deploy.hpa import Autoscaler
from toolkit.deploy.stage import RULE_FILE, deploy_k8s, file_name
from toolkit.deploy.testbed.analysis import ramp_steps, read_timeline, request_outcomes, scaling_events
from toolkit.deploy.testbed.controller import Controller
from toolkit.deploy.testbed.haproxy import Haproxy
from toolkit.deploy.testbed.plot import plot_timeline
from toolkit.deploy.testbed.prometheus import Prometheus
from toolkit.deploy.testbed.replicas import start_replica
from toolkit.errors import ToolkitError
from toolkit.serve.server import free_port
from toolkit.targets import target_of


def testbed_config(config: DeploymentConfig, rates: list[float], step_s: float) -> DeploymentConfig:
    """The sweep of the ramp: rate mode, one step per rate, streamed over Triton's HTTP endpoint."""
    if target_of(config).on_gpu:
        raise ToolkitError("the testbed runs replicas of the CPU deployment", "use a cpu config, e.g. configs/cpu-tiny.yaml")
    raw = config.model_dump()
    raw["sweep"].update(mode="rate", request_rates=list(rates), duration_s=step_s, requests_per_step=None,
                        endpoint="triton-http", step_warmup_requests=0)
    if raw["deploy"]["artifacts"] is None:  # the emitted folder needs one; the testbed reads the local build
        raw["deploy"]["artifacts"] = {"kind": "pvc", "claim": "testbed"}
    return validate_config(raw)


def emitted_folder(config: DeploymentConfig, out: Path) -> tuple[Path, dict]:
    """`toolkit deploy k8s` for this config: (its rule file, its HPA object)."""
    deploy_k8s(config, out / "k8s", "hpa")
    hpa = out / "k8s" / file_name({"kind": "HorizontalPodAutoscaler", "metadata": {"name": config.name}})
    return out / "k8s" / RULE_FILE, yaml.safe_load(hpa.read_text())


def run_testbed(config: DeploymentConfig, rates: list[float], step_s: float, out_root: Path, sync_s: float = 5.0,
                progress=print) -> Path:
    config = testbed_config(config, rates, step_s)
    out = Path(out_root).resolve() / f"{datetime.now():%Y%m%d-%H%M%S}-{config.name}"
    out.mkdir(parents=True)
    layout = ArtifactLayout(config)
    progress(f"[1/5] build      {pipeline.ensure_model(config, layout)}")
    pipeline.quantize(config, layout)
    pipeline.build(config, layout)
    pipeline.repo(config, layout)
    rules, hpa = emitted_folder(config, out)
    autoscaler = Autoscaler.from_hpa(hpa, {v: k for k, v in n.ADAPTER_METRICS.items()})
    progress(f"[2/5] k8s folder {out / 'k8s'} (rules: {rules.name}, HPA {hpa['spec']['minReplicas']}–"
             f"{hpa['spec']['maxReplicas']} replicas, targets {autoscaler.targets})")
    haproxy = Haproxy(out, free_port(), slots=2 * config.deploy.max_replicas)
    work = out / "servers"
    start = lambda index: start_replica(config, layout, index, work)  # noqa: E731
    prometheus = controller = None
    try:
        prometheus = Prometheus(out, rules, free_port(), interval_s=min(2.0, sync_s))
        controller = Controller(autoscaler, start, haproxy, prometheus, out / "timeline.jsonl", sync_s,
                                config.deploy.drain_timeout_s, log=lambda line: progress(f"      {line}"))
        for _ in range(config.deploy.min_replicas):
            controller.add_replica()
        _wait_routable(haproxy, config.deploy.min_replicas)
        progress(f"[3/5] testbed    haproxy {haproxy.url} → {config.deploy.min_replicas} replica(s); "
                 f"prometheus {prometheus.url}")
        controller.start_loop()
        target = Target(grpc_url=None, http_url=haproxy.url, ready_url=f"{haproxy.url}/v2/health/ready")
        run_dir = pipeline.sweep(config, layout, target=target, progress=lambda line: progress(f"[4/5] {line}"),
                                 label="testbed")
        # Load is gone: the stabilization window passes and the replicas come back down, one per period.
        d = config.deploy
        settle = d.scale_down_window_s + d.scale_period_s * (d.max_replicas - d.min_replicas) + 5 * sync_s
        progress(f"[5/5] settle     up to {settle:.0f} s with no load, until {d.min_replicas} replica(s) remain")
        controller.wait_for(d.min_replicas, settle)
    finally:
        if controller:
            controller.stop()
        if prometheus:
            prometheus.stop()
        haproxy.stop()
    return summarize(out, run_dir, config, controller)


def _wait_routable(haproxy: Haproxy, replicas: int, timeout_s: float = 30) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if sum(s["status"] == "UP" for s in haproxy.stats().values()) >= replicas:
            return
        time.sleep(0.3)
    raise ToolkitError("haproxy's health checks never saw the replicas ready", f"see {haproxy.config.parent}")


def summarize(out: Path, run_dir: Path, config: DeploymentConfig, controller: Controller) -> Path:
    from toolkit.bench.records import read_jsonl

    timeline = read_timeline(out / "timeline.jsonl")
    records = read_jsonl(run_dir / "records.jsonl")
    steps = ramp_steps(records)
    summary = {"config": config.name, "run": str(run_dir), "rates": config.sweep.request_rates,
               "step_s": config.sweep.duration_s, "targets": {k: v for k, v in controller.autoscaler.targets.items()},
               "min_replicas": config.deploy.min_replicas, "max_replicas": config.deploy.max_replicas,
               "scale_down_window_s": config.deploy.scale_down_window_s,
               "max_ready_replicas": max(row["replicas"] for row in timeline),
               "events": scaling_events(timeline), "drains": controller.drained, **request_outcomes(records)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_timeline(timeline, records, config.deploy.kv_occupancy_target, out / "timeline.png", steps=steps)
    return out
