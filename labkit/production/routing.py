"""Routing in front of chapter 08's vLLM replicas: one shared queue, the least-loaded replica next.

Chapter 08's fleet simulation (:mod:`labkit.production.fleet`) dispatches from one FIFO queue: the
oldest waiting request goes to the ready replica with the fewest requests in flight, as soon as one
of its ``--max-num-seqs`` slots frees; a request that waits too long is dropped. A Kubernetes
``Service`` does not do that: kube-proxy picks a pod per *connection*, so requests queue inside
whichever replica their connection landed on, a new replica takes none of them over, and a
keep-alive client stays pinned. The Gateway API Inference Extension does what the simulation does:

* an ``InferencePool`` (``inference.networking.k8s.io/v1``, the API of the extension's v1.5.0
  release) names the vLLM pods and its endpoint picker (EPP);
* the EPP (:data:`EPP_IMAGE`, the last release that ships it from this project) runs with **flow
  control**: a ``concurrency-detector`` caps each replica at its ``--max-num-seqs`` requests in
  flight and holds the rest in one queue, first come first served (the flow-control defaults), for
  at most :data:`QUEUE_TTL_S`; the ``running-requests-size-scorer`` and ``max-score-picker`` send
  the head of the queue to the replica running the fewest requests;
* a ``Gateway`` (:data:`GATEWAY_CLASS`, in the gateway namespace; its pods carry
  :data:`~labkit.production.k8s.GATEWAY_LABELS`) and an ``HTTPRoute`` from it to the pool.

The ClusterIP ``Service`` stays for health checks and metrics. :func:`pool_objects` builds one pool
and its EPP (the canary in :mod:`labkit.production.canary` builds a second); :func:`routing_objects`
the file ``deploy/k8s/routing.yaml``. Nothing here was run on a cluster.
"""

from __future__ import annotations

from typing import Any

import yaml

from .k8s import (
    GATEWAY_LABELS,
    GATEWAY_NAMESPACE,
    GRACE_S,
    PROMETHEUS_LABELS,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_RELEASE,
    SCRAPE_S,
    SHUTDOWN_TIMEOUT_S,
)
from .k8s_pod import PORT, container_security

INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_API = f"{INFERENCE_GROUP}/v1"  # InferencePool, GA since the extension's v1.0.0
GATEWAY_API = "gateway.networking.k8s.io/v1"
EPP_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"  # EndpointPickerConfig (a file, not a CRD)
# The endpoint picker of the Gateway API Inference Extension v1.5.0 (its chart's default image). From
# v1.6.0 the project ships only the API and a conformance EPP; the production one moved to llm-d.
EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
EPP_PORT, EPP_HEALTH_PORT, EPP_METRICS_PORT = 9002, 9003, 9090  # ext-proc gRPC, gRPC health, /metrics
EPP_UID = 65532  # the image's non-root user (distroless)
# A request the router could not place within this many seconds is refused (503, "request timed out
# in queue"), as chapter 08's fleet simulation drops a request that waited 2 minutes for a slot.
QUEUE_TTL_S = 120
GATEWAY_NAME = "inference-gateway"
GATEWAY_CLASS = "istio"  # any implementation that supports InferencePool; istio needs a DestinationRule
TRACK_LABEL = "labkit/track"  # stable or canary: what separates the two pools of a canary
EPP_NAME = "epp"


def epp_labels(name: str, pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": EPP_NAME, "app.kubernetes.io/instance": name, "labkit/pool": pool}


def epp_config(slots: int) -> dict[str, Any]:
    """The EPP's ``EndpointPickerConfig``: flow control on, each replica capped at ``slots`` requests
    in flight (vLLM's ``--max-num-seqs``), the excess queued first come first served, the request at
    the head sent to the replica running the fewest. The data-layer plugins scrape vLLM's
    ``/metrics`` (running requests for the scorer), as the project's chart configures them."""
    if not (isinstance(slots, int) and slots > 0):
        raise ValueError(f"slots must be a whole number > 0 (vLLM's --max-num-seqs), got {slots!r}")
    return {
        "apiVersion": EPP_CONFIG_API, "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [
            {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics"}},
            {"type": "core-metrics-extractor"},
            {"type": "concurrency-detector",
             "parameters": {"concurrencyMode": "requests", "maxConcurrency": slots, "headroom": 0.0}},
            {"type": "running-requests-size-scorer"},
            {"type": "max-score-picker"},
        ],
        # the detector also filters: a replica with `slots` in flight is no candidate
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "concurrency-detector"}, {"pluginRef": "running-requests-size-scorer"},
            {"pluginRef": "max-score-picker"}]}],
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "flowControl": {"defaultRequestTTL": f"{QUEUE_TTL_S}s"},
    }


def _peer(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A NetworkPolicy peer: pods with ``labels`` in ``namespace`` (both selectors in one peer: AND)."""
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": labels}}


def pool_objects(name: str, pool: str, namespace: str, selector: dict[str, str], slots: int,
                 gateway_namespace: str = GATEWAY_NAMESPACE, grace_s: int = GRACE_S) -> list[dict[str, Any]]:
    """[ConfigMap, ServiceAccount, Role, RoleBinding, Deployment, Service, PodMonitor, NetworkPolicy,
    InferencePool]: InferencePool ``pool`` over the vLLM pods labelled ``selector`` (port 8000) and
    its EPP ``{pool}-epp``, configured by :func:`epp_config`; only the gateway's pods reach the EPP's
    ext-proc port, only Prometheus its metrics. ``grace_s``: the servers' grace period, which the EPP
    mirrors (it tracks each request until its stream ends)."""
    epp = f"{pool}-epp"
    labels = epp_labels(name, pool)
    meta = {"name": epp, "namespace": namespace, "labels": labels}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
              "data": {"epp.yaml": yaml.safe_dump(epp_config(slots), sort_keys=False)}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": [INFERENCE_GROUP], "resources": ["inferencepools"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": ["inference.networking.x-k8s.io"],
         "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": ["get", "watch", "list"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
               "subjects": [{"kind": "ServiceAccount", "name": epp, "namespace": namespace}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}}
    health = {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": "epp", "image": EPP_IMAGE,
        "args": ["--pool-name", pool, "--pool-namespace", namespace, "--pool-group", INFERENCE_GROUP,
                 "--config-file", "/config/epp.yaml", "--zap-encoder", "json", "--tracing=false",
                 # Prometheus scrapes without a token; the NetworkPolicy admits only Prometheus
                 "--metrics-endpoint-auth=false", "--enable-pprof=false"],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "grpc", "containerPort": EPP_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        # The chart's sizing (validated there at high request rates); no CPU limit, as for vLLM.
        "resources": {"requests": {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Mi"},
                      "limits": {"memory": "16Gi", "ephemeral-storage": "100Mi"}},
        "securityContext": {**container_security(), "runAsUser": EPP_UID, "runAsGroup": EPP_UID},
        "livenessProbe": {**health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**health, "periodSeconds": 2},
        "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            # One picker: its queue and in-flight counts live in memory. Recreate, as the chart does;
            # while it restarts the pool fails open (the gateway picks a replica itself).
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "serviceAccountName": epp,
                # the servers' grace period, as the chart advises: it counts each request until it ends
                "terminationGracePeriodSeconds": grace_s,
                "securityContext": {"runAsNonRoot": True, "runAsUser": EPP_UID, "runAsGroup": EPP_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [{"name": "config", "configMap": {"name": epp}},
                            {"name": "tmp", "emptyDir": {"sizeLimit": "50Mi"}}]}},
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
        "selector": labels, "ports": [
            {"name": "grpc-ext-proc", "port": EPP_PORT, "targetPort": "grpc", "protocol": "TCP"},
            {"name": "http-metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}]}}
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
               "metadata": {**meta, "labels": {**labels, "release": PROMETHEUS_RELEASE}},
               "spec": {"selector": {"matchLabels": labels},
                        "podTargetLabels": ["app.kubernetes.io/instance"],
                        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics",
                                                 "interval": f"{SCRAPE_S}s"}]}}
    network = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
        # Ingress only: the picker must reach the API server and the vLLM pods' /metrics.
        "podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [_peer(gateway_namespace, GATEWAY_LABELS)],
                     "ports": [{"port": EPP_PORT, "protocol": "TCP"}]},
                    {"from": [_peer(PROMETHEUS_NAMESPACE, PROMETHEUS_LABELS)],
                     "ports": [{"port": EPP_METRICS_PORT, "protocol": "TCP"}]}]}}
    inference_pool = {
        "apiVersion": INFERENCE_API, "kind": "InferencePool",
        "metadata": {"name": pool, "namespace": namespace, "labels": labels},
        "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": PORT}],
                 "appProtocol": "http",
                 # FailOpen: if the picker is down, the gateway picks a replica itself (no queue)
                 "endpointPickerRef": {"group": "", "kind": "Service", "name": epp,
                                       "port": {"number": EPP_PORT}, "failureMode": "FailOpen"}},
    }
    return [config, account, role, binding, deployment, service, monitor, network, inference_pool]


def gateway(namespace: str, gateway_namespace: str = GATEWAY_NAMESPACE,
            gateway_class: str = GATEWAY_CLASS) -> dict[str, Any]:
    """The ``Gateway``: HTTP on port 80, routes accepted from ``namespace`` only; its pods get
    :data:`~labkit.production.k8s.GATEWAY_LABELS` (``spec.infrastructure``), the labels the
    NetworkPolicies admit."""
    return {"apiVersion": GATEWAY_API, "kind": "Gateway",
            "metadata": {"name": GATEWAY_NAME, "namespace": gateway_namespace},
            "spec": {"gatewayClassName": gateway_class, "infrastructure": {"labels": dict(GATEWAY_LABELS)},
                     "listeners": [{"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {
                         "namespaces": {"from": "Selector", "selector": {
                             "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}}]}}


def http_route(name: str, namespace: str, pools: list[tuple[str, int]],
               gateway_namespace: str = GATEWAY_NAMESPACE) -> dict[str, Any]:
    """``HTTPRoute`` ``name``: every path from the Gateway to the InferencePools ``pools`` [(name,
    weight)]. The request timeout covers the longest queue wait plus the longest stream."""
    return {"apiVersion": GATEWAY_API, "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                     "name": GATEWAY_NAME, "namespace": gateway_namespace,
                                     "sectionName": "http"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                "backendRefs": [{"group": INFERENCE_GROUP, "kind": "InferencePool",
                                                 "name": pool, "weight": weight} for pool, weight in pools],
                                "timeouts": {"request": f"{QUEUE_TTL_S + SHUTDOWN_TIMEOUT_S}s"}}]}}


def istio_tls(epp: str, namespace: str) -> dict[str, Any]:
    """Istio only: the EPP serves ext-proc over TLS with a self-signed certificate, so the gateway
    must speak TLS to it without verifying (the project's chart, provider istio, does the same)."""
    return {"apiVersion": "networking.istio.io/v1beta1", "kind": "DestinationRule",
            "metadata": {"name": epp, "namespace": namespace},
            "spec": {"host": f"{epp}.{namespace}.svc.cluster.local",
                     "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}}}


def routing_objects(name: str, namespace: str, pod_labels: dict[str, str], slots: int,
                    gateway_namespace: str = GATEWAY_NAMESPACE, gateway_class: str = GATEWAY_CLASS,
                    grace_s: int = GRACE_S) -> list[dict[str, Any]]:
    """``deploy/k8s/routing.yaml``: the pool ``name`` over the stable track of ``pod_labels`` and its
    EPP, the Istio TLS rule when the class is ``istio``, the Gateway and the HTTPRoute."""
    pool = pool_objects(name, name, namespace, {**pod_labels, TRACK_LABEL: "stable"}, slots,
                        gateway_namespace, grace_s)
    extra = [istio_tls(f"{name}-epp", namespace)] if gateway_class == "istio" else []
    return [*pool, *extra, gateway(namespace, gateway_namespace, gateway_class),
            http_route(name, namespace, [(name, 100)], gateway_namespace)]

