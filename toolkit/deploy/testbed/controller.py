"""The testbed's autoscaling loop: every sync period, read the HPA's metrics from Prometheus (the
recorded per-replica series, averaged over the ready replicas, as the HPA averages a Pods metric),
let the HPA algorithm decide, then start replicas or drain them (haproxy stops routing new requests
to it, the in-flight ones finish, then the server stops), and write one timeline row per period."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable

from toolkit.deploy import names as n
from toolkit.deploy.hpa import Autoscaler
from toolkit.deploy.testbed.haproxy import Haproxy, slot
from toolkit.deploy.testbed.prometheus import JOB, Prometheus
from toolkit.deploy.testbed.replicas import Replica, in_flight, stop_replica

ROUTABLE_TIMEOUT_S = 15.0  # haproxy checks every 1 s and needs one pass

# Deployment-wide views for the timeline (not for decisions).
OBSERVED = {"ttft_p95_s": n.TTFT_P95, "itl_mean_s": n.ITL_MEAN}


class Controller:
    def __init__(self, autoscaler: Autoscaler, start: Callable[[int], Replica], haproxy: Haproxy,
                 prometheus: Prometheus, timeline: Path, sync_s: float = 5.0, drain_timeout_s: float = 120.0,
                 log: Callable[[str], None] = print):
        self.autoscaler, self.start, self.haproxy, self.prometheus = autoscaler, start, haproxy, prometheus
        self.timeline, self.sync_s, self.drain_timeout_s, self.log = timeline, sync_s, drain_timeout_s, log
        self.ready: dict[int, Replica] = {}
        self.starting: set[int] = set()  # slots whose server is still loading (a pod not yet ready)
        self.cancelled: set[int] = set()  # starting slots scaled away: stopped as soon as they are up
        self.draining: dict[int, Replica] = {}
        self.drained: list[dict] = []  # per scale-down: requests in flight at drain, seconds to finish
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- replicas -------------------------------------------------------------------------------------
    def _targets(self) -> None:
        with self._lock:
            live = {**self.ready, **self.draining}
            self.prometheus.set_targets({r.name: r.handle.metrics_port for r in live.values()})

    def _reserve_slot(self) -> int:
        with self._lock:
            used = set(self.ready) | set(self.draining) | self.starting
            index = min(i for i in range(len(used) + 1) if i not in used)
            self.starting.add(index)
        return index

    def add_replica(self, index: int | None = None) -> Replica:
        """Start a server in a slot; once haproxy's health check passes, it counts as ready (as a pod's
        endpoint joins the Service only once its readiness probe passes) and Prometheus scrapes it."""
        index = self._reserve_slot() if index is None else index
        replica = None
        try:
            replica = self.start(index)
            self.haproxy.enable(index, replica.handle.http_port)
            # Ready only once routable: counted ready before haproxy's first check passed, a replica took no
            # requests for up to a check interval, and the drain test's streams all went to the other one.
            routable = self.haproxy.wait_up(index, timeout_s=ROUTABLE_TIMEOUT_S)
        except BaseException:
            with self._lock:
                self.starting.discard(index)
                self.cancelled.discard(index)
            if replica is not None:  # started, but haproxy could not be told: no server left behind
                stop_replica(replica)
            raise
        with self._lock:
            self.starting.discard(index)
            cancelled = index in self.cancelled
            self.cancelled.discard(index)
            if not cancelled and routable:
                self.ready[index] = replica
        if not routable:  # never healthy: it took no request
            self.haproxy.disable(index)
            stop_replica(replica)
            if cancelled:
                return replica
            raise RuntimeError(f"haproxy's health check on replica {replica.name} did not pass in "
                               f"{ROUTABLE_TIMEOUT_S:.0f} s (see its server log under {replica.state_file.parent})")
        if cancelled:  # scaled down while it became routable: it may hold requests already, so it drains
            with self._lock:
                self.draining[index] = replica
            self._targets()
            self._begin_drain(index, replica)
            return replica
        self._targets()
        return replica

    def _add_logged(self, index: int) -> None:
        try:
            self.add_replica(index)
        except Exception as exc:  # a pod that never got ready: the next periods decide again
            self.log(f"replica r{index} did not start: {exc}")

    def _add_in_background(self) -> None:
        """Like a pod, a replica loads while the loop goes on (on 2 busy cores that takes a while)."""
        thread = threading.Thread(target=self._add_logged, args=(self._reserve_slot(),), daemon=True)
        thread.start()
        self._threads.append(thread)

    def remove_replica(self) -> None:
        """A replica still loading goes first (as a ReplicaSet deletes unready pods first), else the newest."""
        with self._lock:
            loading = sorted(self.starting - self.cancelled)
            if loading:
                self.cancelled.add(loading[-1])
                return
            index = max(self.ready, key=lambda i: self.ready[i].started)  # the newest goes first
            replica = self.draining[index] = self.ready.pop(index)
        self._begin_drain(index, replica)

    def _begin_drain(self, index: int, replica: Replica) -> None:
        # What is in flight as the drain begins, read before it does (not in the drain's thread after haproxy's
        # command: short streams on the faster CPU engine had ended by then, recording a drain of nothing).
        # First the streams open through haproxy to it, an instant read: the engine's gauges are refreshed by its
        # metrics thread, which a starved replica can leave a second or more behind; an open stream is in flight
        # whatever they say. Read after the scrape below, they had ended on loaded cores.
        sessions = self.haproxy.stats().get(slot(index), {}).get("scur", 0)
        # Then the engine's own count. A replica busy with those streams can be slow to answer a scrape on two shared
        # cores, hence the long timeout (a scrape that still times out is recorded as None: unknown).
        at_drain = in_flight(replica, timeout_s=15.0)
        began = time.perf_counter()
        self.haproxy.drain(index)
        thread = threading.Thread(target=self._drain, args=(index, replica, at_drain, sessions, began), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _drain(self, index: int, replica: Replica, at_drain: float | None, sessions_at_drain: int, began: float) -> None:
        deadline = began + self.drain_timeout_s
        while time.perf_counter() < deadline:
            sessions = self.haproxy.stats().get(slot(index), {}).get("scur", 0)
            if sessions == 0 and in_flight(replica) == 0:
                break
            time.sleep(0.2)
        idle = time.perf_counter()
        self.haproxy.disable(index)
        stop_replica(replica)
        with self._lock:
            self.draining.pop(index, None)
            self.drained.append({"replica": replica.name, "in_flight_at_drain": at_drain,
                                 "sessions_at_drain": sessions_at_drain,
                                 "drain_s": idle - began, "stop_s": time.perf_counter() - idle})
        self._targets()

    # -- the loop ----------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Each target series averaged over the ready replicas (what the HPA computes for a Pods metric)."""
        with self._lock:
            pods = "|".join(r.name for r in self.ready.values())
        out = {}
        for series in self.autoscaler.targets:
            result = self.prometheus.query(f'avg({series}{{job="{JOB}",pod=~"{pods}"}})')
            if result:
                out[series] = result[0][1]
        return out

    def observe(self) -> dict:
        row = {}
        for key, series in OBSERVED.items():
            result = self.prometheus.query(series)
            row[key] = result[0][1] if result else None
        per_pod = self.prometheus.query(f'{n.KV_OCCUPANCY}{{job="{JOB}"}}')
        row["kv_occupancy_by_replica"] = {m.get("pod"): v for m, v in per_pod}
        waiting = self.prometheus.query(f'sum({n.WAITING}{{job="{JOB}"}})')
        row["waiting_total"] = waiting[0][1] if waiting else None
        return row

    def step(self) -> dict:
        now = time.perf_counter()
        metrics = self.metrics()
        with self._lock:
            ready, current = len(self.ready), len(self.ready) + len(self.starting - self.cancelled)
        decision = self.autoscaler.decide(now, current, metrics, ready)
        if decision.replicas != current:
            self.log(f"scale {current} → {decision.replicas}: {decision.reason}")
        for _ in range(decision.replicas - current):
            self._add_in_background()
        for _ in range(current - decision.replicas):
            self.remove_replica()
        row = {"t": now, "current": current, "replicas": len(self.ready), "starting": len(self.starting - self.cancelled),
               "draining": len(self.draining),
               "metrics": metrics,
               "raw_desired": decision.raw, "desired": decision.replicas, **self.observe()}
        with self.timeline.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def run(self) -> None:
        while not self._stop.wait(self.sync_s):
            try:
                self.step()
            except Exception as exc:  # a failed period is logged and retried next period, like the HPA
                self.log(f"controller: {exc}")

    def wait_for(self, replicas: int, timeout_s: float) -> bool:
        """Until exactly `replicas` serve and nothing starts or drains (or the timeout)."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            with self._lock:
                if len(self.ready) == replicas and not self.starting and not self.draining:
                    return True
            time.sleep(0.5)
        return False

    def start_loop(self) -> None:
        self._loop = threading.Thread(target=self.run, daemon=True)
        self._loop.start()

    def stop(self) -> None:
        self._stop.set()
        if getattr(self, "_loop", None):
            self._loop.join(60)
        for thread in self._threads:
            thread.join(self.drain_timeout_s + 30)
        with self._lock:
            left = list(self.ready.values()) + list(self.draining.values())
            self.ready.clear()
            self.draining.clear()
        for replica in left:
            stop_replica(replica)
