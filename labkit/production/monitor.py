"""Watching a serving system while it runs (chapter 08): the tutorial's production watch list,
measured. Host gauges from psutil and NVML (:func:`labkit.hardware.machine.nvidia_smi_snapshot`, what
``nvidia-smi dmon`` reads), server gauges from the Prometheus ``/metrics`` of vLLM (``vllm:``) or
llama-server (``llamacpp:``, started with ``--metrics``) as :mod:`labkit.production.server_gauges`
maps them, request figures from load-generator records; seconds, bytes, %, W.
Wrap ``loadgen.run`` in a :class:`Sampler`, then :func:`timeline`, :func:`dashboard`; CLI: :func:`live`
(its options: ``labkit.cli.add_monitor_arguments``)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

import httpx
import numpy as np
import psutil

from ..engines import prometheus
from ..hardware.machine import nvidia_smi_snapshot
from ..serving import loadgen, loadspec
from ..serving.loadspec import LoadSpec
from ..serving.metrics import RunSummary, summarize
from ..serving.records import RequestRecord, request_metrics
from ..serving.streaming import base_url_of
from ..stats import summary
from ..table import format_rows
from .server_gauges import parse_llamacpp as parse_llamacpp
from .server_gauges import parse_metrics as parse_metrics
from .server_gauges import server_sample

NAN = float("nan")
_CPU_PRIMED: list[bool] = []  # psutil's first non-blocking cpu_percent() is meaningless: see host_sample


def _cpu_pct() -> float:
    """CPU % of all cores since the previous call; the first call measures over 0.1 s."""
    if not _CPU_PRIMED:
        _CPU_PRIMED.append(True)
        return psutil.cpu_percent(interval=0.1)
    return psutil.cpu_percent(interval=None)


def host_sample() -> dict[str, float]:
    """This machine now: ``time`` (``time.time()``), ``t_perf`` (``perf_counter()``, the clock of
    request records), ``cpu_pct`` (all cores, since the previous call), ``ram_used_bytes``,
    ``ram_pct``; per NVIDIA GPU ``gpu{i}_util_pct``, ``_mem_used_bytes``, ``_mem_total_bytes``,
    ``_power_w`` from :func:`~labkit.hardware.machine.nvidia_smi_snapshot` (no library, driver or
    GPU: no GPU fields, no error; a field NVML cannot read is left out)."""
    vm = psutil.virtual_memory()
    out = {"time": time.time(), "t_perf": time.perf_counter(), "cpu_pct": _cpu_pct(),
           "ram_used_bytes": float(vm.total - vm.available), "ram_pct": vm.percent}
    names = {"util_pct": "gpu_util_pct", "mem_used_bytes": "memory_used_bytes",
             "mem_total_bytes": "memory_total_bytes", "power_w": "power_w"}
    for g in nvidia_smi_snapshot():
        out |= {f"gpu{g['index']}_{k}": float(g[n]) for k, n in names.items() if n in g}
    return out


class Sampler:
    """``with Sampler(interval_s, base_url) as sm:`` samples the host (and the server's /metrics) on a
    thread: at the start, every ``interval_s`` s, at :meth:`stop`. A failed reading leaves ``error``."""

    def __init__(self, interval_s: float = 0.5, base_url: str | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.interval_s, self.base_url = interval_s, base_url_of(base_url) if base_url else None
        self._samples, self._lock, self._stop = [], threading.Lock(), threading.Event()  # type: ignore[var-annotated]
        self._thread = threading.Thread(target=self._loop, name="labkit-sampler", daemon=True)
        self._http = httpx.Client()  # one connection pool for every scrape

    @property
    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples)

    def sample_once(self) -> dict[str, Any]:
        s: dict[str, Any] = {"time": time.time(), "t_perf": time.perf_counter()}
        try:
            server = server_sample(self.base_url, 2.0, self._http) if self.base_url else {}
            s = {k: v for k, v in server.items() if k not in s} | host_sample()
        except Exception as e:  # noqa: BLE001 - a failed reading must not end the sampling
            s["error"] = f"{type(e).__name__}: {e}"
        with self._lock:
            self._samples.append(s)
        return s

    def _loop(self) -> None:
        self.sample_once()
        while not self._stop.wait(self.interval_s):
            self.sample_once()
        self.sample_once()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        self._http.close()

    __exit__ = stop


def watched_run(base_url: str, model: str, spec: LoadSpec,
                interval_s: float = 0.25) -> tuple[list[dict[str, Any]], RunSummary]:
    """``loadgen.run(base_url, spec)`` (a :class:`~labkit.serving.loadspec.LoadSpec`; ``model`` served,
    ``ignore_eos``) inside a :class:`Sampler` of the host and ``base_url``'s /metrics every ``interval_s``
    s: ``(samples, the run's summary)``, its ``requests`` the records :func:`dashboard` takes."""
    with Sampler(interval_s, base_url) as sm:
        run = loadgen.run(base_url, spec, loadspec.ClientSpec(model=model, ignore_eos=True), progress=False)
    return sm.samples, run


def server_vs_client(samples: list[dict[str, Any]], requests: Sequence[RequestRecord]) -> dict[str, float]:
    """What the server's /metrics and the client saw of one run: ``server_tokens`` (the generated-token
    counter's rise from the first sample to the last), ``client_tokens`` (output tokens of the ok
    requests), their ``ratio`` (NaN without tokens), ``max_running`` and ``max_waiting`` (gauges)."""
    scraped = [x for x in samples if "generation_tokens_total" in x]
    rise = scraped[-1]["generation_tokens_total"] - scraped[0]["generation_tokens_total"] if scraped else NAN
    client = float(sum(r.output_tokens or 0 for r in requests if r.status == "ok"))
    peak = lambda k: max((float(x[k]) for x in scraped if not np.isnan(x.get(k, NAN))), default=NAN)
    return {"server_tokens": float(rise), "client_tokens": client, "ratio": rise / client if client else NAN,
            "max_running": peak("running"), "max_waiting": peak("waiting")}


def _code(rec: RequestRecord) -> str:
    """What the client saw: the HTTP code (``"200"``, ``"503"``), or a failure after or without one."""
    status = rec.status
    return str(rec.http_status or status) if status in ("ok", "http_error") else status


def timeline(samples: list[dict[str, Any]], requests: Sequence[RequestRecord] | None = None,
             bin_s: float = 1.0) -> dict[str, np.ndarray]:
    """Aligned series of :class:`Sampler` samples and request records (``perf_counter`` times, as
    ``loadgen.run(...)["requests"]``) from the earliest of both. Per sample: ``t`` (s), ``cpu_pct``,
    ``ram_pct``, ``running``, ``waiting``, ``kv_usage_pct``, ``gpu{i}_util_pct``. Per ``bin_s`` bin from
    ``bin_t``: ``sent_per_s``, ``done_per_s`` (ok), ``failed_per_s``, ``code_<code>`` (requests ending
    with it). Per ok request, at its completion ``req_t`` (s): ``req_ttft_s``, ``req_e2e_s``."""
    if not bin_s > 0:
        raise ValueError(f"bin_s must be a positive number of seconds, got {bin_s!r}")
    reqs = [r for r in requests or [] if r.status != "not_sent"]
    t0 = min([s["t_perf"] for s in samples] + [r.t_sent for r in reqs], default=None)
    if t0 is None:
        raise ValueError("timeline needs samples or request records: pass Sampler(...).samples")
    keys = ["cpu_pct", "ram_pct", "running", "waiting", "kv_usage_pct"]
    keys += sorted({k for s in samples for k in s if k.startswith("gpu") and k.endswith("_util_pct")})
    tl = {"t": np.array([s["t_perf"] - t0 for s in samples], dtype=float)}
    tl |= {k: np.array([float(s.get(k, NAN)) for s in samples], dtype=float) for k in keys}
    ends = [(r.t_end or r.t_sent) - t0 for r in reqs]
    edges = np.arange(max(1, np.ceil((max(ends, default=0.0) + 1e-9) / bin_s)) + 1) * bin_s
    count = lambda keep: np.histogram([e for r, e in zip(reqs, ends, strict=True) if keep(r)], edges)[0]
    ok, sent = (lambda r: r.status == "ok"), np.histogram([r.t_sent - t0 for r in reqs], edges)[0]
    tl |= {"bin_t": edges[:-1], "sent_per_s": sent / bin_s, "done_per_s": count(ok) / bin_s,
           "failed_per_s": count(lambda r: not ok(r)) / bin_s}
    tl |= {f"code_{c}": count(lambda r, c=c: _code(r) == c) for c in sorted({_code(r) for r in reqs})}
    done = [(request_metrics(r), e) for r, e in zip(reqs, ends, strict=True) if ok(r)]
    tl["req_t"] = np.array([e for _, e in done], dtype=float)
    return tl | {f"req_{k}": np.array([m[k] for m, _ in done], dtype=float) for k in ("ttft_s", "e2e_s")}


def plot_timeline(tl: dict[str, np.ndarray], fig: Any = None) -> Any:
    """Three panels sharing the time axis (s): requests sent, completed and failed per second; TTFT
    and E2E of each request at its completion (s, points); server gauges (running, waiting; left)
    with KV usage and CPU/GPU utilization (%, right). Returns the figure."""
    import matplotlib.pyplot as plt
    fig = fig or plt.figure(figsize=(9, 7))
    a1, a2, a3 = fig.subplots(3, 1, sharex=True)
    mid = tl["bin_t"] + (tl["bin_t"][1] - tl["bin_t"][0] if len(tl["bin_t"]) > 1 else 1.0) / 2
    for k in ("sent_per_s", "done_per_s", "failed_per_s"):
        a1.step(mid, tl[k], where="mid", label=k.removesuffix("_per_s"))
    for k, marker in (("req_ttft_s", "."), ("req_e2e_s", "x")):
        a2.plot(tl["req_t"], tl[k], marker, label=k[4:-2].upper())
    for k, style in (("running", "-"), ("waiting", "--")):
        a3.plot(tl["t"], tl[k], style, label=k)
    a1.set(ylabel="requests/s", title="Load, latency and utilization over time")
    a2.set(ylabel="seconds (at completion)")
    a3.set(ylabel="requests", xlabel="time since start (s)")
    pct = a3.twinx()
    for i, k in enumerate(k for k in tl if k in ("kv_usage_pct", "cpu_pct") or k.endswith("util_pct")):
        pct.plot(tl["t"], tl[k], ":", color=f"C{i + 2}", label=k.replace("_pct", " %"))
    pct.set(ylabel="%", ylim=(0, 105))
    (h1, l1), (h2, l2) = a3.get_legend_handles_labels(), pct.get_legend_handles_labels()
    for ax, both in ((a1, {}), (a2, {}), (a3, {"handles": h1 + h2, "labels": l1 + l2})):
        ax.legend(fontsize=8, ncol=3, **both)
    return fig


def dashboard(samples: list[dict[str, Any]], requests: Sequence[RequestRecord]) -> dict[str, Any]:
    """The tutorial's watch list for a run: ``codes``/``code_classes`` (2xx/4xx/5xx/no_answer); P50/P90/P99
    of ``ttft_ms``/``tpot_ms``/``e2e_ms``, ``tps`` (tokens/s per stream, :func:`summarize`); ``mean``/``max``
    of CPU/GPU util %, RAM/GPU bytes, KV %, ``running``, ``waiting`` (queue depth); token length stats."""
    reqs = [r for r in requests if r.status != "not_sent"]
    s, codes = summarize(reqs), [_code(r) for r in reqs]
    classes = Counter(f"{c[0]}xx" if c.isdigit() else "no_answer" for c in codes)
    d: dict[str, Any] = {"requests": len(reqs), "codes": dict(sorted(Counter(codes).items())),
                         "code_classes": dict(sorted(classes.items())), "tps": s.median_tps}
    for name, key in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2el")):
        sp = s.spread(key)
        d[name] = {"p50": sp.p50, "p90": sp.p90, "p99": sp.p99}
    gauges = ["cpu_pct", "ram_used_bytes", "kv_usage_pct", "running", "waiting"]
    for k in gauges + sorted({k for x in samples for k in x if k.endswith(("util_pct", "mem_used_bytes"))}):
        v = np.array([float(x[k]) for x in samples if not np.isnan(x.get(k, NAN))], dtype=float)
        d[k] = {"mean": float(v.mean()), "max": float(v.max())} if v.size else {"mean": NAN, "max": NAN}
    ok = [r for r in reqs if r.status == "ok"]  # summary() leaves out unknown (None) lengths
    d |= {"prompt_tokens": summary(r.prompt_tokens for r in ok),
          "output_tokens": summary(request_metrics(r)["output_tokens"] for r in ok)}
    return d


def format_dashboard(d: dict[str, Any]) -> str:
    """Text of a :func:`dashboard` dict, one figure per line (memory in GiB)."""
    pairs = lambda m: ", ".join(f"{k} x{v}" for k, v in m.items()) or "none"
    dist = [{"figure": k} | {p: float(d[k][p]) for p in ("p50", "p90", "p99")}
            for k in ("ttft_ms", "tpot_ms", "e2e_ms", "prompt_tokens", "output_tokens")]
    gib = lambda k, x: x / 2**30 if k.endswith("_bytes") else x
    shown = lambda x: "not exported" if x != x else x  # NaN: the server has no such gauge
    gauges = [{"gauge": k.replace("_bytes", "_gib")} | {m: shown(gib(k, v[m])) for m in ("mean", "max")}
              for k, v in d.items() if isinstance(v, dict) and set(v) == {"mean", "max"}]
    head = [f"requests {d['requests']}, by status: {pairs(d['codes'])} (classes: {pairs(d['code_classes'])})",
            f"TPS {d['tps']:.1f} tokens/s per stream (1 / median TPOT)"]
    return "\n".join(head + [format_rows(dist), format_rows(gauges)])


def live(base_url: str | None = None, interval_s: float = 1.0, count: int | None = None,
         out: TextIO = sys.stdout) -> int:
    """A header, then a line per ``interval_s`` s (``count`` lines, default until Ctrl-C) like ``nvidia-smi
    dmon``: time, CPU %, RAM GiB, per GPU util %, memory GiB, power W; with ``base_url`` requests running,
    waiting, KV %, requests done in the interval and its TTFT P50 (ms, histogram delta; ``-`` for a
    figure the server does not export, such as llama-server's done and TTFT). Returns lines."""
    sampler = Sampler(interval_s, base_url)
    prev, rows = sampler.sample_once(), 0
    gpus = sorted({k.split("_")[0] for k in prev if k.startswith("gpu") and k.endswith("_util_pct")})
    cols = [("cpu_pct", "cpu%", 1), ("ram_used_bytes", "ramGiB", 2**30)] + [
        (f"{g}_{k}", f"{g[3:]}:{h}", scale) for g in gpus for k, h, scale in
        (("util_pct", "gpu%", 1), ("mem_used_bytes", "memGiB", 2**30), ("power_w", "powW", 1))]
    server = [("running", "running"), ("waiting", "waiting"), ("kv_usage_pct", "kv%"), ("done", "done")]
    cols += [(k, h, 1) for k, h in server + [("ttft50_ms", "ttft50ms")] if base_url]
    print("# time   " + " ".join(h.rjust(9) for _, h, _ in cols), file=out, flush=True)
    cell = lambda v: "-".rjust(9) if v != v else f"{v:9.1f}"
    finished = lambda s: s.get("finished_total", s.get("ttft_count", NAN))
    try:
        while count is None or rows < count:
            time.sleep(interval_s)
            cur = sampler.sample_once()
            try:
                delta = prometheus.bucket_delta(prev.get("ttft_buckets", {}), cur.get("ttft_buckets", {}))
            except ValueError:  # the server restarted between the two lines
                delta = {}
            row = cur | {"done": finished(cur) - finished(prev),
                         "ttft50_ms": prometheus.histogram_quantile(delta, 0.5) * 1e3}
            cells = [cell(row.get(k, NAN) / scale) for k, _, scale in cols]
            print(time.strftime("%H:%M:%S", time.localtime(cur["time"])), *cells,
                  *([f" ({cur['error']})"] if "error" in cur else []), file=out, flush=True)
            prev, rows = cur, rows + 1
    except KeyboardInterrupt:  # Ctrl-C ends the view, not the program
        pass
    sampler.stop()
    return rows


def monitor_main(args: argparse.Namespace) -> int:
    """``labkit monitor``: 2 (one line on stderr) for a bad option or an unreadable ``--url``; else 0."""
    bad = "--interval and --count must be positive" if args.interval <= 0 or (args.count or 1) < 1 else None
    try:
        err = server_sample(args.url).get("error") if args.url and not bad else None
        bad = bad or err and (f"cannot read the server's metrics: {err}; is it running, and is it vLLM or "
                              "llama-server started with --metrics?")
    except ValueError as e:  # no scheme or no host
        bad = str(e)
    if bad:
        print(f"error: labkit monitor: {bad}", file=sys.stderr)
        return 2
    live(args.url, args.interval, args.count, out=sys.stdout)
    return 0


WATCH_LIST = ("request volume", "status codes", "TTFT", "TPS", "end-to-end latency", "GPU utilization",
              "VRAM", "replica count", "queue depth", "input lengths", "output lengths")


def watch_list(d: dict[str, Any]) -> dict[str, bool]:
    """Which items of the tutorial's monitoring list (:data:`WATCH_LIST`) a :func:`dashboard` dict
    has a finite figure for. One server has no replica count; a host without NVML has no GPU ones."""
    def fin(x: Any) -> bool:
        return isinstance(x, int | float) and bool(np.isfinite(x))

    def gpu(suffix: str) -> bool:
        return any(k.endswith(suffix) and fin(v.get("mean")) for k, v in d.items() if isinstance(v, dict))
    figures = {"TTFT": d["ttft_ms"]["p99"], "TPS": d["tps"], "end-to-end latency": d["e2e_ms"]["p99"],
               "queue depth": d["waiting"]["mean"], "input lengths": d["prompt_tokens"]["p99"],
               "output lengths": d["output_tokens"]["p99"]}
    out = {k: fin(v) for k, v in figures.items()} | {"request volume": d["requests"] > 0,
                                                      "status codes": bool(d["codes"])}
    out |= {"GPU utilization": gpu("util_pct"), "VRAM": gpu("mem_used_bytes"),
            "replica count": "replicas" in d}
    return {k: out[k] for k in WATCH_LIST}
