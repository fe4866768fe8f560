"""The router, the canary rollout and the warm pool of deploy/k8s (labkit.production.routing,
canary, warm_pool; chapter 08): they do what chapter 08's simulations assume (one shared queue to the
least-loaded replica; the canary's steps and criteria), their custom resources pass their CRDs'
schemas, and each rule of labkit.production.k8s_checks fails on the mistake it exists for."""

import copy
import inspect

import jsonschema
import pytest
import yaml
from k8s_schemas import validate

from labkit.llm.architecture import load_config
from labkit.production import canary, deploy, k8s, k8s_checks, k8s_pod, k8s_rules, rollout, routing

QWEN = load_config("Qwen3-4B")
CORE = ("vllm.yaml", "storage.yaml", "alerts.yaml", "routing.yaml", "observability.yaml")
VERSION = "1.37.0"


def _files(**kw):
    return deploy.bundle("Qwen/Qwen3-4B", QWEN, gpu="L4", **kw)


def _config(opt=None, **kw):
    b = _files(**kw)
    return k8s_checks.applied(*(b[f] for f in CORE), *([b[f"optional/{opt}.yaml"]] if opt else []))


def _one(docs, kind, name=None):
    found = k8s_checks.servers(docs) if kind == "Deployment" and name is None else [
        d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    (doc,) = found
    return doc


def _server_args(docs):
    c = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return k8s_rules.flags(c["args"])


def test_the_router_is_one_fifo_queue_to_the_least_loaded_replica():
    """What chapter 08's fleet simulation dispatches by (labkit.production.fleet)."""
    docs = _config()
    cfg = yaml.safe_load(_one(docs, "ConfigMap", "qwen3-4b-epp")["data"]["epp.yaml"])
    assert cfg["apiVersion"] == routing.EPP_CONFIG_API and cfg["kind"] == "EndpointPickerConfig"
    assert cfg["featureGates"] == ["flowControl"]  # requests wait in the picker, not inside a replica
    plugins = {p["type"]: p.get("parameters", {}) for p in cfg["plugins"]}
    # each replica holds at most its --max-num-seqs slots; the rest waits in one queue
    assert plugins["concurrency-detector"] == {"concurrencyMode": "requests", "headroom": 0.0,
                                               "maxConcurrency": int(_server_args(docs)["--max-num-seqs"])}
    assert cfg["saturationDetector"] == {"pluginRef": "concurrency-detector"}
    # the head of the queue goes to the replica running the fewest requests
    profile = [p["pluginRef"] for p in cfg["schedulingProfiles"][0]["plugins"]]
    assert profile == ["concurrency-detector", "running-requests-size-scorer", "max-score-picker"]
    # first come first served is the flow-control default: no ordering policy is named to change it
    assert cfg["flowControl"] == {"defaultRequestTTL": "120s"}
    assert {"metrics-data-source", "core-metrics-extractor"} <= set(plugins)  # running requests, scraped
    pool = _one(docs, "InferencePool")
    server = _one(docs, "Deployment")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == server["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["targetPorts"] == [{"number": k8s_pod.PORT}]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    epp = _one(docs, "Deployment", "qwen3-4b-epp")["spec"]["template"]["spec"]
    assert epp["containers"][0]["image"] == routing.EPP_IMAGE and not routing.EPP_IMAGE.endswith(":latest")
    grace = server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert epp["terminationGracePeriodSeconds"] == grace
    route = _one(docs, "HTTPRoute")
    (rule,) = route["spec"]["rules"]
    backends = [(b["kind"], b["name"], b["weight"]) for b in rule["backendRefs"]]
    assert backends == [("InferencePool", "qwen3-4b", 100)]
    # a request may wait its TTL in the queue, then stream for the drain's length
    assert rule["timeouts"]["request"] == f"{routing.QUEUE_TTL_S + k8s.SHUTDOWN_TIMEOUT_S}s"
    gw = _one(docs, "Gateway")
    assert gw["spec"]["infrastructure"]["labels"] == k8s.GATEWAY_LABELS  # what the NetworkPolicies admit
    assert gw["spec"]["listeners"][0]["allowedRoutes"]["namespaces"]["selector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": k8s.NAMESPACE}
    # the health/metrics Service stays
    assert _one(docs, "Service", "qwen3-4b")["spec"]["ports"][0]["port"] == k8s_pod.PORT


def test_the_canary_runs_the_simulations_plan():
    """Chapter 08's rollout simulation's default steps are the canary's weights and pause."""
    defaults = inspect.signature(rollout.rollout).parameters
    assert tuple(round(100 * s) for s in defaults["splits"].default) == (*canary.WEIGHTS, 100)
    assert defaults["step_s"].default == canary.STEP_PAUSE_S
    ro = _one(_files()["optional/canary.yaml"], "Rollout")
    steps = ro["spec"]["strategy"]["canary"]["steps"]
    assert [s["setWeight"] for s in steps if "setWeight" in s] == list(canary.WEIGHTS)
    assert [s["pause"]["duration"] for s in steps if "pause" in s] == [f"{canary.STEP_PAUSE_S}s"] * 3
    # the criteria: the 5xx SLO's budget; a ratio of errors needs 1/limit requests to be read
    assert canary.ERROR_RATIO_LIMIT == pytest.approx(0.005)
    assert canary.MIN_REQUESTS == 200 and canary.MIN_REQUESTS * canary.ERROR_RATIO_LIMIT == pytest.approx(1)


def test_the_canary_takes_over_the_deployment_and_rolls_back_on_its_criteria():
    docs = _config("canary")
    ro, server = _one(docs, "Rollout"), _one(docs, "Deployment")
    assert ro["spec"]["workloadRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": server["metadata"]["name"], "scaleDown": "onsuccess"}
    assert "replicas" not in ro["spec"] and ro["spec"]["selector"] == server["spec"]["selector"]
    assert ro["spec"]["progressDeadlineSeconds"] > deploy.startup_budget_s([server])  # a cold start fits
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                             "name": "qwen3-4b"}
    c = ro["spec"]["strategy"]["canary"]
    route = _one(docs, "HTTPRoute")
    plugin = c["trafficRouting"]["plugins"]["argoproj-labs/gatewayAPI"]
    assert plugin == {"httpRoute": route["metadata"]["name"], "namespace": k8s.NAMESPACE}
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        (c["stableService"], 100), (c["canaryService"], 0)]
    track = {p["metadata"]["name"]: p["spec"]["selector"]["matchLabels"][routing.TRACK_LABEL]
             for p in docs if p["kind"] == "InferencePool"}
    assert track[c["stableService"]] == "stable" == c["stableMetadata"]["labels"][routing.TRACK_LABEL]
    assert track[c["canaryService"]] == "canary" == c["canaryMetadata"]["labels"][routing.TRACK_LABEL]
    judge = _one(docs, "AnalysisTemplate", "qwen3-4b-canary")
    metrics = {m["name"]: m for m in judge["spec"]["metrics"]}
    limits = {"error-ratio": canary.ERROR_RATIO_LIMIT, "ttft-p99-vs-stable": canary.TTFT_P99_RATIO_LIMIT}
    for m, limit in limits.items():
        assert metrics[m]["failureCondition"] == f"len(result) > 0 && result[0] > {limit:g}"
        assert metrics[m]["failureLimit"] == canary.FAILURE_LIMIT
        assert metrics[m]["interval"] == f"{canary.ANALYSIS_INTERVAL_S}s"
    assert c["analysis"]["templates"] == [{"templateName": "qwen3-4b-canary"}]
    assert c["analysis"]["startingStep"] == 1  # from the first pause, with the canary at 5%
    assert {a["valueFrom"]["podTemplateHashValue"] for a in c["analysis"]["args"]} == {"Latest", "Stable"}
    step = {m["name"]: m for m in _one(docs, "AnalysisTemplate", "qwen3-4b-canary-served")["spec"]["metrics"]}
    assert {m["count"] for m in step.values()} == {1}
    assert step["canary-served"]["failureCondition"] == "len(result) == 0 || result[0] < 1"
    # the evidence reads windows of the judge's length that lie wholly in the step, at its end
    judged = step["canary-judged"]
    assert str(canary.MIN_REQUESTS) in judged["successCondition"]
    query = judged["provider"]["prometheus"]["query"]
    assert f"[{canary.WINDOW}]" in query and f"[{canary.JUDGED_SPAN_S}s:{canary.SAMPLE_S}s]" in query
    assert canary.WINDOW_S + canary.JUDGED_SPAN_S == canary.STEP_PAUSE_S
    assert canary.ANALYSIS_INTERVAL_S <= canary.JUDGED_SPAN_S   # a measurement falls in that span


def test_the_warm_pool_holds_a_servers_node_below_every_server():
    docs = _config("warm-pool")
    server, held = _one(docs, "Deployment"), _one(docs, "Deployment", "qwen3-4b-warm-pool")
    pc = _one(docs, "PriorityClass")
    assert pc["value"] < 0 and pc["preemptionPolicy"] == "Never" and pc["globalDefault"] is False
    pod, mine = held["spec"]["template"]["spec"], server["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == pc["metadata"]["name"] and "priorityClassName" not in mine
    (c,), (s,) = pod["containers"], mine["containers"]
    # the same image (so the node has pulled it), requests, GPU type and taint tolerations
    assert c["image"] == s["image"] and c["resources"] == s["resources"]
    assert c["command"] == ["sleep", "infinity"]
    assert pod["affinity"] == mine["affinity"] and pod["tolerations"] == mine["tolerations"]
    assert pod["terminationGracePeriodSeconds"] == 0 and held["spec"]["replicas"] == 1
    # not the server's pods: no Service, PDB, pool or autoscaler picks them
    held_labels = held["spec"]["template"]["metadata"]["labels"]
    assert not server["spec"]["selector"]["matchLabels"].items() <= held_labels.items()
    assert _files(warm_replicas=3)["optional/warm-pool.yaml"][1]["spec"]["replicas"] == 3
    with pytest.raises(ValueError, match="replicas"):
        _files(warm_replicas=0)


@pytest.mark.parametrize("opt", [None, "canary", "loadtest", "warm-pool"])
def test_every_object_passes_its_schema_strictly(opt):
    for doc in _files()[f"optional/{opt}.yaml"] if opt else [d for f in CORE for d in _files()[f]]:
        if doc["kind"] != "DestinationRule":  # Istio's, checked in test_deploy.py by hand
            validate(doc, VERSION)


@pytest.mark.parametrize("kind, path, typo", [
    ("InferencePool", ("spec",), "selectors"),
    ("HTTPRoute", ("spec", "rules", 0), "backendRef"),
    ("Gateway", ("spec",), "gatewayClass"),
    ("Rollout", ("spec", "strategy", "canary"), "step"),
    ("AnalysisTemplate", ("spec", "metrics", 0), "failureLimt"),
])
def test_a_typo_in_a_custom_resource_fails_its_schema(kind, path, typo):
    doc = copy.deepcopy(next(d for d in _config("canary") if d["kind"] == kind))
    node = doc
    for key in path:
        node = node[key]
    node[typo] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, VERSION)


def test_the_gateway_class_decides_the_istio_tls_rule():
    assert [d["kind"] for d in _files()["routing.yaml"]].count("DestinationRule") == 1
    other = _files(gateway_class="gke-l7-rilb")
    kinds = [d["kind"] for f in ("routing.yaml", "optional/canary.yaml") for d in other[f]]
    assert "DestinationRule" not in kinds
    assert _one(other["routing.yaml"], "Gateway")["spec"]["gatewayClassName"] == "gke-l7-rilb"
    with pytest.raises(ValueError, match="max-num-seqs"):
        routing.epp_config(0)


# Planted mistakes: each is what a hand edit of the files could do; the rule must name it.
def _route_to_missing_pool(docs):
    _one(docs, "HTTPRoute")["spec"]["rules"][0]["backendRefs"][0]["name"] = "qwen3-4b-v2"


def _route_to_missing_gateway(docs):
    _one(docs, "HTTPRoute")["spec"]["parentRefs"][0]["name"] = "public"


def _pool_selects_other_pods(docs):
    _one(docs, "InferencePool")["spec"]["selector"]["matchLabels"] = {"app": "vllm"}


def _pool_wrong_port(docs):
    _one(docs, "InferencePool")["spec"]["targetPorts"] = [{"number": 8080}]


def _pool_without_picker(docs):
    _one(docs, "InferencePool")["spec"]["endpointPickerRef"]["name"] = "epp"


def _picker_of_other_pool(docs):
    args = _one(docs, "Deployment", "qwen3-4b-epp")["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--pool-name") + 1] = "other"


def _epp_config(docs, change):
    cm = _one(docs, "ConfigMap", "qwen3-4b-epp")
    cfg = yaml.safe_load(cm["data"]["epp.yaml"])
    change(cfg)
    cm["data"]["epp.yaml"] = yaml.safe_dump(cfg)


def _no_flow_control(docs):
    _epp_config(docs, lambda c: c.pop("featureGates"))


def _cap_not_slots(docs):
    _epp_config(docs, lambda c: c["plugins"][2]["parameters"].update(maxConcurrency=100))  # its default


def _server_closed_to_picker(docs):
    (rule,) = _one(docs, "NetworkPolicy", "qwen3-4b")["spec"]["ingress"]
    rule["from"] = [p for p in rule["from"]
                    if p["podSelector"]["matchLabels"].get("app.kubernetes.io/name") != "epp"]


def _peer_without_namespace(docs):
    (rule,) = _one(docs, "NetworkPolicy", "qwen3-4b")["spec"]["ingress"]
    del rule["from"][0]["namespaceSelector"]  # a "gateway" pod of the default namespace would be admitted


def _peer_namespace_only(docs):
    (rule,) = _one(docs, "NetworkPolicy", "qwen3-4b")["spec"]["ingress"]
    del rule["from"][2]["podSelector"]  # every pod of the monitoring namespace would be admitted


def _two_pools_same_pods(docs):
    pool = _one(docs, "InferencePool", "qwen3-4b-canary")
    pool["spec"]["selector"]["matchLabels"][routing.TRACK_LABEL] = "stable"


def _rollout_without_analysis(docs):
    c = _one(docs, "Rollout")["spec"]["strategy"]["canary"]
    del c["analysis"]
    c["steps"] = [s for s in c["steps"] if "analysis" not in s]


def _analysis_without_failure(docs):
    for m in _one(docs, "AnalysisTemplate", "qwen3-4b-canary")["spec"]["metrics"]:
        del m["failureCondition"]


def _analysis_missing(docs):
    docs[:] = [d for d in docs if d["metadata"]["name"] != "qwen3-4b-canary-served"]


def _rollout_keeps_deployment(docs):
    _one(docs, "Rollout")["spec"]["workloadRef"]["scaleDown"] = "never"


def _hpa_left_on_deployment(docs):
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen3-4b"}
    _one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"] = target


def _rollout_replicas(docs):
    _one(docs, "Rollout")["spec"]["replicas"] = 2


def _rollout_without_routing(docs):
    del _one(docs, "Rollout")["spec"]["strategy"]["canary"]["trafficRouting"]


def _canary_route_misses_canary(docs):
    rule = _one(docs, "HTTPRoute")["spec"]["rules"][0]
    rule["backendRefs"] = rule["backendRefs"][:1]


def _canary_service_missing(docs):
    docs[:] = [d for d in docs if not (d["kind"] == "Service" and d["metadata"]["name"] == "qwen3-4b-canary")]


def _placeholder_outranks(docs):
    _one(docs, "PriorityClass")["value"] = 0


def _placeholder_no_gpu(docs):
    held = _one(docs, "Deployment", "qwen3-4b-warm-pool")["spec"]["template"]["spec"]["containers"][0]
    del held["resources"]["requests"]["nvidia.com/gpu"]


@pytest.mark.parametrize("opt, break_it, named", [
    (None, _route_to_missing_pool, "points at InferencePool qwen3-4b-v2, which does not exist"),
    (None, _route_to_missing_gateway, "parent Gateway public"),
    (None, _pool_selects_other_pods, "does not select the vLLM pods"),
    (None, _pool_wrong_port, "targets a port the server does not listen on"),
    (None, _pool_without_picker, "endpoint picker Service epp does not exist"),
    (None, _picker_of_other_pool, "no endpoint picker behind Service qwen3-4b-epp serves InferencePool"),
    (None, _no_flow_control, "runs without flow control"),
    (None, _cap_not_slots, "caps a replica at [100] requests in flight; the server runs --max-num-seqs 16"),
    (None, _server_closed_to_picker, "lets the endpoint picker of qwen3-4b reach the server's /metrics"),
    (None, _peer_without_namespace, "admits a peer without both a namespaceSelector and a podSelector"),
    (None, _peer_namespace_only, "admits a peer without both a namespaceSelector and a podSelector"),
    ("canary", _two_pools_same_pods, "select the same pods"),
    ("canary", _rollout_without_analysis, "has no rollback criterion"),
    ("canary", _analysis_without_failure, "metric error-ratio has no failureCondition"),
    ("canary", _analysis_missing, "refers to AnalysisTemplate qwen3-4b-canary-served, which does not exist"),
    ("canary", _rollout_keeps_deployment, "two fleets serve"),
    ("canary", _hpa_left_on_deployment, "the fleet is no longer autoscaled"),
    ("canary", _rollout_replicas, "replicas set in a Rollout an autoscaler owns"),
    ("canary", _rollout_without_routing, "routes no traffic"),
    ("canary", _canary_route_misses_canary, "has no backend named qwen3-4b-canary"),
    ("canary", _canary_service_missing, "canaryService qwen3-4b-canary does not exist"),
    ("warm-pool", _placeholder_outranks, "is not below the servers' 0"),
    ("warm-pool", _placeholder_no_gpu, "does not hold a server's GPUs"),
])
def test_each_routing_and_canary_rule_fails_on_its_mistake(opt, break_it, named):
    docs = copy.deepcopy(_config(opt))
    assert k8s_checks.problems(docs) == []
    break_it(docs)
    found = k8s_checks.problems(docs)
    assert any(named in p for p in found), found


def test_applied_replaces_same_named_objects_in_order():
    a = {"kind": "HTTPRoute", "metadata": {"namespace": "n", "name": "r"}, "v": 1}
    b = {**a, "v": 2}
    c = {"kind": "Service", "metadata": {"namespace": "n", "name": "r"}}
    assert k8s_checks.applied([a, c], [b]) == [b, c]
