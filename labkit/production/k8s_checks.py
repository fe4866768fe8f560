"""What a platform team would refuse in a vLLM deployment, checked on the manifests themselves
(chapter 08, "Production deployment"): :func:`problems` reads the documents (Deployment, HPA or
KEDA ScaledObject, PodDisruptionBudget, NetworkPolicy) and names each rule they break. The committed
``deploy/k8s`` files must give none; ``tests/test_deploy_checks.py`` breaks each rule once and sees
it named.

The rules: no ``replicas`` in a Deployment an autoscaler owns (every ``kubectl apply`` would reset
the fleet); a preStop delay, vLLM's ``--shutdown-timeout`` and a grace period longer than both (or
SIGTERM cuts in-flight streams); at least two replicas, spread over nodes, and a disruption budget
that keeps one serving through a drain; the model pinned by commit hash and read offline with egress
closed; a GPU node affinity; no CPU limit on the server; a memory limit above the RAM-backed
``/dev/shm``; an ephemeral-storage request.
"""

from __future__ import annotations

import math
import re
from typing import Any

UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(q: str | int) -> float:
    """A Kubernetes memory quantity in bytes: ``"2Gi"`` -> 2147483648."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGT]i?)?", str(q))
    if not m:
        raise ValueError(f"not a memory quantity: {q!r}")
    return float(m[1]) * UNITS[m[2] or ""]


def flags(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line (a flag without a value maps to ``""``)."""
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            key, eq, val = a.partition("=")
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[key] = val if eq else ("" if nxt.startswith("--") else nxt)
    return out


def _selects(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    return bool(selector.get("matchLabels")) and selector["matchLabels"].items() <= pod_labels.items()


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
    """The rules (module docstring) the serving Deployment in ``docs`` breaks, as sentences."""
    deps = [d for d in docs if d.get("kind") == "Deployment"]
    if len(deps) != 1:
        return [f"expected one Deployment, found {len(deps)}"]
    dep = deps[0]
    name, pod = dep["metadata"]["name"], dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    (c,) = [c for c in pod["containers"] if c["name"] == "vllm"] or pod["containers"][:1]
    f, out = flags(c.get("args", [])), []
    scalers = [d for d in docs if d.get("kind") in ("HorizontalPodAutoscaler", "ScaledObject")
               and d["spec"]["scaleTargetRef"]["name"] == name]
    if scalers and "replicas" in dep["spec"]:
        out.append("replicas set in a Deployment an autoscaler owns: every apply resets the fleet")
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
            if d.get("kind") == "PodDisruptionBudget" and _selects(d["spec"]["selector"], pod_labels)]
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
            if d.get("kind") == "NetworkPolicy" and _selects(d["spec"]["podSelector"], pod_labels)]
    if not any("Egress" in n["spec"].get("policyTypes", []) and not n["spec"].get("egress") for n in nets):
        out.append("egress not closed: no NetworkPolicy denies the server's outbound traffic")
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
    return out
