"""Kubernetes building blocks of chapter 08's deploy manifests (:mod:`labkit.production.deploy`
assembles them; import each from here): object names and labels, quantities, the pinned model
revisions, the shutdown timings (preStop, vLLM's drain, the grace period), the GPU node labels, the
autoscaling signals (the two gauges vLLM exports, the router's queue) and the HPA behaviour chapter
08's fleet simulation also reads (:class:`labkit.production.scaler.ScalerConfig`), prometheus-adapter's
rules and KEDA's ``ScaledObject``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

QUEUE_METRIC = "vllm:num_requests_waiting"  # vLLM's gauge: requests queued, not yet scheduled
ADAPTER_METRIC = "vllm_num_requests_waiting"  # the name prometheus-adapter's rule gives it (no ':')
RUNNING_METRIC = "vllm:num_requests_running"  # vLLM's gauge: requests in the running batch
ADAPTER_RUNNING = "vllm_num_requests_running"
# The router's queue (labkit.production.routing): with flow control the endpoint picker holds the
# requests no replica has a slot for, so vLLM's own queue stays near zero and this gauge is the
# queue chapter 08's fleet simulation scales on. The Gateway API Inference Extension's name
# (pkg/epp/metrics/metrics.go, v1.5.0); served to the HPA under the same name, as an External metric.
ROUTER_QUEUE_METRIC = "inference_extension_flow_control_queue_size"
# The HPA's behaviour, shared with chapter 08's simulator (labkit.production.fleet): scale up at once
# by up to 2 pods or 100% per minute (a replica takes minutes to start), scale down one pod per
# 2 minutes and only after 5 minutes of lower recommendations. Kubernetes adds a 10% tolerance
# (--horizontal-pod-autoscaler-tolerance) and re-evaluates every 15 s (--horizontal-pod-autoscaler-
# sync-period); the metric reaches it through a scrape (PodMonitor interval) and the adapter.
HPA_BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60},
                             {"type": "Percent", "value": 100, "periodSeconds": 60}]},
    "scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
}
HPA_TOLERANCE = 0.10  # kube-controller-manager's default
HPA_SYNC_S = 15  # kube-controller-manager's default sync period
SCRAPE_S = 15  # the PodMonitor's scrape interval
# prometheus-adapter answers from Prometheus on each HPA query; the sample it reads is up to one
# scrape old, and Prometheus' rate windows add nothing here (the two metrics are gauges).
# Shutdown, in order: the pod turns Terminating and leaves the Service's endpoints, but kube-proxy and
# gateways learn it seconds later, so the preStop hook sleeps PRESTOP_S while requests may still
# arrive; then SIGTERM, and vLLM (--shutdown-timeout) stops taking requests and lets the running ones
# finish for up to SHUTDOWN_TIMEOUT_S (vLLM's default 0 aborts them all); TEARDOWN_S more for the
# engine to exit before the kubelet's SIGKILL at terminationGracePeriodSeconds (GRACE_S).
PRESTOP_S = 15
# The longest stream the shipped plan accepts (8,192 tokens on one L4, at the memory-bound decode rate
# with the KV cache full: about 524 s, :func:`labkit.production.deploy.longest_stream_s`), rounded up
# to 30 s. An estimate standing in for the p99 request time until one is measured on the fleet
# (vllm:e2e_request_latency_seconds); vLLM exits as soon as its last request ends, so a generous
# timeout costs only on a fleet that really streams that long.
SHUTDOWN_TIMEOUT_S = 540
TEARDOWN_S = 30
DRAIN_S = PRESTOP_S + SHUTDOWN_TIMEOUT_S  # what an in-flight request gets: chapter 08's fleet drain
GRACE_S = DRAIN_S + TEARDOWN_S  # terminationGracePeriodSeconds: larger than preStop + shutdown timeout
# The model's weights, pinned by commit: a branch name ("main") moves, and a fleet started across a
# repo update would serve two revisions. Qwen/Qwen3-4B's commit as cited by several public sources
# (https://huggingface.co/Qwen/Qwen3-4B/commit/1cfa9a7208912126459214e8b04321603b3df60c); not
# re-fetched from the Hub while writing the lab (no network). Another model: pass --revision.
MODEL_REVISIONS = {"Qwen/Qwen3-4B": "1cfa9a7208912126459214e8b04321603b3df60c"}
# NVIDIA GPU Feature Discovery's node label (GPU Operator): nvidia-smi's product name, spaces as dashes.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCTS = {"L4": ["NVIDIA-L4"], "H100 SXM": ["NVIDIA-H100-80GB-HBM3"], "H200": ["NVIDIA-H200"],
                "B200": ["NVIDIA-B200"], "A100 80GB": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"],
                "RTX 4090": ["NVIDIA-GeForce-RTX-4090"], "RTX 3060 12GB": ["NVIDIA-GeForce-RTX-3060"]}
# The pod label the PodMonitor copies onto every scraped series (podTargetLabels), so queries and
# alerts can pick this deployment's pods: Prometheus spells app.kubernetes.io/instance this way.
INSTANCE_LABEL = "app_kubernetes_io_instance"
# Who may reach the server (NetworkPolicy): the gateway's pods (by label, in GATEWAY_NAMESPACE) and
# Prometheus (kube-prometheus-stack's pods in the monitoring namespace).
GATEWAY_LABELS = {"app.kubernetes.io/component": "gateway"}
GATEWAY_NAMESPACE = "gateway"
NAMESPACE = "default"  # where the generated objects live (metadata.namespace, and every query's filter)
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}
# kube-prometheus-stack only picks up PodMonitors labelled with its Helm release by default.
PROMETHEUS_RELEASE = "kube-prometheus-stack"
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"  # kube-prometheus-stack's service


def slug(model_id: str) -> str:
    """A Kubernetes object name for a model: ``Qwen/Qwen3-4B`` -> ``qwen3-4b`` (DNS-1123 label)."""
    s = re.sub(r"[^a-z0-9]+", "-", model_id.rsplit("/", 1)[-1].lower()).strip("-")[:63].rstrip("-")
    if not s:
        raise ValueError(f"model_id {model_id!r} gives no usable Kubernetes name: use letters or digits")
    return s


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}


def check_replicas(replicas: tuple[int, int]) -> tuple[int, int]:
    """(min, max) replicas, refused below two: with one, a node drain or a rollout's eviction leaves
    nothing serving for a whole cold start, whatever the PodDisruptionBudget says."""
    lo, hi = replicas
    if not (isinstance(lo, int) and isinstance(hi, int) and 2 <= lo <= hi):
        raise ValueError(f"replicas must be (min, max) whole numbers with 2 <= min <= max (one replica "
                         f"cannot survive a drain), got {replicas!r}")
    return lo, hi


def revision_for(model_id: str, revision: str | None = None) -> str:
    """The commit ``model_id`` is pinned to: ``revision`` if given, else the one :data:`MODEL_REVISIONS`
    names. A branch or tag is refused: only a 40-hex commit hash names fixed bytes."""
    rev = revision or MODEL_REVISIONS.get(model_id)
    if rev is None:
        raise ValueError(f"no pinned revision for {model_id!r}: pass --revision with its commit hash "
                         f"(huggingface_hub.model_info({model_id!r}).sha, or the Hub's 'Files' tab)")
    if not re.fullmatch(r"[0-9a-f]{40}", rev):
        raise ValueError(f"revision {rev!r} is not a 40-hex commit hash: a branch or tag can move")
    return rev


def gpu_products(gpu_name: str) -> list[str]:
    """GPU Feature Discovery's ``nvidia.com/gpu.product`` values for a catalog GPU."""
    if gpu_name not in GPU_PRODUCTS:
        raise ValueError(f"no nvidia.com/gpu.product label known for {gpu_name!r}: "
                         f"use one of {sorted(GPU_PRODUCTS)}")
    return GPU_PRODUCTS[gpu_name]


def series(name: str, namespace: str = NAMESPACE) -> str:
    """The label matchers that pick one deployment's series: its namespace and instance."""
    return f'namespace="{namespace}",{INSTANCE_LABEL}="{name}"'


def quantity(value: float) -> str:
    """A Kubernetes quantity for a positive number: ``4`` -> ``"4"``, ``2.5`` -> ``"2500m"``."""
    if not value > 0:
        raise ValueError(f"queue_target must be > 0 (waiting requests per replica), got {value!r}")
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def default_running_target(concurrency: int) -> float:
    """Running requests per replica the HPA aims at: three quarters of ``--max-num-seqs``, so a
    replica is added before the batch is full and requests start to queue."""
    return max(1.0, round(0.75 * concurrency))


def probe_budget_s(probe: dict[str, Any]) -> float:
    """Seconds a startup probe lets a container take before the kubelet restarts it:
    ``initialDelaySeconds + failureThreshold x periodSeconds`` (Kubernetes' defaults 0, 3 and 10)."""
    return float(probe.get("initialDelaySeconds", 0)
                 + probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10))


def pods_metric(name: str, target: float) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": name},
                                     "target": {"type": "AverageValue", "averageValue": quantity(target)}}}


def router_queue_metric(name: str, target: float) -> dict[str, Any]:
    """The HPA's External metric on :data:`ROUTER_QUEUE_METRIC`, summed over deployment ``name``'s
    endpoint pickers; an ``AverageValue`` target divides it by the replica count, as a Pods metric is."""
    return {"type": "External", "external": {
        "metric": {"name": ROUTER_QUEUE_METRIC, "selector": {"matchLabels": {INSTANCE_LABEL: name}}},
        "target": {"type": "AverageValue", "averageValue": quantity(target)}}}


def keda_scaled_object(model_id: str, replicas: tuple[int, int] = (2, 4), queue_target: float = 4.0,
                       prometheus_url: str = PROMETHEUS_URL, running_target: float = 12.0,
                       namespace: str = NAMESPACE) -> dict[str, Any]:
    """KEDA's ``ScaledObject`` for the same Deployment, on the same signals as the HPA: replicas =
    the largest of ceil(running requests summed over this deployment's pods / ``running_target``),
    ceil(waiting in vLLM / ``queue_target``) and ceil(waiting in the router / ``queue_target``), from
    Prometheus queries filtered by namespace and instance (:func:`series`), so another model's or
    namespace's pods never count. KEDA builds the HPA itself
    and passes it :data:`HPA_BEHAVIOR`. ``fallback``: after 3 failed queries in a row (Prometheus
    down), hold ``max`` replicas, capacity over cost while blind. ``cooldownPeriod`` is left out:
    KEDA applies it only when scaling to zero, which ``minReplicaCount`` >= 2 never does."""
    lo, hi = check_replicas(replicas)
    quantity(queue_target), quantity(running_target)
    name = slug(model_id)

    def trigger(metric: str, target: float) -> dict[str, Any]:
        return {"type": "prometheus", "metricType": "AverageValue", "metadata": {
            "serverAddress": prometheus_url,
            "query": f'sum({metric}{{{series(name, namespace)},model_name="{model_id}"}})',
            "threshold": f"{target:g}"}}

    router = {"type": "prometheus", "metricType": "AverageValue", "metadata": {
        "serverAddress": prometheus_url, "query": f"sum({ROUTER_QUEUE_METRIC}{{{series(name, namespace)}}})",
        "threshold": f"{queue_target:g}"}}

    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "scaleTargetRef": {"name": name}, "minReplicaCount": lo, "maxReplicaCount": hi,
            "pollingInterval": HPA_SYNC_S, "fallback": {"failureThreshold": 3, "replicas": hi},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": HPA_BEHAVIOR}},
            "triggers": [trigger(RUNNING_METRIC, running_target), trigger(QUEUE_METRIC, queue_target),
                         router],
        },
    }


def adapter_values(prometheus_url: str = PROMETHEUS_URL) -> dict[str, Any]:
    """Helm values for prometheus-community/prometheus-adapter: rules exposing vLLM's
    :data:`RUNNING_METRIC` and :data:`QUEUE_METRIC` per pod (as the PodMonitor's scrape labels them:
    ``namespace`` and ``pod``) as the custom metrics :data:`ADAPTER_RUNNING` and :data:`ADAPTER_METRIC`,
    and the router's :data:`ROUTER_QUEUE_METRIC` per namespace as an external metric."""
    u = urlsplit(prometheus_url)
    if not (u.scheme and u.hostname):
        raise ValueError(f"prometheus_url must look like http://HOST:PORT, got {prometheus_url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    rules = [{
        "seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{metric}$", "as": served},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    } for metric, served in ((RUNNING_METRIC, ADAPTER_RUNNING), (QUEUE_METRIC, ADAPTER_METRIC))]
    external = [{
        "seriesQuery": f'{ROUTER_QUEUE_METRIC}{{namespace!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "name": {"matches": f"^{ROUTER_QUEUE_METRIC}$", "as": ROUTER_QUEUE_METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }]
    return {"prometheus": {"url": f"{u.scheme}://{u.hostname}", "port": port},
            "rules": {"default": False, "custom": rules, "external": external}}
