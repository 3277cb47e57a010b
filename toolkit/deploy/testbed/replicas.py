"""Replicas of the CPU deployment: each a real Triton server (toolkit serve's start/stop) with its own
name, ports, log and state file."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from toolkit.config import ArtifactLayout, DeploymentConfig
from toolkit.deploy.launch import IN_FLIGHT_METRIC
from toolkit.serve.server import ServerHandle, start_server, stop_server

_IN_FLIGHT = re.compile(IN_FLIGHT_METRIC, re.M)  # queued in Triton or the engine, or generating (launch.py)


@dataclass
class Replica:
    index: int
    name: str
    handle: ServerHandle
    state_file: Path
    started: float


def start_replica(config: DeploymentConfig, layout: ArtifactLayout, index: int, work_dir: Path) -> Replica:
    name = f"{config.name}-r{index}"
    state_file = work_dir / "replicas" / f"{name}.json"
    handle = start_server(config.model_copy(update={"name": name}), layout.repo_dir, work_dir, state_file)
    return Replica(index, name, handle, state_file, time.perf_counter())


def stop_replica(replica: Replica) -> None:
    stop_server(replica.state_file)


def in_flight(replica: Replica, timeout_s: float = 2.0) -> float | None:
    """Requests the replica holds (queued in Triton or the engine, or generating, as the preStop drain counts
    them); 0 when the server no longer answers, None when it answers too slowly to tell (a busy replica)."""
    try:
        text = requests.get(replica.handle.metrics_url, timeout=timeout_s).text
    except requests.ConnectionError as exc:
        return None if isinstance(exc, requests.Timeout) else 0.0  # a connect timeout is both
    except requests.RequestException:  # timed out, or cut off mid-answer: ask again
        return None
    return sum(float(v) for v in _IN_FLIGHT.findall(text))
