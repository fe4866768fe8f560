"""Alerts as code for chapter 08's vLLM deployment: a ``PrometheusRule`` (Prometheus Operator) with
multi-window, multi-burn-rate SLO alerts (Google's SRE workbook, "Alerting on SLOs") on vLLM's
time-to-first-token and inter-token-latency histograms and on the API's 5xx ratio, plus saturation
alerts on KV-cache usage, preemptions and requests the router refuses, and one for a broken metrics
chain.

Every series is picked by namespace and instance (:func:`labkit.production.k8s.series`: the
PodMonitor copies the pod's ``app.kubernetes.io/instance`` label onto it), so two models or two
namespaces never mix. Metric names are vLLM's (``vllm/v1/metrics/loggers.py`` of the pinned
release; counters gain ``_total``, histograms ``_bucket``/``_count``) and
prometheus-fastapi-instrumentator's ``http_requests_total`` (status grouped as ``5xx``), which vLLM's
API server exports; ``tests/test_alerts.py`` checks them against the pinned source and parses
every expression with a PromQL parser.
"""

from __future__ import annotations

from typing import Any

from .k8s import INSTANCE_LABEL, NAMESPACE, PROMETHEUS_RELEASE, labels, series

# The latency SLOs: thresholds must be bucket bounds of vLLM's histograms (vllm/v1/metrics/buckets.py),
# or "requests under the threshold" cannot be read from the buckets. 99% of first tokens within
# 2.5 s; 99% of gaps between tokens within 100 ms (10 tokens/s while streaming); 99.5% of API
# requests without a 5xx.
TTFT_SLO_S = 2.5
ITL_SLO_S = 0.1
SLOS: dict[str, dict[str, Any]] = {
    "ttft": {"alert": "TTFT", "objective": 0.99, "histogram": "vllm:time_to_first_token_seconds",
             "le": TTFT_SLO_S, "what": f"time to first token over {TTFT_SLO_S:g} s"},
    "itl": {"alert": "ITL", "objective": 0.99, "histogram": "vllm:inter_token_latency_seconds",
            "le": ITL_SLO_S, "what": f"inter-token latency over {ITL_SLO_S * 1000:g} ms"},
    "errors": {"alert": "Error", "objective": 0.995, "what": "API responses with a 5xx status"},
}
# (severity, burn rate, long window, short window, for): 14.4x burns 2% of a 30-day budget in an
# hour, 6x burns 5% in six hours (the workbook's page and ticket tiers). Both windows must burn:
# the long one for significance, the short one so the alert clears soon after the burn stops.
BURN_TIERS = (("page", 14.4, "1h", "5m", "2m"), ("ticket", 6.0, "6h", "30m", "15m"))
KV_USAGE_WARN = 0.95  # vllm:kv_cache_usage_perc is a fraction: 1 means full
# The router's (labkit.production.routing) queue-time histogram, by outcome: requests it gave up on.
ROUTER_QUEUE_WAIT = "inference_extension_flow_control_request_queue_duration_seconds"
ROUTER_DROPS = "EvictedTTL|RejectedCapacity"
BY = f"namespace, {INSTANCE_LABEL}"


def record_name(sli: str, window: str) -> str:
    return f"labkit:vllm_{sli}_bad:ratio_rate{window}"


def bad_ratio(sli: str, sel: str, window: str) -> str:
    """PromQL: the fraction of ``sli``'s events over ``window`` that missed the objective."""
    if sli == "errors":
        return (f'sum by ({BY}) (rate(http_requests_total{{{sel},status="5xx"}}[{window}]))\n'
                f'/\nsum by ({BY}) (rate(http_requests_total{{{sel}}}[{window}]))')
    h, le = SLOS[sli]["histogram"], SLOS[sli]["le"]
    return (f'1 - (\n  sum by ({BY}) (rate({h}_bucket{{{sel},le="{le:g}"}}[{window}]))\n'
            f'  /\n  sum by ({BY}) (rate({h}_count{{{sel}}}[{window}]))\n)')


def burn_alert(sli: str, tier: tuple[str, float, str, str, str]) -> dict[str, Any]:
    severity, rate, long, short, wait = tier
    budget = 1 - SLOS[sli]["objective"]
    limit = f"{rate * budget:.4g}"
    return {
        "alert": f"VLLM{SLOS[sli]['alert']}BudgetBurn" + ("Fast" if severity == "page" else "Slow"),
        "expr": f"{record_name(sli, long)} > {limit}\nand\n{record_name(sli, short)} > {limit}",
        "for": wait, "labels": {"severity": severity},
        "annotations": {
            "summary": f"{SLOS[sli]['what']}: error budget burning {rate:g}x too fast",
            "description": f"{{{{ $labels.{INSTANCE_LABEL} }}}} in {{{{ $labels.namespace }}}}: more than "
                           f"{rate * budget:.2%} of events ({SLOS[sli]['what']}) over {long} and {short}; "
                           f"the objective is {SLOS[sli]['objective']:.1%} over 30 days."}}


def prometheus_rule(name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The ``PrometheusRule`` for deployment ``name`` in ``namespace``: recording rules for each
    SLI's bad-event ratio over each window the burn tiers use, the burn-rate alerts, and warnings on
    KV-cache usage, preemptions and absent metrics. Labelled for kube-prometheus-stack's default
    ``ruleSelector`` (``release``)."""
    sel = series(name, namespace)
    windows = sorted({w for t in BURN_TIERS for w in t[2:4]}, key=lambda w: (w[-1] != "m", int(w[:-1])))
    records = [{"record": record_name(sli, w), "expr": bad_ratio(sli, sel, w)}
               for sli in SLOS for w in windows]
    burns = [burn_alert(sli, tier) for sli in SLOS for tier in BURN_TIERS]
    per_pod = f"{BY}, pod"
    saturation = [
        {"alert": "VLLMKVCacheNearlyFull",
         "expr": f"max by ({per_pod}) (vllm:kv_cache_usage_perc{{{sel}}}) > {KV_USAGE_WARN}",
         "for": "15m", "labels": {"severity": "warning"},
         "annotations": {"summary": "KV cache over 95% for 15 minutes: new requests queue, running ones "
                                    "get preempted; add replicas or lower --max-num-seqs"}},
        {"alert": "VLLMPreempting",
         "expr": f"sum by ({per_pod}) (rate(vllm:num_preemptions_total{{{sel}}}[10m])) > 0",
         "for": "15m", "labels": {"severity": "warning"},
         "annotations": {"summary": "vLLM keeps preempting requests (KV cache exhausted): their "
                                    "work is recomputed, latency climbs"}},
        {"alert": "VLLMRouterDropping",
         "expr": f'sum by ({BY}) (rate({ROUTER_QUEUE_WAIT}_count{{{sel},outcome=~"{ROUTER_DROPS}"}}[10m]))'
                 " > 0",
         "for": "10m", "labels": {"severity": "warning"},
         "annotations": {"summary": "the router refuses requests (queue wait past its TTL, or queue full): "
                                    "they never reach vLLM, so the 5xx ratio above misses them; add "
                                    "replicas"}},
        {"alert": "VLLMMetricsAbsent",
         "expr": f"absent(vllm:num_requests_running{{{sel}}})",
         "for": "10m", "labels": {"severity": "warning"},
         "annotations": {"summary": "no vLLM metrics from this deployment for 10 minutes: the "
                                    "autoscaler and every alert above are blind (PodMonitor, scrape?)"}},
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**labels(name), "release": PROMETHEUS_RELEASE}},
        "spec": {"groups": [{"name": f"{name}-slo-records", "interval": "30s", "rules": records},
                            {"name": f"{name}-slo-alerts", "rules": burns},
                            {"name": f"{name}-saturation", "rules": saturation}]},
    }


def expressions(rule: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a ``PrometheusRule``."""
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
