"""What a platform team would refuse in deploy/k8s (labkit.production.k8s_checks, chapter 08): the
committed files pass every rule, and each rule fails on the realistic mistake it exists for."""

import copy

import pytest
import yaml

from labkit.llm.architecture import load_config
from labkit.paths import REPO
from labkit.production import deploy, deploy_sizing, k8s, k8s_checks, k8s_rules

K8S = REPO / "deploy" / "k8s"
QWEN = load_config("Qwen3-4B")
# what `kubectl apply -f deploy/k8s/` applies
CORE = ("vllm.yaml", "storage.yaml", "alerts.yaml", "routing.yaml", "observability.yaml")


def _load(rel):
    return list(yaml.safe_load_all((K8S / rel).read_text()))


def configurations(files):
    """Each way deploy/README.md applies the files, as the cluster then holds them (later replaces
    earlier): the folder alone, then with each optional file; KEDA replaces the HPA."""
    core = [files(f) for f in CORE]
    keda = [[d for d in core[0] if d["kind"] != "HorizontalPodAutoscaler"], *core[1:],
            files("optional/keda-scaledobject.yaml")]
    return {"default": k8s_checks.applied(*core), "keda": k8s_checks.applied(*keda),
            **{opt: k8s_checks.applied(*core, files(f"optional/{opt}.yaml"))
               for opt in ("canary", "loadtest", "warm-pool")}}


def _committed():
    return configurations(_load)


def _bundle(gpu="L4"):
    b = deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu=gpu)
    return configurations(lambda rel: b[rel])


def _fresh():
    """The folder as applied, plus KEDA's ScaledObject (the rules must hold for either autoscaler)."""
    b = deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu="L4")
    return k8s_checks.applied(*(b[f] for f in CORE), b["optional/keda-scaledobject.yaml"])


def _find(docs, kind):
    found = k8s_checks.servers(docs) if kind == "Deployment" else [d for d in docs if d.get("kind") == kind]
    (doc,) = found
    return doc


def _server(docs):
    return _find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def _set_flag(docs, flag, value):
    args = _server(docs)["args"]
    i = args.index(flag)
    if value is None:
        del args[i:i + 2]
    else:
        args[i + 1] = value


@pytest.mark.parametrize("gpu", ["L4", "H100", "A100-80GB"])
def test_the_generated_and_committed_manifests_break_no_rule(gpu):
    for name, docs in _committed().items():
        assert k8s_checks.problems(docs) == [], name
    for name, docs in _bundle(gpu).items():
        assert k8s_checks.problems(docs) == [], name
    assert k8s_checks.problems(_fresh()) == []


def _replicas_beside_hpa(docs):
    _find(docs, "Deployment")["spec"]["replicas"] = 1  # the manifest before issue 35


def _replicas_beside_keda(docs):
    docs[:] = [d for d in docs if d.get("kind") != "HorizontalPodAutoscaler"]
    _find(docs, "Deployment")["spec"]["replicas"] = 2


def _short_grace(docs):
    _find(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60


def _grace_equal_to_drain(docs):
    pod = _find(docs, "Deployment")["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = k8s.PRESTOP_S + k8s.SHUTDOWN_TIMEOUT_S


def _no_prestop(docs):
    del _server(docs)["lifecycle"]


def _pdb_allows_zero(docs):
    _find(docs, "HorizontalPodAutoscaler")["spec"]["minReplicas"] = 1  # with maxUnavailable: 1
    _find(docs, "ScaledObject")["spec"]["minReplicaCount"] = 1


def _pdb_percent_allows_zero(docs):
    _find(docs, "PodDisruptionBudget")["spec"] = {
        "maxUnavailable": "100%", "selector": _find(docs, "PodDisruptionBudget")["spec"]["selector"]}


def _pdb_min_available_zero(docs):
    pdb = _find(docs, "PodDisruptionBudget")
    pdb["spec"] = {"minAvailable": 0, "selector": pdb["spec"]["selector"]}


def _pdb_selects_nothing(docs):
    _find(docs, "PodDisruptionBudget")["spec"]["selector"] = {"matchLabels": {"app": "other"}}


def _open_egress(docs):
    for d in docs:
        if d.get("kind") == "NetworkPolicy" and d["metadata"]["name"] == "qwen3-4b":
            d["spec"]["policyTypes"] = ["Ingress"]
            del d["spec"]["egress"]


def _hub_online(docs):
    _server(docs)["env"] = [e for e in _server(docs)["env"] if e["name"] != "HF_HUB_OFFLINE"]


def _cpu_limit(docs):
    _server(docs)["resources"]["limits"]["cpu"] = "4"


def _shm_beyond_memory(docs):
    pod = _find(docs, "Deployment")["spec"]["template"]["spec"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
    shm["emptyDir"]["sizeLimit"] = "32Gi"


def _no_ephemeral(docs):
    del _server(docs)["resources"]["requests"]["ephemeral-storage"]


def _no_spread(docs):
    del _find(docs, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"]


def _no_gpu_affinity(docs):
    del _find(docs, "Deployment")["spec"]["template"]["spec"]["affinity"]


@pytest.mark.parametrize("break_it, named", [
    (_replicas_beside_hpa, "replicas set in a Deployment an autoscaler owns"),
    (_replicas_beside_keda, "replicas set in a Deployment an autoscaler owns"),
    (_short_grace, "grace period 60 s not longer than preStop 15 s + shutdown timeout 540 s"),
    (_grace_equal_to_drain, "not longer than preStop"),
    (lambda d: _set_flag(d, "--shutdown-timeout", "0"), "no --shutdown-timeout"),
    (lambda d: _set_flag(d, "--shutdown-timeout", None), "no --shutdown-timeout"),
    (_no_prestop, "no preStop delay"),
    (_pdb_allows_zero, "lets a drain evict every replica at 1 replicas"),
    (_pdb_allows_zero, "at least 2 replicas"),
    (_pdb_percent_allows_zero, "lets a drain evict every replica"),
    (_pdb_min_available_zero, "lets a drain evict every replica"),
    (_pdb_selects_nothing, "no PodDisruptionBudget selects the pods"),
    (lambda d: _set_flag(d, "--revision", "main"), "model revision not pinned"),
    (lambda d: _set_flag(d, "--revision", "1cfa9a7"), "model revision not pinned"),  # a short hash
    (lambda d: _set_flag(d, "--revision", None), "model revision not pinned"),
    (_hub_online, "HF_HUB_OFFLINE is not 1"),
    (_open_egress, "egress not closed"),
    (_cpu_limit, "CPU limit on the server"),
    (_shm_beyond_memory, "memory limit does not hold the RAM-backed volume shm"),
    (_no_ephemeral, "no ephemeral-storage request"),
    (_no_spread, "no topologySpreadConstraints"),
    (_no_gpu_affinity, "no nodeSelector or node affinity"),
])
def test_each_rule_fails_on_its_mistake(break_it, named):
    docs = copy.deepcopy(_fresh())
    break_it(docs)
    found = k8s_checks.problems(docs)
    assert any(named in p for p in found), found


def test_serving_floor_rounds_as_kubernetes_does():
    def pdb(**spec):
        return {"spec": spec}

    assert k8s_checks.serving_floor(pdb(maxUnavailable=1), 2) == 1
    assert k8s_checks.serving_floor(pdb(maxUnavailable=1), 1) == 0
    assert k8s_checks.serving_floor(pdb(maxUnavailable="50%"), 3) == 1  # 1.5 unavailable rounds up to 2
    assert k8s_checks.serving_floor(pdb(minAvailable="50%"), 3) == 2  # 1.5 available rounds up to 2
    assert k8s_checks.serving_floor(pdb(minAvailable=1), 5) == 1
    assert k8s_checks.quantity_bytes("18Gi") == 18 * 2**30 and k8s_checks.quantity_bytes("500M") == 5e8
    with pytest.raises(ValueError):
        k8s_checks.quantity_bytes("lots")
    assert k8s_rules.flags(["m", "--a", "1", "--b", "--c=2"]) == {"--a": "1", "--b": "", "--c": "2"}


def test_the_drain_covers_the_longest_stream_and_the_grace_covers_the_drain():
    stream = deploy_sizing.longest_stream_s("Qwen/Qwen3-4B", QWEN, "L4", 8192)
    assert 60 < stream <= k8s.SHUTDOWN_TIMEOUT_S  # minutes, as a real 8k-token stream runs
    assert deploy_sizing.longest_stream_s("Qwen/Qwen3-4B", QWEN, "H100", 8192) < stream  # more bandwidth
    assert k8s.GRACE_S > k8s.DRAIN_S == k8s.PRESTOP_S + k8s.SHUTDOWN_TIMEOUT_S
    pod = _find(_committed()["default"], "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == k8s.GRACE_S
    docs = deploy.manifests("Qwen/Qwen3-4B", QWEN, gpu="L4", shutdown_timeout_s=120)
    short = docs[0]["spec"]["template"]["spec"]
    teardown = k8s.GRACE_S - k8s.DRAIN_S
    assert short["terminationGracePeriodSeconds"] == k8s.PRESTOP_S + 120 + teardown
    assert k8s_checks.problems(docs) == []


def test_revisions_are_commit_hashes():
    assert k8s.revision_for("Qwen/Qwen3-4B") == "1cfa9a7208912126459214e8b04321603b3df60c"
    assert k8s.revision_for("x/y", "a" * 40) == "a" * 40
    for bad in ("main", "v1.0", "A" * 40, "a" * 39):
        with pytest.raises(ValueError, match="commit hash"):
            k8s.revision_for("Qwen/Qwen3-4B", bad)
    with pytest.raises(ValueError, match="--revision"):
        k8s.revision_for("someone/unknown-model")
