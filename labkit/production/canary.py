"""A canary rollout with analysis for chapter 08's vLLM deployment, and its criteria in one place.

Chapter 08's rollout simulation (:mod:`labkit.production.rollout`) moves 5%, 25%, 50%, then all of
the traffic to a new version, 10 minutes a step, and rolls back on this module's criteria. The plan
and the criteria are numbers here (:data:`WEIGHTS`, :data:`STEP_PAUSE_S`, the limits below; the
simulation imports them) and Argo Rollouts objects, ``deploy/k8s/optional/canary.yaml``:

* a ``Rollout`` that takes its pod template from the Deployment (``workloadRef``; the Deployment is
  scaled to zero once the Rollout is healthy) and moves traffic with the Gateway API plugin
  (``argoproj-labs/gatewayAPI``) by setting the weights of the ``HTTPRoute``'s two backends: the
  stable InferencePool (named like the stable Service, ``{name}``) and the canary one
  (``{name}-canary``). The plugin finds backends by name, so pool and Service names must agree.
  Argo labels the canary's pods ``labkit/track: canary`` and the stable ones ``stable``; each pool
  selects one track, each with its own endpoint picker;
* the HPA retargeted at the Rollout (no ``replicas`` in it: the HPA owns the count);
* an ``AnalysisTemplate`` run in the background from the first pause: every
  :data:`ANALYSIS_INTERVAL_S` s, over the last :data:`WINDOW`, the canary's 5xx ratio against
  :data:`ERROR_RATIO_LIMIT` and its p99 time to first token over the stable version's against
  :data:`TTFT_P99_RATIO_LIMIT`, judged only once the canary has served :data:`MIN_REQUESTS`. More
  than :data:`FAILURE_LIMIT` failed measurements of either abort the rollout: Argo sets the canary's
  weight to 0 and scales it down (the rollback);
* at the end of each step, an evidence check: every window of :data:`WINDOW` that ends in the
  step's last :data:`JUDGED_SPAN_S` s (so lies wholly in the step) must hold :data:`MIN_REQUESTS`
  of the canary's answers, sampled every :data:`SAMPLE_S` s; the background measurement taken in that
  span (there is one: :data:`ANALYSIS_INTERVAL_S` is no longer) was then judged. Otherwise the
  rollout pauses for a person; no answer at all in the step aborts it (the routing is broken).

Pods are told apart by ``rollouts-pod-template-hash``, which the PodMonitor copies onto every series.
Nothing here was run on a cluster.
"""

from __future__ import annotations

import math
from typing import Any

from .alerts import SLOS
from .k8s import GATEWAY_NAMESPACE, GRACE_S, NAMESPACE, PROMETHEUS_URL, labels, series
from .k8s_pod import COLD_START_S, PORT
from .routing import GATEWAY_CLASS, TRACK_LABEL, http_route, istio_tls, pool_objects

# The plan and the judgement, as chapter 08's rollout simulation runs them (labkit.production.rollout).
WEIGHTS = (5, 25, 50)  # % of requests to the canary at each step; promotion sends it all
STEP_PAUSE_S = 600  # time at each weight
# The judgement. A ratio of errors under 0.5% cannot be read from fewer than 200 requests (one error
# is 0.5% of 200), and a p99 needs at least 100; below MIN_REQUESTS a measurement is not judged.
ERROR_RATIO_LIMIT = round(1 - SLOS["errors"]["objective"], 9)  # the 5xx SLO's error budget: 0.5%
TTFT_P99_RATIO_LIMIT = 1.2  # canary p99 TTFT / stable p99 TTFT; an example to adapt, like the SLOs
MIN_REQUESTS = max(math.ceil(1 / ERROR_RATIO_LIMIT - 1e-9), 100)
WINDOW_S = 300  # each measurement looks back this far (s)
WINDOW = f"{WINDOW_S // 60}m"
# One measurement per window, so windows do not overlap: with a measurement a minute over 5-minute
# windows, one pair of errors fails up to five measurements in a row and FAILURE_LIMIT means nothing.
ANALYSIS_INTERVAL_S = WINDOW_S
FAILURE_LIMIT = 1  # failed measurements tolerated per metric; the next one rolls back
# The evidence at a step's end reads the windows that end in its last JUDGED_SPAN_S s (each lies
# wholly in the step, at its weight); one background measurement is taken in that span.
JUDGED_SPAN_S = STEP_PAUSE_S - WINDOW_S
SAMPLE_S = 30  # the subquery's resolution (s): windows ending every 30 s are read
if not 0 < ANALYSIS_INTERVAL_S <= JUDGED_SPAN_S:
    raise ValueError("a step must hold a whole window and one measurement after it")
ROLLOUTS_API = "argoproj.io/v1alpha1"
PLUGIN = "argoproj-labs/gatewayAPI"
HASH_LABEL = "rollouts_pod_template_hash"  # the PodMonitor copies rollouts-pod-template-hash


def _sel(name: str, namespace: str, arg: str) -> str:
    return f'{series(name, namespace)},{HASH_LABEL}="{{{{args.{arg}}}}}"'


def error_ratio_query(name: str, namespace: str = NAMESPACE, window: str = WINDOW) -> str:
    """PromQL: the canary's share of 5xx responses over ``window``; empty until it served
    :data:`MIN_REQUESTS` there (Argo then counts the measurement as passed, the evidence step
    catches a canary that serves nothing)."""
    c = _sel(name, namespace, "canary-hash")
    return (f'(sum(rate(http_requests_total{{{c},status="5xx"}}[{window}])) or on() vector(0))\n'
            f'/\nsum(rate(http_requests_total{{{c}}}[{window}]))\n'
            f'and on()\nsum(increase(http_requests_total{{{c}}}[{window}])) >= {MIN_REQUESTS}')


def ttft_ratio_query(name: str, namespace: str = NAMESPACE, window: str = WINDOW) -> str:
    """PromQL: the canary's p99 time to first token over the stable version's, over ``window``."""
    h = "vllm:time_to_first_token_seconds"

    def p99(arg: str) -> str:
        bucket = f"{h}_bucket{{{_sel(name, namespace, arg)}}}"
        return f"histogram_quantile(0.99, sum by (le) (rate({bucket}[{window}])))"

    c = _sel(name, namespace, "canary-hash")
    return (f"{p99('canary-hash')}\n/\n{p99('stable-hash')}\n"
            f"and on()\nsum(increase({h}_count{{{c}}}[{window}])) >= {MIN_REQUESTS}")


def served_query(name: str, namespace: str = NAMESPACE) -> str:
    """PromQL: requests the canary answered during the last step."""
    c = _sel(name, namespace, "canary-hash")
    return f"sum(increase(http_requests_total{{{c}}}[{STEP_PAUSE_S}s]))"


def judged_query(name: str, namespace: str = NAMESPACE) -> str:
    """PromQL: the fewest answers the canary brought into one :data:`WINDOW` among the windows that end
    in the step's last :data:`JUDGED_SPAN_S` s (every :data:`SAMPLE_S` s): at least
    :data:`MIN_REQUESTS` means the measurement taken there was judged."""
    c = _sel(name, namespace, "canary-hash")
    return (f"min_over_time(sum(increase(http_requests_total{{{c}}}[{WINDOW}]))"
            f"[{JUDGED_SPAN_S}s:{SAMPLE_S}s])")


def _metric(name: str, query: str, limit: float, prometheus_url: str) -> dict[str, Any]:
    return {"name": name, "interval": f"{ANALYSIS_INTERVAL_S}s", "failureLimit": FAILURE_LIMIT,
            "successCondition": f"len(result) == 0 || result[0] <= {limit:g}",
            "failureCondition": f"len(result) > 0 && result[0] > {limit:g}",
            "provider": {"prometheus": {"address": prometheus_url, "query": query}}}


def analysis_templates(name: str, namespace: str = NAMESPACE,
                       prometheus_url: str = PROMETHEUS_URL) -> list[dict[str, Any]]:
    """[the background judgement ``{name}-canary``, the per-step evidence ``{name}-canary-served``]."""
    args = [{"name": "canary-hash"}, {"name": "stable-hash"}]
    judge = {"apiVersion": ROLLOUTS_API, "kind": "AnalysisTemplate",
             "metadata": {"name": f"{name}-canary", "namespace": namespace},
             "spec": {"args": args, "metrics": [
                 _metric("error-ratio", error_ratio_query(name, namespace), ERROR_RATIO_LIMIT,
                         prometheus_url),
                 _metric("ttft-p99-vs-stable", ttft_ratio_query(name, namespace), TTFT_P99_RATIO_LIMIT,
                         prometheus_url)]}}
    def once(metric: str, query: str, success: str, failure: str) -> dict[str, Any]:
        return {"name": metric, "count": 1, "successCondition": success, "failureCondition": failure,
                "provider": {"prometheus": {"address": prometheus_url, "query": query}}}

    served = {"apiVersion": ROLLOUTS_API, "kind": "AnalysisTemplate",
              "metadata": {"name": f"{name}-canary-served", "namespace": namespace},
              "spec": {"args": args[:1], "metrics": [
                  once("canary-served", served_query(name, namespace), "len(result) > 0 && result[0] >= 1",
                       "len(result) == 0 || result[0] < 1"),
                  # fewer than MIN_REQUESTS: neither condition holds, inconclusive, the rollout pauses
                  once("canary-judged", judged_query(name, namespace),
                       f"len(result) > 0 && result[0] >= {MIN_REQUESTS}", "len(result) == 0")]}}
    return [judge, served]


def rollout(name: str, namespace: str = NAMESPACE,
            progress_deadline_s: int = COLD_START_S + 300) -> dict[str, Any]:
    """The ``Rollout`` over Deployment ``name``'s pod template; ``progress_deadline_s`` must exceed a
    replica's cold start (the startup probe allows :data:`~labkit.production.k8s_pod.COLD_START_S`),
    or a step whose new pods are still starting counts as stuck and aborts."""
    hashes = [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}},
              {"name": "stable-hash", "valueFrom": {"podTemplateHashValue": "Stable"}}]
    steps: list[dict[str, Any]] = []
    for w in WEIGHTS:
        steps += [{"setWeight": w}, {"pause": {"duration": f"{STEP_PAUSE_S}s"}},
                  {"analysis": {"templates": [{"templateName": f"{name}-canary-served"}],
                                "args": hashes[:1]}}]
    return {
        "apiVersion": ROLLOUTS_API, "kind": "Rollout",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            # No replicas: the HPA owns the count.
            "selector": {"matchLabels": labels(name)},
            "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                            "scaleDown": "onsuccess"},
            "progressDeadlineSeconds": progress_deadline_s, "progressDeadlineAbort": True,
            "strategy": {"canary": {
                "stableService": name, "canaryService": f"{name}-canary",
                "stableMetadata": {"labels": {TRACK_LABEL: "stable"}},
                "canaryMetadata": {"labels": {TRACK_LABEL: "canary"}},
                "trafficRouting": {"plugins": {PLUGIN: {"httpRoute": name, "namespace": namespace}}},
                "analysis": {"templates": [{"templateName": f"{name}-canary"}], "startingStep": 1,
                             "args": hashes},
                "steps": steps,
            }},
        },
    }


def canary_objects(name: str, namespace: str, slots: int, hpa: dict[str, Any],
                   prometheus_url: str = PROMETHEUS_URL, gateway_namespace: str = GATEWAY_NAMESPACE,
                   gateway_class: str = GATEWAY_CLASS, grace_s: int = GRACE_S) -> list[dict[str, Any]]:
    """``deploy/k8s/optional/canary.yaml``: the Rollout, ``hpa`` (the Deployment's) retargeted at it,
    the canary Service, pool and picker (``slots`` requests in flight per replica), the HTTPRoute
    with both pools at weights 100 and 0, the analysis templates."""
    scaled = {**hpa, "spec": {**hpa["spec"], "scaleTargetRef": {
        "apiVersion": ROLLOUTS_API, "kind": "Rollout", "name": name}}}
    canary = f"{name}-canary"
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": canary, "namespace": namespace, "labels": labels(name)},
               "spec": {"selector": labels(name),
                        "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}
    pool = pool_objects(name, canary, namespace, {**labels(name), TRACK_LABEL: "canary"}, slots,
                        gateway_namespace, grace_s)
    extra = [istio_tls(f"{canary}-epp", namespace)] if gateway_class == "istio" else []
    route = http_route(name, namespace, [(name, 100), (canary, 0)], gateway_namespace)
    return [rollout(name, namespace), scaled, service, *pool, *extra, route,
            *analysis_templates(name, namespace, prometheus_url)]
