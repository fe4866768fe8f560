"""The router's, the canary's and the warm pool's rules for chapter 08's deploy manifests, and the
document helpers every rule uses (:mod:`labkit.production.k8s_checks` holds the server's rules and
calls these): :func:`routing_problems` (:mod:`labkit.production.routing`), :func:`canary_problems`
(:mod:`labkit.production.canary`), :func:`warm_pool_problems` (:mod:`labkit.production.warm_pool`).
Each returns the rules a configuration breaks, as sentences.
"""

from __future__ import annotations

from typing import Any

import yaml


def flags(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line (a flag without a value maps to ``""``)."""
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            key, eq, val = a.partition("=")
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[key] = val if eq else ("" if nxt.startswith("--") else nxt)
    return out


def selects(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    return bool(selector.get("matchLabels")) and selector["matchLabels"].items() <= pod_labels.items()


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def server_container(dep: dict[str, Any]) -> dict[str, Any]:
    pod = dep["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "vllm"] or pod["containers"][:1]
    return c


def _backends(route: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for rule in route["spec"].get("rules", []) for b in rule.get("backendRefs", [])]


def _epp_config(docs: list[dict[str, Any]], epp: dict[str, Any]) -> dict[str, Any]:
    """The EndpointPickerConfig an endpoint-picker Deployment reads (its ConfigMap, by --config-file)."""
    pod = epp["spec"]["template"]["spec"]
    path = flags(pod["containers"][0].get("args", [])).get("--config-file", "")
    mount = {m["name"]: m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])}
    for v in pod.get("volumes", []):
        if "configMap" in v and path.startswith(mount.get(v["name"], "?") + "/"):
            for cm in of_kind(docs, "ConfigMap"):
                if cm["metadata"]["name"] == v["configMap"]["name"]:
                    return dict(yaml.safe_load(cm["data"][path.rsplit("/", 1)[1]]))
    return {}


def routing_problems(docs: list[dict[str, Any]], server: dict[str, Any]) -> list[str]:
    """The router's rules: every HTTPRoute's Gateway and InferencePools exist; each pool selects
    vLLM pods on their port, one track each, and names a Service in front of an endpoint picker of
    that pool; the picker runs flow control with each replica capped at its ``--max-num-seqs`` (the
    shared queue chapter 08's simulation dispatches from); the server admits the picker."""
    out: list[str] = []
    pools = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in of_kind(docs, "InferencePool")}
    gateways = {(g["metadata"]["namespace"], g["metadata"]["name"]) for g in of_kind(docs, "Gateway")}
    for route in of_kind(docs, "HTTPRoute"):
        ns, rname = route["metadata"]["namespace"], route["metadata"]["name"]
        for parent in route["spec"].get("parentRefs", []):
            key = (parent.get("namespace", ns), parent["name"])
            if gateways and parent.get("kind", "Gateway") == "Gateway" and key not in gateways:
                out.append(f"HTTPRoute {rname}'s parent Gateway {key[1]} (namespace {key[0]}) does not exist")
        for b in _backends(route):
            if b.get("kind") == "InferencePool" and (b.get("namespace", ns), b["name"]) not in pools:
                out.append(f"HTTPRoute {rname} points at InferencePool {b['name']}, which does not exist")
    template = server["spec"]["template"]
    selector = server["spec"]["selector"]["matchLabels"]
    ports = {p["containerPort"] for p in server_container(server)["ports"]}
    slots = flags(server_container(server).get("args", [])).get("--max-num-seqs")
    tracks: dict[str, str] = {}
    for (_, pname), pool in pools.items():
        wanted = pool["spec"]["selector"]["matchLabels"]
        # the Deployment's selector, plus at most labels its pods carry (the track, set per pod)
        if not (selector.items() <= wanted.items() and set(wanted) <= set(template["metadata"]["labels"])):
            out.append(f"InferencePool {pname} does not select the vLLM pods ({wanted})")
        track = str(sorted((k, v) for k, v in wanted.items() if k not in selector))
        if track in tracks:
            out.append(f"InferencePools {tracks[track]} and {pname} select the same pods")
        tracks[track] = pname
        if not {t["number"] for t in pool["spec"]["targetPorts"]} <= ports:
            out.append(f"InferencePool {pname} targets a port the server does not listen on")
        ref = pool["spec"].get("endpointPickerRef", {})
        svc = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == ref.get("name")]
        if not svc or ref.get("port", {}).get("number") not in {p["port"] for p in svc[0]["spec"]["ports"]}:
            out.append(f"InferencePool {pname}'s endpoint picker Service {ref.get('name')} does not exist "
                       f"or lacks port {ref.get('port', {}).get('number')}")
            continue
        epps = [d for d in of_kind(docs, "Deployment") if selects({"matchLabels": svc[0]["spec"]["selector"]},
                                                                d["spec"]["template"]["metadata"]["labels"])]
        picks = [flags(e["spec"]["template"]["spec"]["containers"][0]["args"]).get("--pool-name")
                 for e in epps]
        if picks[:1] != [pname]:
            out.append(f"no endpoint picker behind Service {ref['name']} serves InferencePool {pname}")
            continue
        cfg = _epp_config(docs, epps[0])
        if "flowControl" not in cfg.get("featureGates", []):
            out.append(f"endpoint picker of {pname} runs without flow control: requests queue inside "
                       "whichever replica they were sent to, not in one shared queue")
        caps = [p.get("parameters", {}).get("maxConcurrency") for p in cfg.get("plugins", [])
                if p.get("type") == "concurrency-detector"]
        if caps != [int(slots or 0)]:
            out.append(f"endpoint picker of {pname} caps a replica at {caps} requests in flight; the server "
                       f"runs --max-num-seqs {slots}")
        epp_labels = epps[0]["spec"]["template"]["metadata"]["labels"]
        if not any(selects(n["spec"]["podSelector"], template["metadata"]["labels"])
                   and any(selects(peer.get("podSelector", {}), epp_labels)
                           and selects(peer.get("namespaceSelector", {}),
                                        {"kubernetes.io/metadata.name": epps[0]["metadata"]["namespace"]})
                           for rule in n["spec"].get("ingress", []) for peer in rule.get("from", []))
                   for n in of_kind(docs, "NetworkPolicy")):
            out.append(f"no NetworkPolicy lets the endpoint picker of {pname} reach the server's /metrics")
    return out


def canary_problems(docs: list[dict[str, Any]], server: dict[str, Any]) -> list[str]:
    """The canary's rules: the Rollout takes over the Deployment (scaled down, its autoscaler moved to
    the Rollout), splits traffic by weight through the HTTPRoute's two pools, named like its stable
    and canary Services, each pool selecting the pods Argo labels for its track, and has a rollback
    criterion: analysis whose every metric can fail."""
    out: list[str] = []
    name = server["metadata"]["name"]
    templates = {t["metadata"]["name"]: t for t in of_kind(docs, "AnalysisTemplate")}
    for ro in of_kind(docs, "Rollout"):
        rname, spec = ro["metadata"]["name"], ro["spec"]
        ref = spec.get("workloadRef", {})
        if ref and ref.get("name") == name and ref.get("scaleDown", "never") == "never":
            out.append(f"Rollout {rname} leaves Deployment {name} scaled up: two fleets serve")
        for s in docs:
            target = s.get("spec", {}).get("scaleTargetRef", {}) if s.get("kind") in (
                "HorizontalPodAutoscaler", "ScaledObject") else {}
            if ref and target.get("name") == name and target.get("kind", "Deployment") == "Deployment":
                out.append(f"{s['kind']} {s['metadata']['name']} scales Deployment {name}, which Rollout "
                           f"{rname} scales to zero: the fleet is no longer autoscaled")
        can = spec.get("strategy", {}).get("canary")
        if can is None:
            continue
        steps = can.get("steps", [])
        if not any("setWeight" in st for st in steps):
            out.append(f"Rollout {rname}'s canary has no setWeight step")
        refs = [t["templateName"] for t in can.get("analysis", {}).get("templates", [])]
        step_refs = [t["templateName"] for st in steps for t in st.get("analysis", {}).get("templates", [])]
        if not refs and not step_refs:
            out.append(f"Rollout {rname}'s canary has no rollback criterion: no analysis judges it")
        for t in refs + step_refs:
            if t not in templates:
                out.append(f"Rollout {rname} refers to AnalysisTemplate {t}, which does not exist")
                continue
            for m in templates[t]["spec"]["metrics"]:
                if not m.get("failureCondition"):
                    out.append(f"AnalysisTemplate {t}'s metric {m['name']} has no failureCondition: "
                               "nothing it measures rolls the canary back")
        plugin = can.get("trafficRouting", {}).get("plugins", {}).get("argoproj-labs/gatewayAPI")
        if plugin is None:
            out.append(f"Rollout {rname} routes no traffic: without the Gateway API plugin its weights "
                       "become replica counts")
            continue
        routes = [r for r in of_kind(docs, "HTTPRoute") if r["metadata"]["name"] == plugin.get("httpRoute")]
        names = {b["name"] for r in routes for b in _backends(r)}
        for role in ("stableService", "canaryService"):
            svc = can.get(role)
            if svc not in {s["metadata"]["name"] for s in of_kind(docs, "Service")}:
                out.append(f"Rollout {rname}'s {role} {svc} does not exist")
            if svc not in names:
                out.append(f"HTTPRoute {plugin.get('httpRoute')} has no backend named {svc}: the plugin "
                           "cannot set its weight")
            track = "stableMetadata" if role == "stableService" else "canaryMetadata"
            meta = can.get(track, {}).get("labels", {})
            pool = [p for p in of_kind(docs, "InferencePool") if p["metadata"]["name"] == svc]
            if pool and not (meta and meta.items() <= pool[0]["spec"]["selector"]["matchLabels"].items()):
                out.append(f"InferencePool {svc} does not select the pods Rollout {rname} labels {meta} "
                           "alone: its traffic would reach the other track too")
    return out


def warm_pool_problems(docs: list[dict[str, Any]], server: dict[str, Any]) -> list[str]:
    """The warm pool's rules: placeholders sit below the servers' priority (so the scheduler evicts
    them for a server) and ask for what a server asks for, on the same GPU type."""
    out: list[str] = []
    classes = {c["metadata"]["name"]: c["value"] for c in of_kind(docs, "PriorityClass")}
    pod = server["spec"]["template"]["spec"]
    mine = classes.get(pod.get("priorityClassName", ""), 0)
    wanted = server_container(server)["resources"]["requests"]
    for d in of_kind(docs, "Deployment"):
        held = d["spec"]["template"]["spec"]
        if held.get("priorityClassName") not in classes or d is server:
            continue
        if classes[held["priorityClassName"]] >= mine:
            out.append(f"placeholder {d['metadata']['name']}'s priority {classes[held['priorityClassName']]} "
                       f"is not below the servers' {mine}: a new server would not evict it")
        got = held["containers"][0]["resources"]["requests"]
        if got.get("nvidia.com/gpu") != wanted.get("nvidia.com/gpu") \
                or held.get("affinity") != pod.get("affinity"):
            out.append(f"placeholder {d['metadata']['name']} does not hold a server's GPUs on its GPU type")
    return out
