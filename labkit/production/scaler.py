"""The autoscaler chapter 08's fleet simulation runs (:class:`ScalerConfig`): what it reads, how often,
its targets, and what a real HPA adds (tolerance, scrape lag, scale-up/down policies, grace period).
:mod:`labkit.production.fleet` runs it. Times in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import k8s


@dataclass
class ScalerConfig:
    """The autoscaler: replicas in [``min_replicas``, ``max_replicas``] (from 0, a queued request
    starts the first, as KEDA's activation does); ``signal`` ``"waiting"`` or ``"running"`` and its
    ``target`` per replica, read every ``interval_s`` s; ``cold_start_s``, ``warm_pool`` (replicas),
    ``warm_start_s`` and ``scale_down_delay_s`` in seconds, as the module docstring describes.

    What a real HPA adds (all off by default; :meth:`manifest` turns them on as deploy/k8s says):
    ``second`` = (signal, target), a second metric (replicas = the larger wish); ``tolerance``, no
    change while every metric is within that fraction of its target (Kubernetes: 0.10);
    ``scrape_s``, the metric is sampled every ``scrape_s`` s and the scaler reads the last sample
    (Prometheus' scrape), ``lag_s`` older still (adapter, query); ``up_pods``/``up_percent`` per
    ``up_period_s``: at most that many more replicas (the larger of the two) than ``up_period_s``
    ago; ``down_pods`` per ``down_period_s``: at most that many fewer; ``grace_s``: a replica being
    removed gets that long to finish its requests, then the rest are cut (counted as dropped,
    Kubernetes' terminationGracePeriodSeconds)."""

    min_replicas: int = 1
    max_replicas: int = 20
    signal: str = "waiting"
    target: float = 2.0
    interval_s: float = 30.0
    cold_start_s: float = 120.0
    warm_pool: int = 0
    warm_start_s: float = 5.0
    scale_down_delay_s: float = 300.0
    second: tuple[str, float] | None = None
    tolerance: float = 0.0
    scrape_s: float = 0.0
    lag_s: float = 0.0
    up_pods: int | None = None
    up_percent: float | None = None
    up_period_s: float = 60.0
    down_pods: int | None = None
    down_period_s: float = 60.0
    grace_s: float = math.inf

    def __post_init__(self) -> None:
        for sig in (self.signal, *(self.second[:1] if self.second else ())):
            if sig not in ("waiting", "running"):
                raise ValueError(f"signal={sig!r}: choose 'waiting' (queue depth) or 'running' (busy)")
        if not (0 <= self.min_replicas <= self.max_replicas >= 1 and self.target > 0 and self.interval_s > 0
                and min(self.cold_start_s, self.warm_start_s, self.warm_pool, self.scale_down_delay_s,
                        self.tolerance, self.scrape_s, self.lag_s, self.grace_s) >= 0
                and (self.second is None or self.second[1] > 0)
                and self.up_period_s > 0 and self.down_period_s > 0):
            raise ValueError(f"need 0 <= min_replicas <= max_replicas >= 1, targets and periods > 0, the "
                             f"other fields >= 0; got {self}")

    @classmethod
    def manifest(cls, running_target: float, queue_target: float, min_replicas: int = 2,
                 max_replicas: int = 20, cold_start_s: float = 120.0, **kw: Any) -> ScalerConfig:
        """The autoscaler deploy/k8s describes (:mod:`labkit.production.deploy`): running requests
        with queue depth second, its ``behavior`` (:data:`~labkit.production.k8s.HPA_BEHAVIOR`),
        Kubernetes' 10% tolerance and 15 s sync, a 15 s scrape, at least two replicas (what the
        manifests require, so a drain always leaves one serving), and the pods' drain
        (:data:`~labkit.production.k8s.DRAIN_S`: preStop delay plus vLLM's ``--shutdown-timeout``)."""
        b = k8s.HPA_BEHAVIOR
        up = {p["type"]: p for p in b["scaleUp"]["policies"]}
        (down,) = b["scaleDown"]["policies"]
        return cls(**{**dict(
            min_replicas=min_replicas, max_replicas=max_replicas, signal="running", target=running_target,
            second=("waiting", queue_target), interval_s=k8s.HPA_SYNC_S, cold_start_s=cold_start_s,
            scale_down_delay_s=b["scaleDown"]["stabilizationWindowSeconds"], tolerance=k8s.HPA_TOLERANCE,
            scrape_s=k8s.SCRAPE_S, up_pods=up["Pods"]["value"], up_percent=up["Percent"]["value"],
            up_period_s=up["Pods"]["periodSeconds"], down_pods=down["value"],
            down_period_s=down["periodSeconds"], grace_s=k8s.DRAIN_S), **kw})
