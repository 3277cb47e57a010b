"""The Kubernetes HorizontalPodAutoscaler's algorithm (autoscaling/v2), pure, for the local testbed.

It stands in for the cluster's HPA, not for a cluster: the emitted HPA / ScaledObject is what users
deploy. As the HPA controller does (pkg/controller/podautoscaler in kubernetes/kubernetes):
  desired = ceil(current × metric / target) per metric, unchanged within the tolerance (0.1);
  the largest desire over the metrics wins;
  stabilization: up to the lowest, down to the highest raw recommendation within each window;
  rate policies: the most permissive (selectPolicy Max) of Pods / Percent changes per period,
  counted from the replicas at the period's start; then min/max replicas.
Time is passed in, so a test can walk it through the documented examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from toolkit.deploy.autoscale import parse_quantity

TOLERANCE = 0.1


def desired_for_metric(current: int, value: float, target: float, tolerance: float = TOLERANCE,
                       ready: int | None = None) -> int:
    """ceil(ready × value / target), or `current` when value/target is within the tolerance of 1.
    `ready`: pods that reported the metric (the HPA averages a Pods metric over them); default: current."""
    ratio = value / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    return math.ceil(ratio * (current if ready is None else ready))


@dataclass(frozen=True)
class Policy:
    kind: str  # Pods | Percent
    value: int
    period_s: float


@dataclass(frozen=True)
class Rules:
    window_s: float
    policies: tuple[Policy, ...] = ()
    select: str = "Max"  # Max | Min | Disabled


# The HPA's documented defaults.
DEFAULT_UP = Rules(0, (Policy("Pods", 4, 15), Policy("Percent", 100, 15)))
DEFAULT_DOWN = Rules(300, (Policy("Percent", 100, 15),))


def rules_from_behavior(side: dict | None, default: Rules) -> Rules:
    if not side:
        return default
    policies = tuple(Policy(p["type"], p["value"], p["periodSeconds"]) for p in side.get("policies", [])) \
        or default.policies
    return Rules(side.get("stabilizationWindowSeconds", default.window_s), policies, side.get("selectPolicy", "Max"))


@dataclass
class Decision:
    replicas: int
    raw: int  # before stabilization and policies
    reason: str


@dataclass
class Autoscaler:
    min_replicas: int
    max_replicas: int
    targets: dict[str, float]  # metric → per-pod target (AverageValue)
    up: Rules = DEFAULT_UP
    down: Rules = DEFAULT_DOWN
    tolerance: float = TOLERANCE
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, replica change)

    @classmethod
    def from_hpa(cls, hpa: dict, series_of: dict[str, str]) -> "Autoscaler":
        """From an emitted autoscaling/v2 HPA; `series_of` maps its metric names to the recorded series."""
        spec = hpa["spec"]
        targets = {series_of[m["pods"]["metric"]["name"]]: parse_quantity(m["pods"]["target"]["averageValue"])
                   for m in spec["metrics"]}
        behavior = spec.get("behavior", {})
        return cls(spec.get("minReplicas", 1), spec["maxReplicas"], targets,
                   rules_from_behavior(behavior.get("scaleUp"), DEFAULT_UP),
                   rules_from_behavior(behavior.get("scaleDown"), DEFAULT_DOWN))

    def raw_desired(self, current: int, metrics: dict[str, float], ready: int | None = None) -> tuple[int, str]:
        best, why = None, "no metric"
        for name, target in self.targets.items():
            if name not in metrics:  # a missing metric does not vote (the HPA scales on those it has)
                continue
            want = desired_for_metric(current, metrics[name], target, self.tolerance, ready)
            if best is None or want > best:
                best, why = want, f"{name}={metrics[name]:.3g} (target {target:g})"
        return (current if best is None else best), why

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_floor, down_ceiling = desired, desired
        for t, rec in self.recommendations:
            if t > now - self.up.window_s:
                up_floor = min(up_floor, rec)
            if t > now - self.down.window_s:
                down_ceiling = max(down_ceiling, rec)
        keep = max(self.up.window_s, self.down.window_s)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > now - keep] + [(now, desired)]
        return min(max(current, up_floor), down_ceiling)

    def _changed_within(self, now: float, period_s: float, sign: int) -> int:
        return sum(c for t, c in self.events if t > now - period_s and c * sign > 0)

    def _limit(self, now: float, current: int, rules: Rules, sign: int) -> int:
        """The furthest the replicas may move this period in direction `sign` (+1 up, −1 down)."""
        if rules.select == "Disabled":
            return current
        limits = []
        for p in rules.policies:
            start = current - self._changed_within(now, p.period_s, sign)
            if p.kind == "Pods":
                limits.append(start + sign * p.value)
            elif sign > 0:
                limits.append(math.ceil(start * (1 + p.value / 100)))
            else:
                limits.append(int(start * (1 - p.value / 100)))
        if not limits:
            return self.max_replicas if sign > 0 else self.min_replicas
        pick = max if (rules.select == "Max") == (sign > 0) else min
        return pick(limits)

    def decide(self, now: float, current: int, metrics: dict[str, float], ready: int | None = None) -> Decision:
        """`current`: the replicas asked for (starting ones included); `ready`: those the metrics average over."""
        raw, why = self.raw_desired(current, metrics, ready)
        raw = min(max(raw, self.min_replicas), self.max_replicas)
        wanted = self._stabilize(now, current, raw)
        if wanted > current:
            wanted = min(wanted, self._limit(now, current, self.up, +1), self.max_replicas)
        elif wanted < current:
            wanted = max(wanted, self._limit(now, current, self.down, -1), self.min_replicas)
        if wanted != current:
            self.events = [(t, c) for t, c in self.events if t > now - 1800] + [(now, wanted - current)]
        return Decision(wanted, raw, why)
