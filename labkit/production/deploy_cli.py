"""Write chapter 08's deploy files (:func:`labkit.production.deploy.bundle`) under a folder, each YAML
file headed by the command that regenerates it; ``.json`` files (the dashboard) as they are.

    python -m labkit.production.deploy_cli --model Qwen/Qwen3-4B --config Qwen3-4B --gpu L4 --out deploy/k8s

The autoscaler's running-requests target can come from a latency SLO instead of the 3/4 rule
(:func:`slo_running_target`): measure one replica of the serving hardware with a closed-loop sweep
(``labkit bench --base-url URL -c 1 2 4 8 16 --out DIR``, chapter 02) and pass
``--running-target-from DIR --slo-ttft-ms ... --slo-tpot-ms ...``.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from ..hardware.catalog import ACCELERATORS
from ..llm.architecture import SHIPPED, load_config
from . import routing
from .deploy import VLLM_IMAGE, bundle, to_yaml
from .k8s import (
    GATEWAY_NAMESPACE,
    NAMESPACE,
    PROMETHEUS_URL,
    SHUTDOWN_TIMEOUT_S,
    default_running_target,
    revision_for,
)


def write(out_dir: str | Path, model_id: str, config: dict[str, Any], prometheus_url: str = PROMETHEUS_URL,
          header: str = "", **kwargs: Any) -> list[Path]:
    """Write :func:`bundle`'s files under ``out_dir``; ``header`` (comment lines) tops each YAML file.
    ``kwargs`` go to :func:`bundle`. Returns the paths written."""
    out = Path(out_dir)
    paths = []
    for rel, docs in bundle(model_id, config, prometheus_url, **kwargs).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = (json.dumps(docs[0], indent=1, sort_keys=True) + "\n" if rel.endswith(".json")
                else header + to_yaml(docs))
        path.write_text(text)
        paths.append(path)
    return paths


def slo_running_target(summaries: list[dict[str, Any]], slo_ttft_ms: float | None = None,
                       slo_tpot_ms: float | None = None, max_num_seqs: int | None = None
                       ) -> tuple[float, str]:
    """Running requests per replica for the HPA from a measured closed-loop sweep (``labkit bench``
    summary JSONs, chapter 02). A replica's capacity is the highest concurrency up to which every
    level met the SLO: every request completed, P99 TTFT and P99 TPOT (ms) within the limits given
    (the first level that misses ends the climb, so a lucky level above a miss never counts); capped
    at ``max_num_seqs``. The target is :func:`labkit.production.k8s.default_running_target` of it
    (three quarters: a replica is added before one is full, since a new one takes minutes to start).
    Returns ``(target, a sentence saying where it came from)``. ``ValueError`` saying what to do when
    no SLO limit is given, ``summaries`` hold no closed-loop run, or the lowest level misses."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        raise ValueError("give at least one SLO limit: --slo-ttft-ms and/or --slo-tpot-ms "
                         "(milliseconds, P99)")
    runs = sorted((s for s in summaries if s.get("mode") == "closed" and s.get("concurrency")),
                  key=lambda s: s["concurrency"])
    if not runs:
        raise ValueError("no closed-loop run among the summaries: measure one replica with "
                         "`labkit bench --base-url URL -c 1 2 4 8 16 --out DIR` and pass that DIR")
    limits = {k: v for k, v in (("ttft", slo_ttft_ms), ("tpot", slo_tpot_ms)) if v is not None}

    def misses(s: dict[str, Any]) -> list[str]:
        out = [f"P99 {k.upper()} {s.get(f'p99_{k}_ms', float('nan')):.0f} ms > {v:g} ms"
               for k, v in limits.items() if not s.get(f"p99_{k}_ms", float("inf")) <= v]
        if s.get("failed") or s.get("completed") != s.get("n_requests"):
            out.append(f"{s.get('completed')} of {s.get('n_requests')} requests completed")
        return out

    first_miss = next(((i, why) for i, s in enumerate(runs) if (why := misses(s))), None)
    if first_miss is not None and first_miss[0] == 0:
        raise ValueError(f"the lowest measured concurrency misses the SLO ({runs[0]['concurrency']} in "
                         f"flight: {'; '.join(first_miss[1])}): a replica of this hardware cannot serve "
                         "it; relax the SLO, or measure faster hardware or a smaller model")
    best = runs[-1 if first_miss is None else first_miss[0] - 1]["concurrency"]
    cap = best if max_num_seqs is None else min(best, max_num_seqs)
    target = default_running_target(cap)
    slo = " and ".join(f"P99 {k.upper()} <= {v:g} ms" for k, v in limits.items())
    until = (" (the highest measured: measure higher to find the limit)" if first_miss is None
             else f" ({runs[first_miss[0]]['concurrency']} missed: {'; '.join(first_miss[1])})")
    return target, (f"every level up to {best} in flight met {slo}{until}"
                    + (f", capped at --concurrency {max_num_seqs}" if cap < best else "")
                    + f"; target 3/4 of {cap}, rounded (at least 1): {target:g} running requests per replica")


def read_summaries(folder: str | Path) -> list[dict[str, Any]]:
    """The summary JSONs (``LABEL.json``) that ``labkit bench --out FOLDER`` wrote; ``ValueError`` when
    the folder has none."""
    paths = sorted(Path(folder).glob("*.json"))
    if not paths:
        raise ValueError(f"{folder}: no summary .json files; run `labkit bench ... --out {folder}` first")
    return [json.loads(p.read_text()) for p in paths]


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.production.deploy_cli --model ID --gpu L4 --out DIR``: write the files."""
    ap = argparse.ArgumentParser(prog="python -m labkit.production.deploy_cli",
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
    ap.add_argument("--running-target-from", metavar="DIR",
                    help="derive --running-target from a `labkit bench` sweep of one replica (its --out "
                         "folder) and the SLO limits below")
    ap.add_argument("--slo-ttft-ms", type=float, help="with --running-target-from: P99 TTFT limit, ms")
    ap.add_argument("--slo-tpot-ms", type=float, help="with --running-target-from: P99 TPOT limit, ms")
    ap.add_argument("--shutdown-timeout", type=int, default=SHUTDOWN_TIMEOUT_S,
                    help="seconds a stopping replica drains (vLLM's --shutdown-timeout)")
    ap.add_argument("--namespace", default=NAMESPACE)
    ap.add_argument("--gateway-namespace", default=GATEWAY_NAMESPACE, help="where the gateway's pods run")
    ap.add_argument("--gateway-class", default=routing.GATEWAY_CLASS,
                    help="the Gateway's class (an implementation that supports InferencePool)")
    ap.add_argument("--warm-replicas", type=int, default=1,
                    help="placeholder GPU nodes (optional/warm-pool.yaml)")
    ap.add_argument("--prometheus-url", default=PROMETHEUS_URL)
    ap.add_argument("--out", required=True, help="folder to write (e.g. deploy/k8s)")
    a = ap.parse_args(argv)
    derived = ""
    if a.running_target_from is not None:
        if a.running_target is not None:
            ap.error("give --running-target or --running-target-from, not both")
        try:
            a.running_target, note = slo_running_target(read_summaries(a.running_target_from), a.slo_ttft_ms,
                                                        a.slo_tpot_ms, max_num_seqs=a.concurrency)
        except ValueError as e:
            ap.error(str(e))
        print(note)
        derived = f"# --running-target from {a.running_target_from}: {note}\n"
    elif a.slo_ttft_ms is not None or a.slo_tpot_ms is not None:
        ap.error("--slo-ttft-ms and --slo-tpot-ms go with --running-target-from")
    shipped = {repo: short for short, repo in SHIPPED.items()}
    a.config = a.config or shipped.get(a.model, a.model)
    a.revision = revision_for(a.model, a.revision)
    args = shlex.join([str(x) for x in (
        "--model", a.model, "--revision", a.revision, "--config", a.config, "--gpu", a.gpu,
        "--context", a.context, "--concurrency", a.concurrency, "--dtype", a.dtype, "--image", a.image,
        "--min-replicas", a.min_replicas, "--max-replicas", a.max_replicas,
        "--queue-target", f"{a.queue_target:g}", "--shutdown-timeout", a.shutdown_timeout,
        "--namespace", a.namespace, "--gateway-namespace", a.gateway_namespace,
        "--gateway-class", a.gateway_class, "--warm-replicas", a.warm_replicas,
        "--prometheus-url", a.prometheus_url,
        *(("--running-target", f"{a.running_target:g}") if a.running_target is not None else ()))])
    header = ("# Generated by labkit.production.deploy (chapter 08): do not edit by hand. Regenerate with\n"
              f"# python -m labkit.production.deploy_cli {args} --out <folder>\n" + derived)
    paths = write(a.out, a.model, load_config(a.config), a.prometheus_url, header, gpu=a.gpu,
                  context=a.context, concurrency=a.concurrency, image=a.image,
                  replicas=(a.min_replicas, a.max_replicas), queue_target=a.queue_target, dtype=a.dtype,
                  running_target=a.running_target, revision=a.revision, namespace=a.namespace,
                  gateway_namespace=a.gateway_namespace, shutdown_timeout_s=a.shutdown_timeout,
                  gateway_class=a.gateway_class, warm_replicas=a.warm_replicas)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
