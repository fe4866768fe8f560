"""Observability as code for chapter 08's vLLM deployment: a Grafana dashboard, the GPU metrics it
reads, and a load test to watch it under (``deploy/k8s/observability.yaml``,
``deploy/k8s/dashboards/``, ``deploy/k8s/optional/loadtest.yaml``).

* :func:`dashboard`: Grafana's JSON model: time to first token and inter-token latency p50/p99
  from vLLM's histograms, requests running and waiting (in vLLM and in the router's queue), KV-cache
  usage, preemptions, the request rate and 5xx ratio, and GPU utilization and memory from NVIDIA's
  DCGM exporter. Every query picks this deployment's series by namespace and instance, as the alerts
  do; :func:`queries` lists them for the tests (a PromQL parser, metric names from the pinned vLLM
  source). :func:`dashboard_configmap` wraps it for kube-prometheus-stack's Grafana sidecar.
* :func:`dcgm_service_monitor`: the scrape of ``nvidia-dcgm-exporter``, which the NVIDIA GPU
  Operator installs (a DaemonSet and a Service in its namespace, :data:`GPU_OPERATOR_NAMESPACE`).
  ``honorLabels`` keeps the exporter's ``namespace``/``pod`` labels: those of the pod *using* each
  GPU, which is how a GPU series is tied to a vLLM replica.
* :func:`loadtest_objects`: a Job running ``vllm bench serve`` from the pinned vLLM image against the
  Service, and the NetworkPolicy that lets it in.
"""

from __future__ import annotations

import json
from typing import Any

from .k8s import (
    NAMESPACE,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_RELEASE,
    QUEUE_METRIC,
    ROUTER_QUEUE_METRIC,
    RUNNING_METRIC,
    labels,
    series,
)
from .k8s_pod import HUB, MODELS, PORT, container_security, pod_security
from .warm_pool import pool_name

GPU_OPERATOR_NAMESPACE = "gpu-operator"
# DCGM exporter's names (etc/dcp-metrics-included.csv, the GPU Operator's default metric set).
GPU_UTIL, FB_USED, FB_FREE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
GRAFANA_LABEL = {"grafana_dashboard": "1"}  # kube-prometheus-stack's Grafana sidecar picks these up
WINDOW = "5m"


def _panel(title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> dict[str, Any]:
    return {"type": "timeseries", "title": title, "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                        for i, (legend, expr) in enumerate(targets)]}


def panels(name: str, namespace: str = NAMESPACE) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(title, Grafana unit, [(legend, PromQL)]) of each panel."""
    sel = series(name, namespace)
    # the exporter's labels: the pod using the GPU; a warm-pool placeholder holds one but serves nothing
    gpu = f'namespace="{namespace}",pod=~"{name}-.*",pod!~"{pool_name(name)}-.*"'

    def quantiles(metric: str) -> list[tuple[str, str]]:
        rate = f"rate({metric}_bucket{{{sel}}}[{WINDOW}])"
        return [(f"p{q}", f"histogram_quantile(0.{q}, sum by (le) ({rate}))") for q in (50, 99)]

    return [
        ("Time to first token", "s", quantiles("vllm:time_to_first_token_seconds")),
        ("Inter-token latency", "s", quantiles("vllm:inter_token_latency_seconds")),
        ("Requests running and waiting", "short", [
            ("running", f"sum({RUNNING_METRIC}{{{sel}}})"),
            ("waiting in vLLM", f"sum({QUEUE_METRIC}{{{sel}}})"),
            ("waiting in the router", f"sum({ROUTER_QUEUE_METRIC}{{{sel}}})")]),
        ("KV-cache usage", "percentunit", [
            ("{{pod}}", f"max by (pod) (vllm:kv_cache_usage_perc{{{sel}}})")]),
        ("Preemptions", "reqps", [
            ("{{pod}}", f"sum by (pod) (rate(vllm:num_preemptions_total{{{sel}}}[{WINDOW}]))")]),
        ("Requests and 5xx ratio", "short", [
            ("requests/s", f"sum(rate(http_requests_total{{{sel}}}[{WINDOW}]))"),
            ("5xx ratio", f'sum(rate(http_requests_total{{{sel},status="5xx"}}[{WINDOW}]))\n'
                          f"/\nsum(rate(http_requests_total{{{sel}}}[{WINDOW}]))")]),
        ("GPU utilization (DCGM)", "percent", [("{{pod}}", f"avg by (pod) ({GPU_UTIL}{{{gpu}}})")]),
        ("GPU memory used (DCGM)", "percentunit", [
            ("{{pod}}", f"sum by (pod) ({FB_USED}{{{gpu}}})\n/\n"
                        f"(sum by (pod) ({FB_USED}{{{gpu}}}) + sum by (pod) ({FB_FREE}{{{gpu}}}))")]),
    ]


def dashboard(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """Grafana's dashboard JSON model for deployment ``name`` (import it, or let the sidecar load
    :func:`dashboard_configmap`); a ``datasource`` variable picks the Prometheus."""
    return {
        "uid": f"vllm-{name}"[:40], "title": f"vLLM {name} ({namespace})", "tags": ["vllm", "labkit"],
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus"}]},
        "panels": [_panel(title, unit, targets, 12 * (i % 2), 8 * (i // 2))
                   for i, (title, unit, targets) in enumerate(panels(name, namespace))],
    }


def queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard."""
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def dashboard_configmap(name: str, board: dict[str, Any]) -> dict[str, Any]:
    """The dashboard in a ConfigMap in Grafana's namespace, labelled for the sidecar."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{name}-dashboard", "namespace": PROMETHEUS_NAMESPACE,
                         "labels": {**labels(name), **GRAFANA_LABEL}},
            "data": {f"vllm-{name}.json": json.dumps(board, indent=1, sort_keys=True) + "\n"}}


def dcgm_service_monitor() -> dict[str, Any]:
    """The scrape of the GPU Operator's DCGM exporter, every 15 s, keeping its pod labels."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": PROMETHEUS_NAMESPACE,
                         "labels": {"app.kubernetes.io/name": "dcgm-exporter",
                                    "release": PROMETHEUS_RELEASE}},
            "spec": {"namespaceSelector": {"matchNames": [GPU_OPERATOR_NAMESPACE]},
                     "selector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}},
                     "endpoints": [{"port": "gpu-metrics", "path": "/metrics", "interval": "15s",
                                    "honorLabels": True}]}}


def bench_args(model_id: str, revision: str, base_url: str, concurrency: int, prompts: int,
               input_len: int = 1000, output_len: int = 400) -> list[str]:
    """``vllm bench serve`` arguments: random prompts of ``input_len`` tokens asking for ``output_len``
    (chapter 08's production-sized answer), ``concurrency`` in flight, ``prompts`` in all; the
    tokenizer read from the weights volume (offline)."""
    snapshot = f"{HUB}/models--{model_id.replace('/', '--')}/snapshots/{revision}"
    return ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model_id, "--tokenizer", snapshot, "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--ignore-eos",
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--seed", "0", "--ready-check-timeout-sec", "600"]


def loadtest_objects(name: str, namespace: str, model_id: str, revision: str, image: str,
                     concurrency: int, prompts: int) -> list[dict[str, Any]]:
    """[the bench Job, a NetworkPolicy admitting it to the vLLM pods]. The Job reads the tokenizer from
    the weights claim, read-only and offline; it prints vLLM's benchmark summary to its log."""
    bench = {"app.kubernetes.io/name": "vllm-bench", "app.kubernetes.io/instance": name}
    container = {
        "name": "bench", "image": image, "command": ["vllm", "bench", "serve"],
        "args": bench_args(model_id, revision, f"http://{name}.{namespace}.svc:{PORT}", concurrency, prompts),
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HF_HUB_CACHE", "value": HUB},
                {"name": "HOME", "value": "/tmp"}, {"name": "VLLM_NO_USAGE_STATS", "value": "1"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "1Gi"},
                      "limits": {"memory": "4Gi", "ephemeral-storage": "1Gi"}},
        "securityContext": container_security(),
        "volumeMounts": [{"name": "models", "mountPath": MODELS, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{name}-bench", "namespace": namespace, "labels": bench},
           "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 86400,
                    "template": {"metadata": {"labels": bench}, "spec": {
                        "restartPolicy": "Never", "containers": [container],
                        "automountServiceAccountToken": False, "securityContext": pod_security(),
                        "volumes": [{"name": "models", "persistentVolumeClaim": {
                                        "claimName": f"{name}-weights", "readOnly": True}},
                                    {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]}}}}
    admit = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": f"{name}-bench", "namespace": namespace, "labels": bench},
             "spec": {"podSelector": {"matchLabels": labels(name)}, "policyTypes": ["Ingress"],
                      "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                                                 "kubernetes.io/metadata.name": namespace}},
                                             "podSelector": {"matchLabels": bench}}],
                                   "ports": [{"port": PORT, "protocol": "TCP"}]}]}}
    return [job, admit]
