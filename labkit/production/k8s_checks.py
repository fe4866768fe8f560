"""What a platform team would refuse in a vLLM deployment, checked on the manifests themselves
(chapter 08, "Production deployment"): :func:`problems` reads the documents of one configuration
(:func:`applied`: the files in the order they are applied) and names each rule they break. Every
committed configuration of ``deploy/k8s`` must give none; ``tests/test_deploy_checks.py`` and
``tests/test_deploy_routing.py`` break each rule once and see it named.

The server's rules: no ``replicas`` in a workload an autoscaler owns (every ``kubectl apply`` would
reset the fleet); a preStop delay, vLLM's ``--shutdown-timeout`` and a grace period longer than both
(or SIGTERM cuts in-flight streams); at least two replicas, spread over nodes, and a disruption
budget that keeps one serving through a drain; the model pinned by commit hash and read offline with
egress closed; every ingress peer of a server's NetworkPolicy pinned to a namespace *and* pods; a
GPU node affinity; no CPU limit on the server; a memory limit above the RAM-backed ``/dev/shm``; an
ephemeral-storage request. :func:`routing_problems`, :func:`canary_problems` and
:func:`warm_pool_problems` hold the rules of the router, the canary rollout and the warm pool.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .k8s_rules import (
    canary_problems,
    flags,
    of_kind,
    routing_problems,
    selects,
    server_container,
    warm_pool_problems,
)

UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(q: str | int) -> float:
    """A Kubernetes memory quantity in bytes: ``"2Gi"`` -> 2147483648."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGT]i?)?", str(q))
    if not m:
        raise ValueError(f"not a memory quantity: {q!r}")
    return float(m[1]) * UNITS[m[2] or ""]


def applied(*files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects a cluster holds after ``kubectl apply`` of ``files`` in order: a later object of
    the same kind, namespace and name replaces the earlier one."""
    held: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in (d for f in files for d in f):
        held[(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])] = doc
    return list(held.values())


def servers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The vLLM Deployments in ``docs`` (pods labelled ``app.kubernetes.io/name: vllm``)."""
    return [d for d in of_kind(docs, "Deployment")
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "vllm"]


def _peers_pinned(docs: list[dict[str, Any]], pod_labels: dict[str, str]) -> list[str]:
    """A peer with only a podSelector admits those pods of the policy's own namespace; with only a
    namespaceSelector, every pod of the namespaces: each peer must name both."""
    out = []
    for n in of_kind(docs, "NetworkPolicy"):
        if not selects(n["spec"]["podSelector"], pod_labels):
            continue
        for rule in n["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "ipBlock" not in peer and not ("namespaceSelector" in peer and "podSelector" in peer):
                    out.append(f"NetworkPolicy {n['metadata']['name']} admits a peer without both a "
                               f"namespaceSelector and a podSelector: {sorted(peer)}")
    return out


def serving_floor(pdb: dict[str, Any], replicas: int) -> int:
    """Replicas a PodDisruptionBudget keeps serving at a fleet of ``replicas``: evictions stop there."""
    spec = pdb["spec"]

    def count(v: int | str, up: bool) -> int:
        if isinstance(v, str) and v.endswith("%"):
            exact = float(v[:-1]) / 100 * replicas
            return math.ceil(exact) if up else math.floor(exact)
        return int(v)

    if "minAvailable" in spec:
        return count(spec["minAvailable"], up=True)  # Kubernetes rounds percentages up
    if "maxUnavailable" in spec:
        return replicas - count(spec["maxUnavailable"], up=True)
    return replicas


def problems(docs: list[dict[str, Any]]) -> list[str]:
    """Every rule (module docstring) the configuration ``docs`` breaks, as sentences."""
    deps = servers(docs)
    if len(deps) != 1:
        return [f"expected one vLLM Deployment, found {len(deps)}"]
    dep = deps[0]
    name, pod = dep["metadata"]["name"], dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    c = server_container(dep)
    f, out = flags(c.get("args", [])), []
    scalers = [d for d in docs if d.get("kind") in ("HorizontalPodAutoscaler", "ScaledObject")
               and d["spec"]["scaleTargetRef"]["name"] == name]
    for owned in [dep, *(r for r in of_kind(docs, "Rollout") if r["metadata"]["name"] == name)]:
        if "replicas" in owned["spec"] and any(s["spec"]["scaleTargetRef"].get("kind", "Deployment")
                                               == owned["kind"] for s in scalers):
            out.append(f"replicas set in a {owned['kind']} an autoscaler owns: every apply resets the fleet")
    lo = min((s["spec"].get("minReplicas", s["spec"].get("minReplicaCount", 1)) for s in scalers),
             default=dep["spec"].get("replicas", 1))
    if lo < 2:
        out.append(f"at least 2 replicas needed to keep one serving through a drain, minimum is {lo}")
    # Shutdown: preStop, then SIGTERM and vLLM's drain, all inside the grace period.
    prestop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    shutdown = int(f.get("--shutdown-timeout") or 0)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if prestop <= 0:
        out.append("no preStop delay: requests keep arriving while endpoints update")
    if shutdown <= 0:
        out.append("no --shutdown-timeout: vLLM aborts every in-flight request on SIGTERM")
    if grace <= prestop + shutdown:
        out.append(f"grace period {grace} s not longer than preStop {prestop} s + shutdown timeout "
                   f"{shutdown} s: the kubelet kills the drain")
    pdbs = [d for d in docs
            if d.get("kind") == "PodDisruptionBudget" and selects(d["spec"]["selector"], pod_labels)]
    if not pdbs:
        out.append("no PodDisruptionBudget selects the pods")
    for pdb in pdbs:
        if serving_floor(pdb, lo) < 1:
            out.append(f"PodDisruptionBudget {pdb['metadata']['name']} lets a drain evict every replica "
                       f"at {lo} replicas")
    if not any(t.get("whenUnsatisfiable") == "DoNotSchedule" and t["topologyKey"] == "kubernetes.io/hostname"
               for t in pod.get("topologySpreadConstraints", [])):
        out.append("no topologySpreadConstraints over nodes: one node's loss can take every replica")
    if not re.fullmatch(r"[0-9a-f]{40}", f.get("--revision", "")):
        out.append(f"model revision not pinned to a commit hash: --revision {f.get('--revision')!r}")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if env.get("HF_HUB_OFFLINE") != "1":
        out.append("HF_HUB_OFFLINE is not 1: a start may fetch other files from the Hub")
    nets = [d for d in docs
            if d.get("kind") == "NetworkPolicy" and selects(d["spec"]["podSelector"], pod_labels)]
    if not any("Egress" in n["spec"].get("policyTypes", []) and not n["spec"].get("egress") for n in nets):
        out.append("egress not closed: no NetworkPolicy denies the server's outbound traffic")
    out += _peers_pinned(docs, pod_labels)
    aff = pod.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not (pod.get("nodeSelector") or aff):
        out.append("no nodeSelector or node affinity for the GPU type")
    res = c.get("resources", {})
    if "cpu" in res.get("limits", {}):
        out.append("CPU limit on the server: the API server and tokenizer get throttled")
    if "ephemeral-storage" not in res.get("requests", {}):
        out.append("no ephemeral-storage request")
    shm = [v for v in pod.get("volumes", []) if v.get("emptyDir", {}).get("medium") == "Memory"]
    mem = quantity_bytes(res.get("limits", {}).get("memory", "0"))
    for v in shm:
        if "sizeLimit" not in v["emptyDir"] or quantity_bytes(v["emptyDir"]["sizeLimit"]) >= mem:
            out.append(f"memory limit does not hold the RAM-backed volume {v['name']} (its size counts)")
    return out + routing_problems(docs, dep) + canary_problems(docs, dep) + warm_pool_problems(docs, dep)
