"""Observability as code in deploy/k8s (labkit.production.dashboard, chapter 08): the Grafana
dashboard's panels and their PromQL, the DCGM exporter's scrape, the load-test Job's `vllm bench
serve` arguments (checked against the pinned vLLM release where its venv exists), and the committed
dashboard file."""

import json
import re
from typing import Any

import promql_parser
import pytest
import yaml

from labkit.llm.architecture import load_config
from labkit.paths import REPO
from labkit.production import dashboard, deploy, k8s, k8s_pod, warm_pool

QWEN = load_config("Qwen3-4B")
FILES = deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu="L4")
(BOARD,) = FILES["dashboards/vllm-qwen3-4b.json"]
K8S = REPO / "deploy" / "k8s"


def _metrics(expr):
    found = []
    promql_parser.walk(promql_parser.parse(expr), lambda n: found.append(n.name)
                       if isinstance(n, promql_parser.VectorSelector) else None)
    return found


def test_the_dashboard_shows_what_the_issue_asks_for():
    titles = [p["title"] for p in BOARD["panels"]]
    assert titles == ["Time to first token", "Inter-token latency", "Requests running and waiting",
                      "KV-cache usage", "Preemptions", "Requests and 5xx ratio", "GPU utilization (DCGM)",
                      "GPU memory used (DCGM)"]
    used = {m for q in dashboard.queries(BOARD) for m in _metrics(q)}
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
            "vllm:num_requests_running", "vllm:num_requests_waiting", k8s.ROUTER_QUEUE_METRIC,
            "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"} <= used
    for title in ("Time to first token", "Inter-token latency"):  # p50 and p99 from the histogram
        (panel,) = [p for p in BOARD["panels"] if p["title"] == title]
        assert [t["legendFormat"] for t in panel["targets"]] == ["p50", "p99"]
        assert all(t["expr"].startswith(f"histogram_quantile(0.{q}, sum by (le) (rate(")
                   for t, q in zip(panel["targets"], (50, 99), strict=True))


def test_every_panel_is_well_formed_and_every_query_parses():
    assert [v["name"] for v in BOARD["templating"]["list"]] == ["datasource"]
    cells: set[Any] = set()
    for p in BOARD["panels"]:
        assert p["type"] == "timeseries" and p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs) and all(t["expr"] for t in p["targets"])
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells and g["x"] + g["w"] <= 24, p["title"]  # no overlap, in Grafana's 24 columns
        cells |= mine
    for expr in dashboard.queries(BOARD):
        promql_parser.parse(expr)  # raises on a syntax error
    with pytest.raises(ValueError):
        promql_parser.parse("histogram_quantile(0.99, sum by (le) (rate(vllm:x_bucket[5m]))")


def test_the_committed_dashboard_is_the_configmaps():
    committed = json.loads((K8S / "dashboards" / "vllm-qwen3-4b.json").read_text())
    (_, cm) = [d for d in yaml.safe_load_all((K8S / "observability.yaml").read_text())]
    assert cm["metadata"]["namespace"] == k8s.PROMETHEUS_NAMESPACE  # where Grafana's sidecar looks
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["vllm-qwen3-4b.json"]) == committed == BOARD


def test_dcgm_scrape_finds_the_gpu_operators_exporter():
    """The GPU Operator's Service (assets/state-dcgm-exporter/0400_service.yaml, v26.7.0):
    nvidia-dcgm-exporter, label app: nvidia-dcgm-exporter, port gpu-metrics (9400)."""
    sm = FILES["observability.yaml"][0]
    assert sm["kind"] == "ServiceMonitor" and sm["metadata"]["labels"]["release"] == k8s.PROMETHEUS_RELEASE
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [dashboard.GPU_OPERATOR_NAMESPACE]}
    assert sm["spec"]["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    (ep,) = sm["spec"]["endpoints"]
    # honorLabels: the exporter's namespace/pod labels name the pod using the GPU, which the
    # dashboard filters on; without it Prometheus renames them exported_namespace, exported_pod
    assert ep["port"] == "gpu-metrics" and ep["honorLabels"] is True


def test_gpu_panels_leave_out_the_warm_pools_placeholders():
    """A placeholder pod holds a GPU (its name starts like a server's) but serves nothing."""
    held = warm_pool.pool_name("qwen3-4b")
    gpu = [expr for _, _, targets in dashboard.panels("qwen3-4b") for _, expr in targets if "DCGM_" in expr]
    assert gpu and all(f'pod!~"{held}-.*"' in e and 'pod=~"qwen3-4b-.*"' in e for e in gpu)
    pods = [d for d in FILES["optional/warm-pool.yaml"] if d["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in pods] == [held]


def test_the_load_test_runs_vllm_bench_against_the_service():
    job, admit = FILES["optional/loadtest.yaml"]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == deploy.VLLM_IMAGE and c["command"] == ["vllm", "bench", "serve"]
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=False))
    flags = [a for a in c["args"] if a.startswith("--")]
    assert args["--base-url"] == f"http://qwen3-4b.{k8s.NAMESPACE}.svc:{k8s_pod.PORT}"
    assert args["--model"] == "Qwen/Qwen3-4B"
    rev = k8s.revision_for("Qwen/Qwen3-4B")  # the tokenizer of the pinned revision, from the volume
    tokenizer = c["args"][c["args"].index("--tokenizer") + 1]
    assert tokenizer == f"{k8s_pod.HUB}/models--Qwen--Qwen3-4B/snapshots/{rev}"
    assert {"name": "models", "mountPath": k8s_pod.MODELS, "readOnly": True} in c["volumeMounts"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    hpa = [d for d in FILES["vllm.yaml"] if d["kind"] == "HorizontalPodAutoscaler"][0]
    server = _server()["spec"]["template"]
    served = server["spec"]["containers"][0]["args"]
    slots = int(served[served.index("--max-num-seqs") + 1])
    concurrency = int(c["args"][c["args"].index("--max-concurrency") + 1])
    assert concurrency == hpa["spec"]["maxReplicas"] * slots  # every slot of the largest fleet
    assert "--ignore-eos" in flags and c["args"][c["args"].index("--random-output-len") + 1] == "400"
    # the bench pods are let in to the servers' port, from this namespace only
    (rule,) = admit["spec"]["ingress"]
    assert admit["spec"]["podSelector"]["matchLabels"].items() <= server["metadata"]["labels"].items()
    assert rule["from"][0]["podSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": k8s.NAMESPACE}


def _server():
    return [d for d in FILES["vllm.yaml"] if d["kind"] == "Deployment"][0]


def _vllm_source():
    found = sorted(REPO.glob(".venv-vllm/lib/python3*/site-packages/vllm"))
    return found[0] if found else None


@pytest.mark.skipif(_vllm_source() is None, reason="the lab's vLLM venv is absent (make serve-setup)")
def test_bench_flags_exist_in_the_pinned_vllm_release():
    src = _vllm_source()
    text = "".join((src / "benchmarks" / f).read_text() for f in ("serve.py", "datasets/datasets.py"))
    job, _ = FILES["optional/loadtest.yaml"]
    for flag in (a for a in job["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--")):
        assert f'"{flag}"' in text, flag
    assert re.search(r'"--percentile-metrics".*?"ttft", "tpot", "itl", "e2el"', text, re.S)
