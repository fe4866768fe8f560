"""deploy/k8s/alerts.yaml (labkit.production.alerts, chapter 08): every PromQL expression the
manifests ship (alerts, recording rules, KEDA's queries, the adapter's series queries, the canary's
analysis, the dashboard) parses with a real PromQL parser, picks this deployment's series only, and
names metrics the pinned vLLM release exports (or, for the router's and the GPU's, the metrics listed
with their source in tests/data/external_metrics.json); the burn-rate tiers are the SRE workbook's."""

import ast
import json
import re

import promql_parser
import pytest
import yaml

from labkit.llm.architecture import load_config
from labkit.paths import REPO
from labkit.production import alerts, dashboard, deploy, k8s, warm_pool

QWEN = load_config("Qwen3-4B")
FILES = deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu="L4")
RULE = FILES["alerts.yaml"][0]
# Metrics that are not vLLM's, each with the file of the release that defines it.
EXTERNAL = json.loads((REPO / "tests" / "data" / "external_metrics.json").read_text())["metrics"]


def parse(expr: str):
    """The expression's syntax tree; ValueError when it is not PromQL."""
    return promql_parser.parse(expr)


def selectors(expr: str) -> list[tuple[str | None, dict[str, str]]]:
    """(metric name, {label: value}) of every series selector in ``expr``; a negative matcher's label is
    keyed with its operator (``pod!~``), so it cannot hide a positive one."""
    found: list[tuple[str | None, dict[str, str]]] = []
    negative = {"MatchOp.NotEqual": "!=", "MatchOp.NotRe": "!~"}

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            matchers = node.matchers.matchers
            found.append((node.name, {m.name + negative.get(str(m.op), ""): m.value for m in matchers}))

    promql_parser.walk(parse(expr), visit)
    return found


def analysis_queries():
    """The canary's Prometheus queries, their Argo arguments filled in ({{args.x}} is not PromQL)."""
    templates = [d for d in FILES["optional/canary.yaml"] if d["kind"] == "AnalysisTemplate"]
    return [re.sub(r"\{\{args\.([a-z-]+)\}\}", r"hash-\1", m["provider"]["prometheus"]["query"])
            for d in templates for m in d["spec"]["metrics"]]


def scoped_queries():
    """Every query that must pick this deployment's series: the rules, KEDA's triggers, the canary's
    analysis and the dashboard's vLLM panels."""
    (keda,) = FILES["optional/keda-scaledobject.yaml"]
    (board,) = FILES["dashboards/vllm-qwen3-4b.json"]
    return (alerts.expressions(RULE) + [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
            + analysis_queries() + dashboard.queries(board))


def every_query():
    (adapter,) = FILES["optional/prometheus-adapter-values.yaml"]
    rules = adapter["rules"]["custom"] + adapter["rules"]["external"]
    return scoped_queries() + [r["seriesQuery"] for r in rules]


def test_every_expression_parses_and_a_broken_one_does_not():
    exprs = every_query()
    assert len(exprs) >= 40
    for expr in exprs:
        parse(expr)  # raises on a syntax error
    for broken in ("sum(rate(vllm:num_preemptions_total[5m])",  # unclosed parenthesis
                   "rate(vllm:num_preemptions_total)",  # rate needs a range
                   'vllm:kv_cache_usage_perc{namespace="a"} >',  # missing right-hand side
                   "labkit:vllm_ttft_bad:ratio_rate1h > 0.1 and and x"):
        with pytest.raises(ValueError):
            parse(broken)


def test_every_selector_picks_this_deployment_only():
    name, ns = "qwen3-4b", k8s.NAMESPACE
    recorded = {r["record"] for g in RULE["spec"]["groups"] for r in g["rules"] if "record" in r}
    for expr in scoped_queries():
        for metric, matchers in selectors(expr):
            if metric in recorded:
                continue  # a recording rule of this PrometheusRule, filtered where it is computed
            if metric and metric.startswith("DCGM_"):  # the exporter labels a GPU with the pod using it
                assert (matchers["namespace"], matchers["pod"]) == (ns, f"{name}-.*"), expr
                assert matchers["pod!~"] == f"{warm_pool.pool_name(name)}-.*", expr  # placeholders hold GPUs
                continue
            picked = (matchers.get("namespace"), matchers.get(k8s.INSTANCE_LABEL))
            assert picked == (ns, name), (metric, expr)
    for expr in analysis_queries():  # the canary's and the stable version's pods, told apart
        assert all("rollouts_pod_template_hash" in m for _, m in selectors(expr)), expr
    # the PodMonitor copies the label the filters use onto every scraped series
    pm = [d for d in FILES["vllm.yaml"] if d["kind"] == "PodMonitor"][0]
    assert pm["spec"]["podTargetLabels"] == ["app.kubernetes.io/instance", "rollouts-pod-template-hash"]
    assert [re.sub(r"[./-]", "_", x) for x in pm["spec"]["podTargetLabels"]] == [
        k8s.INSTANCE_LABEL, "rollouts_pod_template_hash"]
    epp = [d for d in FILES["routing.yaml"] if d["kind"] == "PodMonitor"][0]  # the router's queue
    assert epp["spec"]["podTargetLabels"] == ["app.kubernetes.io/instance"]


def test_alerts_use_recorded_ratios_and_the_workbook_burn_rates():
    groups = {g["name"]: g["rules"] for g in RULE["spec"]["groups"]}
    recorded = {r["record"] for r in groups["qwen3-4b-slo-records"]}
    burns = groups["qwen3-4b-slo-alerts"]
    assert len(burns) == len(alerts.SLOS) * len(alerts.BURN_TIERS) == 6
    for rule in burns:
        used = [m for m, _ in selectors(rule["expr"])]
        assert len(used) == 2 and set(used) <= recorded, rule["expr"]
        limits = [float(x) for x in re.findall(r">\s*([\d.]+)", rule["expr"])]
        sli = next(k for k, v in alerts.SLOS.items() if v["alert"] in rule["alert"])
        rate = 14.4 if rule["labels"]["severity"] == "page" else 6.0
        assert limits == [pytest.approx(rate * (1 - alerts.SLOS[sli]["objective"]))] * 2
    names = {r["alert"] for g in groups.values() for r in g if "alert" in r}
    # the router's refusals: outcome values of its queue-time histogram (listed with their source)
    outcomes = EXTERNAL[f"{alerts.ROUTER_QUEUE_WAIT}_count"]
    assert all(o in outcomes for o in alerts.ROUTER_DROPS.split("|"))
    assert {"VLLMKVCacheNearlyFull", "VLLMPreempting", "VLLMRouterDropping", "VLLMMetricsAbsent",
            "VLLMErrorBudgetBurnFast", "VLLMTTFTBudgetBurnSlow", "VLLMITLBudgetBurnFast"} <= names
    assert RULE["metadata"]["labels"]["release"] == k8s.PROMETHEUS_RELEASE  # the stack loads it
    committed = yaml.safe_load((REPO / "deploy" / "k8s" / "alerts.yaml").read_text())
    assert committed == RULE


def _vllm_source():
    found = sorted(REPO.glob(".venv-vllm/lib/python3*/site-packages/vllm"))
    return found[0] if found else None


@pytest.mark.skipif(_vllm_source() is None, reason="the lab's vLLM venv is absent (make serve-setup)")
def test_metric_names_and_buckets_exist_in_the_pinned_vllm_release():
    src = _vllm_source()
    loggers = (src / "v1" / "metrics" / "loggers.py").read_text()
    instrumentator = src.parent / "prometheus_fastapi_instrumentator"
    recorded = {r["record"] for g in RULE["spec"]["groups"] for r in g["rules"] if "record" in r}
    for expr in every_query():
        for metric, _ in selectors(expr):
            if metric in recorded:
                continue
            if metric in EXTERNAL:  # the router's and the GPU exporter's, listed with their source
                continue
            if metric == "http_requests_total":  # vLLM's API server mounts the instrumentator's defaults
                assert '"http_requests_total"' in (instrumentator / "metrics.py").read_text()
                mounted = src / "entrypoints" / "serve" / "instrumentator" / "metrics.py"
                assert "Instrumentator(" in mounted.read_text()
                continue
            base = re.sub(r"_(bucket|count|sum|total)$", "", metric or "")
            assert f'name="{metric}"' in loggers or f'name="{base}"' in loggers, metric
    # grouped status codes ("5xx"), the instrumentator's default
    assert "should_group_status_codes: bool = True" in (instrumentator / "middleware.py").read_text()
    # an SLO threshold must be a bucket bound, or the buckets cannot say how many requests met it
    tree = ast.parse((src / "v1" / "metrics" / "buckets.py").read_text())
    bounds = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.AnnAssign | ast.Assign)
              for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets)
              if isinstance(t, ast.Name) and t.id.endswith("_BUCKETS") and isinstance(n.value, ast.Tuple)}
    assert alerts.TTFT_SLO_S in bounds["TIME_TO_FIRST_TOKEN_BUCKETS"]
    assert alerts.ITL_SLO_S in bounds["INTER_TOKEN_LATENCY_BUCKETS"]
