"""The serving pod and the storage it reads, for chapter 08's deploy manifests
(:mod:`labkit.production.deploy` assembles them).

* :func:`serving_pod`: the Deployment's pod template spec. vLLM reads pinned weights from a
  read-only volume with ``HF_HUB_OFFLINE=1`` (an init container waits until the download Job's
  marker for that revision exists), keeps its compile caches on a persistent volume, sleeps
  :data:`~labkit.production.k8s.PRESTOP_S` in preStop while endpoints update, and has a grace period
  longer than preStop plus vLLM's ``--shutdown-timeout``. It lands only on nodes with the planned
  GPU (GPU Feature Discovery's product label), spread across nodes and zones; ``/dev/shm`` is a
  memory-backed emptyDir, counted in the memory limit; no CPU limit (the API server and tokenizer
  would be throttled), so the pod is Burstable, with memory request = limit.
* :func:`storage_objects`: the weights PersistentVolumeClaim, the compile-cache claim, the Job that
  downloads the pinned revision into the first, and the NetworkPolicy that lets only that Job out.
"""

from __future__ import annotations

from typing import Any

from .k8s import GPU_PRODUCT_LABEL, GRACE_S, PRESTOP_S

UID = 2000  # deploy/Dockerfile's vllm user
PORT = 8000
COLD_START_S = 900  # startup probe budget (s): load + compile of a model, before liveness counts
MODELS = "/models"  # the weights volume; the Hugging Face hub cache (HF_HUB_CACHE) under it
HUB = f"{MODELS}/hub"
CACHE = "/cache"  # the compile-cache volume
WRITABLE = {"home": "/home/vllm", "tmp": "/tmp"}  # emptyDirs on a read-only root
EMPTY_DIR_GI = {"home": 2, "tmp": 2}  # their size limits
LOG_GI = 1  # container logs, counted in ephemeral storage
SHM_GI = 2  # /dev/shm: tmpfs, charged to the container's memory
COMPILE_CACHE_GI = 10
# The download Job: the hub's API, then its CDN, over HTTPS; cluster DNS to find them.
DOWNLOAD_LABELS = {"app.kubernetes.io/name": "hf-download"}
DOWNLOAD = """import pathlib, sys
from huggingface_hub import snapshot_download
repo, revision, marker = sys.argv[1:]
snapshot_download(repo, revision=revision)
pathlib.Path(marker).parent.mkdir(parents=True, exist_ok=True)
pathlib.Path(marker).write_text(revision)
"""


def marker(model_id: str, revision: str) -> str:
    """The file the download Job writes once ``revision`` of ``model_id`` is complete."""
    return f"{MODELS}/ready/{model_id.replace('/', '--')}@{revision}"


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": UID, "runAsGroup": 0, "capabilities": {"drop": ["ALL"]}}


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": 0, "fsGroup": 0,
            "seccompProfile": {"type": "RuntimeDefault"}}


def ephemeral_gi() -> int:
    """Ephemeral storage the server writes: its emptyDirs (not the RAM-backed /dev/shm) and its logs."""
    return sum(EMPTY_DIR_GI.values()) + LOG_GI


def serving_pod(name: str, image: str, args: list[str], gpus: int, products: list[str], cpu: int,
                memory_gi: int, ready_file: str, pod_labels: dict[str, str],
                grace_s: int = GRACE_S) -> dict[str, Any]:
    """The pod template spec of ``name``'s Deployment: ``vllm serve`` with ``args`` on ``gpus`` GPUs
    whose product label is one of ``products``; ``cpu`` cores requested (no limit), ``memory_gi`` GiB
    for the processes plus :data:`SHM_GI` for ``/dev/shm`` (request = limit); starts once
    ``ready_file`` exists on the weights volume; ``grace_s`` to stop."""
    home = WRITABLE["home"]
    memory = f"{memory_gi + SHM_GI}Gi"
    storage = f"{ephemeral_gi()}Gi"
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container = {
        "name": "vllm", "image": image, "command": ["vllm", "serve"], "args": args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "HF_HUB_CACHE", "value": HUB},  # the pinned weights, read-only
                {"name": "HF_HUB_OFFLINE", "value": "1"},  # never reach for the Hub at start
                {"name": "HF_HOME", "value": f"{home}/.cache/huggingface"},
                {"name": "HOME", "value": home},
                {"name": "XDG_CACHE_HOME", "value": f"{home}/.cache"},
                # compile caches on the persistent volume: a restart or a new replica reuses them
                {"name": "VLLM_CACHE_ROOT", "value": f"{CACHE}/vllm"},
                {"name": "TRITON_CACHE_DIR", "value": f"{CACHE}/triton"},
                {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{CACHE}/inductor"},
                {"name": "VLLM_NO_USAGE_STATS", "value": "1"},  # egress is closed anyway
                {"name": "DO_NOT_TRACK", "value": "1"}],
        "resources": {"requests": {"cpu": str(cpu), "memory": memory, "ephemeral-storage": storage,
                                   "nvidia.com/gpu": gpus},
                      "limits": {"memory": memory, "ephemeral-storage": storage, "nvidia.com/gpu": gpus}},
        "securityContext": container_security(),
        # Endpoints update while this sleeps; SIGTERM then starts vLLM's drain (--shutdown-timeout).
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_S}}},
        "startupProbe": {**probe, "initialDelaySeconds": 30, "periodSeconds": 10,
                         "failureThreshold": -(-(COLD_START_S - 30) // 10)},
        "readinessProbe": {**probe, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4},
        "volumeMounts": [{"name": "models", "mountPath": MODELS, "readOnly": True},
                         {"name": "cache", "mountPath": CACHE},
                         {"name": "shm", "mountPath": "/dev/shm"},
                         *({"name": k, "mountPath": v} for k, v in WRITABLE.items())],
    }
    wait = {"name": "weights-present", "image": image, "command": ["test", "-f", ready_file],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi", "ephemeral-storage": "1Mi"},
                          "limits": {"memory": "32Mi", "ephemeral-storage": "1Mi"}},
            "securityContext": container_security(),
            "volumeMounts": [{"name": "models", "mountPath": MODELS, "readOnly": True}]}
    spread = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": how,
               "labelSelector": {"matchLabels": pod_labels}, "matchLabelKeys": ["pod-template-hash"]}
              for key, how in (("kubernetes.io/hostname", "DoNotSchedule"),
                               ("topology.kubernetes.io/zone", "ScheduleAnyway"))]
    return {
        "terminationGracePeriodSeconds": grace_s,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products}]}]}}},
        "topologySpreadConstraints": spread,
        "initContainers": [wait], "containers": [container],
        "automountServiceAccountToken": False, "securityContext": pod_security(),
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": f"{name}-weights", "readOnly": True}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": f"{name}-compile-cache"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GI}Gi"}},
            *({"name": k, "emptyDir": {"sizeLimit": f"{EMPTY_DIR_GI[k]}Gi"}} for k in WRITABLE),
        ],
    }


def _claim(name: str, namespace: str, labels: dict[str, str], gi: int) -> dict[str, Any]:
    # ReadWriteMany: replicas on several nodes mount it at once (NFS, Filestore, EFS, Azure Files...).
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{gi}Gi"}}}}


def storage_objects(name: str, namespace: str, model_id: str, revision: str, image: str,
                    weights_gi: int, pod_labels: dict[str, str]) -> list[dict[str, Any]]:
    """[weights PVC, compile-cache PVC, download Job, its NetworkPolicy]. The Job is named after the
    revision (Job templates are immutable: a new revision is a new Job) and writes :func:`marker`
    last, so a server never starts on a half-downloaded snapshot."""
    job_labels = {**DOWNLOAD_LABELS, "app.kubernetes.io/instance": name}
    download = {
        "name": "download", "image": image, "command": ["python3", "-c", DOWNLOAD],
        "args": [model_id, revision, marker(model_id, revision)],
        "env": [{"name": "HF_HUB_CACHE", "value": HUB}, {"name": "HF_HOME", "value": "/tmp/huggingface"},
                {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
                # gated models: kubectl create secret generic hf-token --from-literal=token=...
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                    "optional": True}}}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "2Gi"},
                      "limits": {"memory": "2Gi", "ephemeral-storage": "2Gi"}},
        "securityContext": container_security(),
        "volumeMounts": [{"name": "models", "mountPath": MODELS}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{name}-weights-{revision[:8]}", "namespace": namespace, "labels": job_labels},
        "spec": {"backoffLimit": 4, "activeDeadlineSeconds": 3600, "template": {
            "metadata": {"labels": job_labels},
            "spec": {"restartPolicy": "OnFailure", "containers": [download],
                     "automountServiceAccountToken": False, "securityContext": pod_security(),
                     "volumes": [{"name": "models",
                                  "persistentVolumeClaim": {"claimName": f"{name}-weights"}},
                                 {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}]}}},
    }
    dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    egress = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-weights-download", "namespace": namespace, "labels": job_labels},
        "spec": {"podSelector": {"matchLabels": job_labels}, "policyTypes": ["Ingress", "Egress"],
                 "egress": [{"to": [dns], "ports": [{"port": 53, "protocol": "UDP"},
                                                    {"port": 53, "protocol": "TCP"}]},
                            {"ports": [{"port": 443, "protocol": "TCP"}]}]},
    }
    return [_claim(f"{name}-weights", namespace, pod_labels, weights_gi),
            _claim(f"{name}-compile-cache", namespace, pod_labels, COMPILE_CACHE_GI), job, egress]
