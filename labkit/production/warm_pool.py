"""A warm pool for chapter 08's vLLM deployment, the Kubernetes way: placeholder pods that hold GPU
nodes at a negative priority (``deploy/k8s/optional/warm-pool.yaml``).

Chapter 08 compares the manifest's autoscaler with and without a warm pool of one replica. Its fleet
simulation (:mod:`labkit.production.fleet`) keeps a *started* replica aside that joins in seconds.
Kubernetes has no such object; the usual pattern is capacity, not a started server:

* a ``PriorityClass`` with a negative value (below every pod's default 0) that never preempts;
* a ``Deployment`` of placeholder pods at that priority, each asking for what one vLLM replica asks
  for (one GPU, its CPU and memory) on the same GPU type. When the HPA adds a replica and no node has
  room, the scheduler preempts a placeholder instead of waiting for the cluster autoscaler to add a
  node; the evicted placeholder goes pending and asks the autoscaler for a node in turn, so the
  pool refills behind the fleet.

The placeholder runs the vLLM image itself (``sleep``), so the image is already on the node. What it
saves from chapter 08's itemized cold start is therefore the node and the image pull; the replica
still loads its weights and starts its engine. That is less than the simulation's warm replica, which
skips those too. Nothing here was run on a cluster.
"""

from __future__ import annotations

from typing import Any

from .k8s import NAMESPACE, labels

PLACEHOLDER_PRIORITY = -10  # below the default 0 of every pod without a PriorityClass


def pool_name(name: str) -> str:
    """The placeholder Deployment of server ``name`` (its pods are named after it)."""
    return f"{name}-warm-pool"


def warm_pool_objects(name: str, server: dict[str, Any], replicas: int = 1,
                      namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """[PriorityClass, placeholder Deployment] reserving ``replicas`` GPU nodes for the vLLM
    ``server`` Deployment: the same image, resource requests, GPU affinity and tolerations."""
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas must be a whole number >= 1, got {replicas!r}")
    pod = server["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    pool = pool_name(name)
    pool_labels = {"app.kubernetes.io/name": "vllm-placeholder", "app.kubernetes.io/instance": name}
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": pool, "labels": labels(name)},
                "value": PLACEHOLDER_PRIORITY, "globalDefault": False, "preemptionPolicy": "Never",
                "description": f"placeholders holding GPU nodes for {name}: preempted by any real pod"}
    container = {"name": "placeholder", "image": vllm["image"], "command": ["sleep", "infinity"],
                 "resources": {"requests": dict(vllm["resources"]["requests"]),
                               "limits": dict(vllm["resources"]["limits"])},
                 "securityContext": vllm["securityContext"]}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": pool, "namespace": namespace, "labels": pool_labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": pool_labels},
                 "template": {"metadata": {"labels": pool_labels}, "spec": {
                     "priorityClassName": pool,
                     "terminationGracePeriodSeconds": 0,  # a preempted placeholder frees its GPU at once
                     "affinity": pod["affinity"], "tolerations": pod["tolerations"],
                     # one placeholder per node, away from the servers' nodes where it can be
                     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                    "whenUnsatisfiable": "ScheduleAnyway",
                                                    "labelSelector": {"matchLabels": pool_labels}}],
                     "automountServiceAccountToken": False, "securityContext": pod["securityContext"],
                     "containers": [container]}}},
    }
    return [priority, deployment]
