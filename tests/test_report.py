"""The lab report (labkit.report): the ledger's structure, that every value the ledger needs is recorded
by its chapter's notebook and reaches the report, verdicts for known inputs, offline pages, and the
reuse-or-run logic of `make report` (with a fake chapter runner: no notebook really runs here)."""

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from labkit import results
from labkit.chapters import CHAPTERS, NOTEBOOKS
from labkit.report import build, computed, ledger, page, site, verdicts
from labkit.report.ledger import Claim, holds, load_ledger, parse_expect, split_key

CLAIMS = load_ledger()
MACHINE = ("cpu · Test CPU (x86_64, 2 cores / 2 threads, 8 GiB RAM, ISA avx2) · torch 0 · Linux", "cpu")
SOURCE = {"commit": "b" * 40, "dirty": False, "diff_sha": None}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
FAKE_FNS = {"torch_total_mem": {"value": False, "unit": "", "note": "declares total_memory"},
            "xformers_snippet": {"value": False, "unit": "", "note": "ModuleNotFoundError: xformers"},
            "whisper_hour_h100_s": {"value": 0.3, "unit": "s", "note": "120 windows"}}


def recorded_by_notebooks() -> dict[str, set[str]]:
    """chapter -> keys its notebook passes to record(...), read from the code (string literals only)."""
    found: dict[str, set[str]] = {}
    for short, name in CHAPTERS.items():
        path = NOTEBOOKS / name
        if not path.exists():
            continue
        keys = found.setdefault(short, set())
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            for node in ast.walk(ast.parse(cell.source)):
                if not isinstance(node, ast.Call):
                    continue
                if getattr(node.func, "id", getattr(node.func, "attr", "")) == "record":
                    ch, key = node.args[:2]
                    assert isinstance(ch, ast.Constant) and isinstance(key, ast.Constant), \
                        f"{name}: record() needs literal chapter and key strings (the report test reads them)"
                    assert ch.value == short, f"{name} records into chapter {ch.value!r}, not {short!r}"
                    keys.add(key.value)
    return found


RECORDED = recorded_by_notebooks()


def refs(claim: Claim) -> list[tuple[str, str]]:
    """(chapter, key) of every figure a row needs: its key, the ones beside it, its GPU expectation."""
    gpu = [claim.gpu] if claim.gpu else []
    return [split_key(r, claim.chapter) for r in (claim.key, *claim.also, *gpu)]


# ---- the ledger ----------------------------------------------------------------------------------

def test_ledger_rows_are_complete_and_unique():
    assert len(CLAIMS) >= 35 and len({c.id for c in CLAIMS}) == len(CLAIMS)
    for c in CLAIMS:
        assert c.chapter in CHAPTERS and c.where in ledger.WHERE and c.fails in ledger.FAILS, c.id
        assert c.claim and c.tutorial and c.measure and c.reason, c.id
        for ch, key in refs(c):
            assert key and (ch in CHAPTERS or (ch == "fn" and key in computed.COMPUTED)), (c.id, ch, key)
        if c.where == "gpu":
            assert c.gpu, f"{c.id}: a GPU row needs its computed expectation"


def test_ledger_covers_the_issues_claims():
    wanted = {"fp16_rule", "q4_rule_small", "q4_rule_8b", "h100_ops_byte", "machine_ridge",
              "decode_memory_bound", "prefill_compute_bound", "kv_cache_complexity", "moe_active",
              "precision_step", "spec_tokens_per_pass", "spec_temperature", "prefix_caching",
              "gpu_sizing_rule", "gpu_sizing_factor", "cfg_cutoff", "whisper_hour", "whisper_rtf",
              "streaming_200ms", "tts_here", "continuous_batching", "snippet_total_mem"}
    assert wanted <= {c.id for c in CLAIMS}
    assert {c.chapter for c in CLAIMS} == set(CHAPTERS), "every chapter has claims in the ledger"


def row(**fields):
    base = {"id": "a", "chapter": "setup", "claim": "c", "tutorial": "t", "measure": "m", "key": "k",
            "expect": "> 1", "where": "here", "fails": "wrong", "reason": "r"}
    return "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in {**base, **fields}.items() if v is not None)


@pytest.mark.parametrize("text, broken", [
    ('id = "a"', "fields"),
    (row(chapter="nope"), "chapter"),
    (row(expect="about 3"), "does not parse"),
    (row(where="gpu"), "gpu"),
    (row(fails="maybe"), "fails"),
    (row(reason=None), "fields"),
    (row(also="k"), "also"),
    (row(extra="x"), "unknown"),
])
def test_a_broken_row_is_refused_with_its_id(tmp_path, text, broken):
    path = tmp_path / "claims.toml"
    path.write_text(f"[[claim]]\n{text}\n")
    with pytest.raises(ValueError, match=broken):
        load_ledger(path)


def test_duplicate_ids_are_refused(tmp_path):
    (tmp_path / "c.toml").write_text(f"[[claim]]\n{row()}[[claim]]\n{row()}")
    with pytest.raises(ValueError, match="twice"):
        load_ledger(tmp_path / "c.toml")


@pytest.mark.parametrize("text, op, lo, hi, value", [
    ("0.5..0.6", "range", 0.5, 0.6, None),
    ("295 ± 1%", "range", 292.05, 297.95, 295.0),
    ("1 +- 0.5", "range", 0.5, 1.5, 1.0),
    ("< 1", "<", None, None, 1.0),
    (">= 1e2", ">=", None, None, 100.0),
    ("== true", "==", None, None, True),
    ("== 2", "==", None, None, 2.0),
    ("== float32", "==", None, None, "float32"),
])
def test_expect_parses(text, op, lo, hi, value):
    e = parse_expect(text)
    assert (e.op, e.value) == (op, value)
    assert (e.lo, e.hi) == pytest.approx((lo, hi)) if lo is not None else (e.lo, e.hi) == (None, None)


@pytest.mark.parametrize("bad", ["", "about 3", "0.6..0.5", "> x", "1 ±", "=< 2"])
def test_bad_expect_is_a_value_error(bad):
    with pytest.raises(ValueError, match="expect"):
        parse_expect(bad)


@pytest.mark.parametrize("text, value, ok", [
    ("0.5..0.6", 0.55, True), ("0.5..0.6", 0.6, True), ("0.5..0.6", 0.73, False),
    ("< 1", 0.14, True), ("< 1", 1.0, False), (">= 900", 20.2, False),
    ("== true", True, True), ("== true", 1, False), ("== false", False, True),
    ("== 2", 2, True), ("== 2", 2.0, True), ("== 2", 3, False), ("== float32", "float32", True),
    ("> 1", float("nan"), False), ("> 1", "7", False), ("> 0", True, False),
])
def test_holds_known_answers(text, value, ok):
    assert holds(parse_expect(text), value) is ok


# ---- every recorded value reaches the report -----------------------------------------------------

@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_every_value_the_ledger_needs_is_recorded_by_its_chapter(chapter):
    needed = {(ch, key) for c in CLAIMS for ch, key in refs(c) if ch == chapter}
    if chapter not in RECORDED:
        pytest.skip(f"notebooks/{CHAPTERS[chapter]} is not written yet; its rows need "
                    f"{sorted(k for _, k in needed)}")
    missing = sorted(key for _, key in needed if key not in RECORDED[chapter])
    assert not missing, (f"{CHAPTERS[chapter]} does not record {missing}: the report would say "
                         f"'not measured (chapter {chapter} did not record ...)'")


def synthetic_results(folder: Path, monkeypatch, drop: tuple[str, str] | None = None) -> dict:
    """Record every key the notebooks record (and the ledger's keys of chapters without a notebook yet)
    into ``folder`` through record(), as a run would; return the files loaded back."""
    monkeypatch.setenv(results.ENV_VAR, str(folder))
    keys = {ch: set(k) for ch, k in RECORDED.items()}
    for c in CLAIMS:
        for ch, key in refs(c):
            if ch in CHAPTERS and ch not in RECORDED:
                keys.setdefault(ch, set()).add(key)
    for ch, names in keys.items():
        for n, key in enumerate(sorted(names)):
            if (ch, key) != drop:
                results.record(ch, key, 1.5 + n, "x", f"synthetic {ch}/{key}")
    return {ch: results.load(ch) for ch in CHAPTERS}


@pytest.fixture
def fixed(monkeypatch):
    """Fixed machine, git source and computed checks: no torch, diffusers or git in these tests."""
    for mod in (results, build):
        monkeypatch.setattr(mod, "machine_key", lambda: MACHINE)
        monkeypatch.setattr(mod, "source", lambda: SOURCE)
    for name, value in FAKE_FNS.items():
        monkeypatch.setitem(computed.COMPUTED, name, lambda v=value: dict(v))


def report_of(res: dict) -> tuple[list[dict], str]:
    rows = verdicts.judge_all(CLAIMS, res, "cpu")
    info = {s: {"number": n[:2], "notebook": n, "html": f"chapters/{n[:-6]}.html", "state": "ran"}
            for s, n in CHAPTERS.items()}
    html = page.index_page({"machine": MACHINE[0], "date": "2026-01-01T00:00:00+00:00", "source": SOURCE,
                            "profile": "small", "summary": verdicts.summary(rows), "chapters": info,
                            "rows": rows, "results": res})
    return rows, html


def test_report_from_a_synthetic_results_folder_has_every_row_and_value(tmp_path, monkeypatch, fixed):
    res = synthetic_results(tmp_path, monkeypatch)
    rows, html = report_of(res)
    assert [r["id"] for r in rows] == [c.id for c in CLAIMS]
    assert not [r["id"] for r in rows if r["verdict"] == "not measured"]
    for r in rows:
        assert f'id="{r["id"]}"' in html
        assert r["verdict"] in verdicts.VERDICTS and (r["value"] is not None or r["verdict"] == "needs a GPU")
    for ch, data in res.items():
        for key, entry in data["values"].items():
            assert f"<code>{key}</code>" in html and entry["note"] in html, (ch, key)
    assert not site.network_refs(html) and "<script" not in html


def test_a_value_the_chapter_did_not_record_shows_as_not_measured(tmp_path, monkeypatch, fixed):
    res = synthetic_results(tmp_path, monkeypatch, drop=("hardware", "decode_intensity_over_ridge"))
    rows, html = report_of(res)
    row = next(r for r in rows if r["id"] == "decode_memory_bound")
    assert row["verdict"] == "not measured"
    assert row["reason"] == "not measured (chapter hardware did not record decode_intensity_over_ridge)"
    assert "did not record decode_intensity_over_ridge" in html


# ---- verdicts for known inputs -------------------------------------------------------------------

def data(chapter: str, device: str = "cpu", **values) -> dict:
    return {"chapter": chapter, "device": device, "started": "2026-01-01T00:00:00+00:00",
            "values": {k: {"value": v, "unit": "x", "note": f"note {k}"} for k, v in values.items()}}


def claim(cid: str) -> Claim:
    return next(c for c in CLAIMS if c.id == cid)


@pytest.mark.parametrize("cid, chapter, key, value, verdict, says", [
    ("cfg_cutoff", "beyond", "cfg_cutoff_saving", 0.1, "wrong", "10% of the UNet evaluations"),
    ("cfg_cutoff", "beyond", "cfg_cutoff_saving", 0.2, "holds", ""),
    ("h100_ops_byte", "hardware", "h100_ops_per_byte", 295.34, "holds", ""),
    ("decode_memory_bound", "hardware", "decode_intensity_over_ridge", 0.14, "holds", ""),
    ("decode_memory_bound", "hardware", "decode_intensity_over_ridge", 1.7, "does not hold here", "ridge"),
    ("q4_rule_small", "concepts", "gguf_bytes_per_param", 0.73, "does not hold here", "embedding"),
    ("q4_rule_8b", "optimization", "q4_bytes_per_param_llama3_8b", 0.579, "holds", ""),
    ("gpu_sizing_factor", "optimization", "kv_aware_factor_max", 51.2, "wrong", "context"),
    ("streaming_200ms", "beyond", "stream_chunk_latency_ms", 863.0, "does not hold here", "30 s"),
    ("hello_world_tokens", "concepts", "hello_world_tokens", 2, "holds", ""),
])
def test_ledger_rows_judge_known_values(cid, chapter, key, value, verdict, says):
    row = verdicts.judge(claim(cid), {chapter: data(chapter, **{key: value})}, "cpu", FAKE_FNS.__getitem__)
    assert row["verdict"] == verdict and says in row["reason"] and row["value"] == value


def test_a_gpu_row_needs_a_gpu_on_a_cpu_and_is_judged_on_a_cuda_run():
    c = claim("whisper_hour")
    fns = FAKE_FNS.__getitem__
    on_cpu = verdicts.judge(c, {"beyond": data("beyond", whisper_best_x_realtime=20.2)}, "cpu", fns)
    assert on_cpu["verdict"] == "needs a GPU" and on_cpu["expectation"]["value"] == 0.3
    assert "0.300 s" in on_cpu["reason"] and "measured here: 20.2 x" in on_cpu["reason"]
    fast = data("beyond", "cuda", whisper_best_x_realtime=1200.0)
    assert verdicts.judge(c, {"beyond": fast}, "cuda", fns)["verdict"] == "holds"
    slow = data("beyond", "cuda", whisper_best_x_realtime=300.0)
    assert verdicts.judge(c, {"beyond": slow}, "cuda", fns)["verdict"] == "does not hold here"
    p = claim("precision_step")  # its expectation is a recorded key: missing -> not measured, named
    row = verdicts.judge(p, {"optimization": data("optimization", int8_over_fp_decode=0.5)}, "cpu")
    assert row["verdict"] == "not measured" and "did not record h100_int8_over_bf16_ceiling" in row["reason"]


def test_missing_chapter_nan_inf_and_computed_rows():
    row = verdicts.judge(claim("moe_active"), {"internals": None}, "cpu")
    assert row["reason"] == "not measured (chapter internals did not record qwen3_235b_active_b)"
    nan = data("internals", qwen3_235b_active_b=None)
    nan["values"]["qwen3_235b_active_b"]["nonfinite"] = "nan"
    assert verdicts.judge(claim("moe_active"), {"internals": nan}, "cpu")["reason"] == "recorded as nan"
    never = data("production", api_dedicated_crossover_req_per_day=None)
    never["values"]["api_dedicated_crossover_req_per_day"]["nonfinite"] = "inf"  # no crossover at all
    row = verdicts.judge(claim("api_crossover"), {"production": never}, "cpu")
    assert (row["verdict"], row["value"]) == ("does not hold here", "inf") and "no crossover" in row["reason"]
    snippet = verdicts.judge(claim("snippet_total_mem"), {}, "cpu", FAKE_FNS.__getitem__)
    assert snippet["verdict"] == "wrong" and "total_memory" in snippet["reason"]


def test_fmt_value_and_summary():
    assert [verdicts.fmt_value(v, u) for v, u in [(295.34, "FLOPs/byte"), (16.83, "GB/s"), (1.4724, "x"),
                                                  (0.0625, ""), (1e-4, ""), (True, ""), (12345, "tokens"),
                                                  ("fp32", ""), (None, "x")]] == [
        "295 FLOPs/byte", "16.8 GB/s", "1.47 x", "0.062", "1.00e-04", "true", "12,345 tokens", "fp32", "n/a"]
    counts = verdicts.summary([{"verdict": "holds"}, {"verdict": "wrong"}, {"verdict": "holds"}])
    assert counts == {"holds": 2, "does not hold here": 0, "wrong": 1, "needs a GPU": 0, "not measured": 0}


# ---- computed checks -----------------------------------------------------------------------------

def test_whisper_arithmetic_known_answer():
    f = computed.whisper_window_flops()
    d, ffn = 1280, 5120
    assert f["encoder"] == 32 * (2 * (4 * d * d + 2 * d * ffn) * 1500 + 4 * 1500**2 * d)
    assert 629e6 < (4 * d * d + 2 * d * ffn) * 32 < 630e6  # large-v3's encoder: ~0.63 B weights
    hour = computed.whisper_hour_seconds()
    assert hour["value"] == pytest.approx(120 * f["total"] / 989.4e12) and 0.25 < hour["value"] < 0.35


def test_declared_fields_reads_a_stub(tmp_path):
    stub = tmp_path / "s.pyi"
    stub.write_text("class _CudaDeviceProperties:\n    name: str\n    total_memory: int\nclass Other: ...\n")
    assert computed._declared_fields(stub, "_CudaDeviceProperties") == {"name", "total_memory"}
    assert computed._declared_fields(stub, "Missing") is None
    assert computed._declared_fields(tmp_path / "absent.pyi", "A") is None
    with pytest.raises(KeyError, match="known"):
        computed.compute("no_such_check")


# ---- pages that open offline, and make report's reuse-or-run -------------------------------------

def executed_notebook(error: bool = False):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("plot()")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="CHECK ok   it held\n"),
                    nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
                    nbformat.v4.new_output("display_data", data={
                        site.WIDGET_VIEW: {"model_id": "box"}, "text/plain": "Loading: 0%"})]
    if error:
        code.outputs.append(nbformat.v4.new_output("error", ename="AssertionError", evalue="a check failed",
                                                   traceback=[]))
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter"), code]
    nb.metadata["widgets"] = {site.WIDGET_STATE: {"state": {
        "box": {"model_name": "HBoxModel", "state": {"children": [f"IPY_MODEL_{x}" for x in "lbr"]}},
        "l": {"model_name": "HTMLModel", "state": {"value": "Loading: 100%"}},
        "b": {"model_name": "FloatProgressModel", "state": {"value": 5, "max": 10}},
        "r": {"model_name": "HTMLModel", "state": {"value": "272/272 [00:01&lt;00:00]"}}}}}
    return nb


def test_widget_text_and_network_refs():
    state = executed_notebook().metadata["widgets"][site.WIDGET_STATE]["state"]
    assert site.widget_text(state, "box") == "Loading: 100% █████····· 272/272 [00:01<00:00]"
    assert site.widget_text(state, "nope") is None
    page_ = ('<script src="https://cdn.x/require.js"></script><link rel="stylesheet" href="//fonts.y/a.css">'
             '<img src="data:image/png;base64,A"><a href="https://github.com/x">a link is fine</a>'
             '<style>@import "https://f.z/b.css"; .i { background: url(https://i.z/c.png) }</style>')
    assert site.network_refs(page_) == ["https://cdn.x/require.js", "//fonts.y/a.css", "https://f.z/b.css",
                                        "https://i.z/c.png"]
    assert site.network_refs('<a href="https://x.y">x</a><img src="lab.png">') == []
    status = site.notebook_status(executed_notebook(error=True))
    assert status == {"ok": False, "error": "AssertionError: a check failed"}
    assert site.notebook_status(executed_notebook()) == {"ok": True, "error": ""}


def test_make_report_runs_then_reuses_and_writes_an_offline_site(tmp_path, monkeypatch, fixed):
    monkeypatch.setenv(results.ENV_VAR, str(tmp_path / "results"))
    monkeypatch.setattr(build, "available", lambda: {s: CHAPTERS[s] for s in ("setup", "hardware")})
    calls, broken = [], set()

    def fake_run(short, timeout, out_dir):
        calls.append(short)
        monkeypatch.setattr(results, "RUN_ID", f"kernel-{len(calls)}")  # each run is a new process
        nbformat.write(executed_notebook(error=short in broken), out_dir / CHAPTERS[short])
        if short in broken:
            return 1  # the kernel died before its first record()
        results.record(short, "ridge_flops_per_byte", 3.6, "FLOPs/byte")
        results.record(short, "h100_ops_per_byte", 295.3, "FLOPs/byte")
        nbformat.write(executed_notebook(), out_dir / CHAPTERS[short])  # after the records, as nbclient does
        return 0

    monkeypatch.setattr(build, "run_chapter", fake_run)
    out, work = tmp_path / "reports", tmp_path / "build"
    work.mkdir()
    report = build.build(out, build_dir=work)
    assert sorted(calls) == ["hardware", "setup"]
    assert {r["id"]: r["verdict"] for r in report["rows"]}["machine_ridge"] == "holds"
    assert report["chapters"]["production"]["state"] == "no notebook yet"
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert files == {"index.html", "results.json", "chapters/lab.css", "chapters/00_setup.html",
                     "chapters/04_gpu_hardware.html"}
    chapter_page = (out / "chapters" / "00_setup.html").read_text()
    assert f"data:image/png;base64,{PNG}" in chapter_page and "Loading: 100%" in chapter_page
    assert 'href="../index.html"' in chapter_page and 'href="lab.css"' in chapter_page
    for f in [*out.rglob("*.html"), *out.rglob("*.css")]:
        text = f.read_text()
        assert not site.network_refs(text) and not re.search(r"<script[^>]*\bsrc=", text), f
    assert json.loads((out / "results.json").read_text())["summary"] == report["summary"]
    assert sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) < 2e6

    build.build(out, build_dir=work)  # same code, machine, profile: reused, nothing runs
    assert sorted(calls) == ["hardware", "setup"]
    build.build(out, chapters=["00"], rerun=True, build_dir=work)
    assert sorted(calls) == ["hardware", "setup", "setup"]
    monkeypatch.setattr(build, "source", lambda: {**SOURCE, "dirty": True, "diff_sha": "other"})
    why = build.staleness(results.load("setup"), work / CHAPTERS["setup"])
    assert why.startswith("recorded from other code")
    build.build(out, chapters=["setup"], build_dir=work)  # only setup may run; hardware is stale, left out
    assert calls[-1] == "setup" and calls.count("hardware") == 1
    assert not (out / "chapters" / "04_gpu_hardware.html").exists()
    assert report_left_out(out)["hardware"].startswith("not run (recorded from other code")
    monkeypatch.setattr(build, "source", lambda: SOURCE)
    broken.add("setup")
    again = build.build(out, chapters=["setup"], rerun=True, build_dir=work)
    assert again["chapters"]["setup"]["error"] == "no usable results: the run recorded nothing"
    assert {r["id"]: r["verdict"] for r in again["rows"]}["machine_ridge"] == "not measured"


def report_left_out(out: Path) -> dict:
    return {s: i["state"] for s, i in json.loads((out / "results.json").read_text())["chapters"].items()}


def test_staleness_known_answers(tmp_path, fixed, monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "small")
    nb = tmp_path / "00_setup.ipynb"
    header = {"machine": MACHINE[0], "profile": "small", "started": "2000-01-01T00:00:00+00:00",
              "updated": "2000-01-01T00:00:00+00:00", **SOURCE}
    assert build.staleness(None, nb) == "no results recorded yet"
    assert build.staleness(header, nb) == "its executed notebook is missing"
    nb.write_text("{}")
    assert build.staleness(header, nb) is None
    later = {**header, "updated": "2999-01-01T00:00:00+00:00"}
    assert build.staleness(later, nb) == "its executed notebook is older than the recorded values"
    assert build.staleness({**header, "machine": "another"}, nb) == "recorded on another machine"
    assert build.staleness({**header, "profile": "full"}, nb) == "recorded with profile full"
    other_code = {**header, "commit": "c" * 40}
    assert build.staleness(other_code, nb).startswith("recorded from other code")
    assert build.staleness(other_code, nb, just_ran=True) is None  # the run just made, whatever the code
    assert build.staleness({"values": {}}, nb).startswith("its results file has no run times")
