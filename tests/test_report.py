"""The lab report (labkit.report): the ledger's structure, that every value the ledger needs is recorded
by its chapter's notebook and reaches the report, verdicts for known inputs, offline pages, and the
reuse-or-run logic of `make report` (with a fake chapter runner: no notebook really runs here)."""

import ast
import copy
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import nbformat
import pytest

from labkit import paths, results
from labkit.chapters import CHAPTERS
from labkit.paths import NOTEBOOKS, REPO
from labkit.report import build, computed, ledger, machines, page, site, verdicts
from labkit.report.ledger import Claim, holds, load_ledger, parse_expect, split_key

CLAIMS = load_ledger()
MACHINE = ("cpu · Test CPU (x86_64, 2 cores / 2 threads, 8 GiB RAM, ISA avx2) · torch 0 · Linux", "cpu")
SOURCE = {"commit": "b" * 40, "dirty": False, "diff_sha": None}
DIGESTS: dict[str, str] = {}  # chapter -> its digest in the `fixed` tests (default "d0")
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
FAKE_FNS = {"torch_total_mem": {"value": False, "unit": "", "note": "declares total_memory"},
            "xformers_snippet": {"value": False, "unit": "", "note": "ModuleNotFoundError: xformers"},
            "whisper_hour_h100_s": {"value": 0.3, "unit": "s", "note": "120 windows"}}


def _key_pattern(node: ast.expr) -> str | None:
    """A record() key as a regex: a literal as itself, an f-string with ``.+`` for each formatted part."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".+" for v in node.values)
    return None


def recorded_by_notebooks() -> dict[str, set[str]]:
    """chapter -> patterns of the keys its notebook may record: every string literal of its code (keys
    are passed to record() directly or through a loop over literals) and every f-string, with ``.+``
    for each formatted part, and the same of ``labkit/figures/<chapter>.py``, which records from the page;
    and the keys labkit's own record() calls name for the chapter. Each record() call must name its
    own chapter, literally."""
    found: dict[str, set[str]] = {}
    for short, name in CHAPTERS.items():
        path = NOTEBOOKS / name
        if not path.exists():
            continue
        keys = found.setdefault(short, set())
        figures = REPO / "labkit" / "figures" / f"{short}.py"  # what the closing cell records from the page
        sources = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        for source in sources + ([figures.read_text()] if figures.exists() else []):
            for node in ast.walk(ast.parse(source)):
                pattern = _key_pattern(node) if isinstance(node, ast.Constant | ast.JoinedStr) else None
                if pattern and re.search(r"\w", pattern.replace(".+", "")):  # f"{x}" alone matches anything
                    keys.add(pattern)
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) \
                        == "record":
                    ch = node.args[0]
                    assert isinstance(ch, ast.Constant), f"{name}: record() needs its chapter as a literal"
                    assert ch.value == short, f"{name} records into chapter {ch.value!r}, not {short!r}"
    for path in sorted((REPO / "labkit").rglob("*.py")):  # labkit functions that record where they measure
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant)):
                continue
            chapter, name = node.args[0].value, getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "record" and chapter in found and (pattern := _key_pattern(node.args[1])):
                found[chapter].add(pattern)
    return found


RECORDED = recorded_by_notebooks()


def is_recorded(chapter: str, key: str) -> bool:
    return any(re.fullmatch(p, key) for p in RECORDED.get(chapter, ()))


def refs(claim: Claim) -> list[tuple[str, str]]:
    """(chapter, key) of every figure a row needs: its key, the ones beside it, its GPU expectation."""
    if claim.evidence == "outside":
        return []
    gpu = [claim.gpu] if claim.gpu else []
    return [split_key(r, claim.chapter) for r in (claim.key, *claim.also, *gpu)]


# ---- the ledger ----------------------------------------------------------------------------------

def test_ledger_rows_are_complete_and_unique():
    assert len(CLAIMS) >= 75 and len({c.id for c in CLAIMS}) == len(CLAIMS)
    for c in CLAIMS:
        assert c.chapter in CHAPTERS and c.evidence in ledger.EVIDENCE, c.id
        assert c.claim and c.tutorial and c.measure and c.reason and c.section, c.id
        if c.evidence == "outside":
            assert c.expect is None and not c.key, c.id
            continue
        assert c.fails in ledger.FAILS, c.id
        assert c.fails != "not here" or c.evidence in ("measured", "simulated", "gpu"), c.id
        for ch, key in refs(c):
            assert key and (ch in CHAPTERS or (ch == "fn" and key in computed.COMPUTED)), (c.id, ch, key)
        if c.evidence == "gpu":
            assert c.gpu, f"{c.id}: a GPU row needs its computed expectation"


def test_ledger_covers_every_chapter_and_kind():
    assert {c.chapter for c in CLAIMS} == set(CHAPTERS), "every chapter has claims in the ledger"
    kinds = {c.evidence for c in CLAIMS}
    assert {"measured", "computed", "arithmetic", "outside"} <= kinds


def test_sections_name_the_tutorial_where_it_is_present():
    tutorial = Path(__file__).resolve().parent.parent.parent / "shared" / "tutorial.txt"
    if not tutorial.is_file():
        pytest.skip(f"no tutorial at {tutorial}")
    text = " ".join(tutorial.read_text().split()).lower()
    unknown = sorted({c.section for c in CLAIMS if " ".join(c.section.split()).lower() not in text})
    assert not unknown, f"sections not found in the tutorial (use its headings): {unknown}"


def row(**fields):
    base = {"id": "a", "claim": "c", "tutorial": "t", "section": "s", "measure": "m", "key": "k",
            "expect": "> 1", "evidence": "measured", "fails": "wrong", "reason": "r"}
    return "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in {**base, **fields}.items() if v is not None)


@pytest.mark.parametrize("text, broken", [
    ('id = "a"', "fields"),
    (row(key="nope/k"), "names no chapter"),
    (row(expect="about 3"), "does not parse"),
    (row(evidence="gpu"), "gpu"),
    (row(evidence="guess"), "evidence"),
    (row(fails="maybe"), "fails"),
    (row(evidence="computed", fails="not here"), "every machine"),
    (row(reason=None), "fields"),
    (row(section=None), "fields"),
    (row(also="k"), "also"),
    (row(extra="x"), "unknown"),
])
def test_a_broken_row_is_refused_with_its_id(tmp_path, text, broken):
    (tmp_path / "00_setup.toml").write_text(f"[[claim]]\n{text}\n")
    with pytest.raises(ValueError, match=broken):
        load_ledger(tmp_path)


def test_duplicate_ids_and_stray_files_are_refused(tmp_path):
    (tmp_path / "00_setup.toml").write_text(f"[[claim]]\n{row()}")
    (tmp_path / "01_concepts.toml").write_text(f"[[claim]]\n{row()}")
    with pytest.raises(ValueError, match="twice"):
        load_ledger(tmp_path)
    (tmp_path / "01_concepts.toml").unlink()
    (tmp_path / "notes.toml").write_text("")
    with pytest.raises(ValueError, match="name no chapter"):
        load_ledger(tmp_path)


def test_an_outside_row_needs_no_key_and_is_not_checkable(tmp_path):
    text = 'id = "o"\nclaim = "c"\ntutorial = "t"\nsection = "s"\nmeasure = "m"\nevidence = "outside"\n'
    (tmp_path / "00_setup.toml").write_text(f'[[claim]]\n{text}reason = "a release date"\n')
    (c,) = load_ledger(tmp_path)
    r = verdicts.judge(c, {}, "cpu")
    assert (r["verdict"], r["reason"]) == ("not checkable offline", "a release date")


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
    missing = sorted(key for _, key in needed if not is_recorded(chapter, key))
    assert not missing, (f"{CHAPTERS[chapter]} does not record {missing}: the report would say "
                         f"'not measured (chapter {chapter} did not record ...)'")


_SYNTHETIC: dict = {}


def synthetic_results(folder: Path, monkeypatch, drop: tuple[str, str] | None = None) -> dict:
    """Record every key the ledger needs into ``folder`` through record(), as a run would, and return
    the files loaded back; ``drop`` leaves one key out. (Recorded once per session: 400-odd records
    took about 4 s a time; later calls get a copy, without ``drop`` where it is set.)"""
    monkeypatch.setenv(results.ENV_VAR, str(folder))
    if not _SYNTHETIC:
        keys: dict[str, set[str]] = {}
        for c in CLAIMS:
            for ch, key in refs(c):
                if ch in CHAPTERS:
                    keys.setdefault(ch, set()).add(key)
        for ch, names in keys.items():
            for n, key in enumerate(sorted(names)):
                results.record(ch, key, 1.5 + n, "x", f"synthetic {ch}/{key}")
        _SYNTHETIC.update({ch: results.load(ch) for ch in CHAPTERS})
    res = copy.deepcopy(_SYNTHETIC)
    if drop is not None:
        del res[drop[0]]["values"][drop[1]]
    return res


@pytest.fixture
def fixed(monkeypatch):
    """Fixed machine, git source, digests and computed checks: no torch, diffusers or git in these tests."""
    for mod in (results, build):
        monkeypatch.setattr(mod, "machine_key", lambda: MACHINE)
        monkeypatch.setattr(mod, "digest", lambda short, used=(): DIGESTS.get(short, "d0"))
    monkeypatch.setattr(results, "source", lambda: SOURCE)
    monkeypatch.setattr(results, "used_sources", lambda: [])  # the digest is fixed: no module scan
    DIGESTS.clear()
    for name, value in FAKE_FNS.items():
        monkeypatch.setitem(computed.COMPUTED, name, lambda v=value: dict(v))


def report_of(res: dict) -> tuple[list[dict], str]:
    rows = verdicts.judge_all(CLAIMS, res, "cpu")
    info = {s: {"number": n[:2], "notebook": n, "html": f"chapters/{n[:-6]}.html", "state": "ran"}
            for s, n in CHAPTERS.items()}
    html = page.index_page({"machine": MACHINE[0], "date": "2026-01-01T00:00:00+00:00", "source": SOURCE,
                            "profile": "small", "summary": verdicts.summary(rows),
                            "by_kind": verdicts.by_kind(rows), "chapters": info,
                            "rows": rows, "results": res})
    return rows, html


def test_report_from_a_synthetic_results_folder_has_every_row_and_value(tmp_path, monkeypatch, fixed):
    res = synthetic_results(tmp_path, monkeypatch)
    rows, html = report_of(res)
    assert [r["id"] for r in rows] == [c.id for c in CLAIMS]
    assert not [r["id"] for r in rows if r["verdict"] == "not measured"]
    for r in rows:
        assert f'id="{r["id"]}"' in html
        assert r["verdict"] in verdicts.VERDICTS
        assert r["value"] is not None or r["verdict"] in ("needs a GPU", "not checkable offline")
    for ch, data in res.items():
        for key, entry in data["values"].items():
            assert f"<code>{key}</code>" in html and entry["note"] in html, (ch, key)
    assert not site.network_refs(html) and "<script" not in html


def test_a_value_the_chapter_did_not_record_shows_as_not_measured(tmp_path, monkeypatch, fixed):
    c = next(c for c in CLAIMS if c.evidence == "measured" and split_key(c.key, c.chapter)[0] == c.chapter)
    res = synthetic_results(tmp_path, monkeypatch, drop=(c.chapter, c.key))
    rows, html = report_of(res)
    row = next(r for r in rows if r["id"] == c.id)
    assert row["verdict"] == "not measured"
    assert row["reason"] == f"not measured (chapter {c.chapter} did not record {c.key})"
    assert f"did not record {c.key}" in html


# ---- verdicts for known inputs -------------------------------------------------------------------

def data(chapter: str, device: str = "cpu", **values) -> dict:
    return {"chapter": chapter, "device": device, "started": "2026-01-01T00:00:00+00:00",
            "values": {k: {"value": v, "unit": "x", "note": f"note {k}"} for k, v in values.items()}}


def made(expect="0.5..0.6", evidence="measured", fails="not here", key="k", gpu="", also=()) -> Claim:
    return Claim("a", "setup", "c", "t", "m", key, parse_expect(expect), evidence, fails, "why", "s",
                 tuple(also), gpu)


@pytest.mark.parametrize("fails, value, verdict", [
    ("not here", 0.55, "holds"), ("not here", 0.7, "does not hold here"), ("wrong", 0.7, "wrong"),
    ("depends", 0.7, "depends")])
def test_verdict_follows_fails(fails, value, verdict):
    row = verdicts.judge(made(fails=fails), {"setup": data("setup", k=value)}, "cpu")
    assert row["verdict"] == verdict and (row["reason"] == "why") == (verdict != "holds")


@pytest.mark.parametrize("lo, hi, verdict", [(0.52, 0.58, "holds"), (0.45, 0.58, "inconclusive"),
                                             (0.61, 0.7, "does not hold here")])
def test_a_spread_decides_with_its_interval(lo, hi, verdict, tmp_path, monkeypatch, fixed):
    monkeypatch.setenv(results.ENV_VAR, str(tmp_path))
    results.record("setup", "k", (lo + hi) / 2, "x", "median of 5", spread=(lo, hi, 5))
    row = verdicts.judge(made(), {"setup": results.load("setup")}, "cpu")
    assert row["verdict"] == verdict and (row["lo"], row["hi"], row["n"]) == (lo, hi, 5)
    if verdict == "inconclusive":
        assert "over 5 runs" in row["reason"]


def test_spread_is_checked(tmp_path, monkeypatch, fixed):
    monkeypatch.setenv(results.ENV_VAR, str(tmp_path))
    with pytest.raises(ValueError, match="spread"):
        results.record("setup", "k", 1.0, spread=(2.0, 1.0, 3))


def test_a_gpu_row_needs_a_gpu_on_a_cpu_and_is_judged_on_a_cuda_run():
    c = made(expect="> 900", evidence="gpu", gpu="fn:whisper_hour_h100_s")
    fns = FAKE_FNS.__getitem__
    on_cpu = verdicts.judge(c, {"setup": data("setup", k=20.2)}, "cpu", fns)
    assert on_cpu["verdict"] == "needs a GPU" and on_cpu["expectation"]["value"] == 0.3
    assert "0.300 s" in on_cpu["reason"] and "measured here: 20.2 x" in on_cpu["reason"]
    assert verdicts.judge(c, {"setup": data("setup", "cuda", k=1200.0)}, "cuda", fns)["verdict"] == "holds"
    slow = verdicts.judge(c, {"setup": data("setup", "cuda", k=300.0)}, "cuda", fns)
    assert slow["verdict"] == "does not hold here"
    missing = made(evidence="gpu", gpu="expected_ceiling")
    row = verdicts.judge(missing, {"setup": data("setup", k=0.5)}, "cpu")
    assert row["verdict"] == "not measured" and "did not record expected_ceiling" in row["reason"]


def test_missing_chapter_nan_inf_and_computed_rows():
    none = verdicts.judge(made(), {"setup": None}, "cpu")
    assert none["reason"] == "not measured (chapter setup did not record k)"
    nan = data("setup", k=None)
    nan["values"]["k"]["nonfinite"] = "nan"
    assert verdicts.judge(made(), {"setup": nan}, "cpu")["reason"] == "recorded as nan"
    never = data("setup", k=None)
    never["values"]["k"]["nonfinite"] = "inf"  # e.g. no crossover at all
    row = verdicts.judge(made(expect="> 0"), {"setup": never}, "cpu")
    assert (row["verdict"], row["value"]) == ("does not hold here", "inf")
    fn = made(expect="== true", evidence="computed", fails="wrong", key="fn:torch_total_mem")
    snippet = verdicts.judge(fn, {}, "cpu", FAKE_FNS.__getitem__)
    assert snippet["verdict"] == "wrong" and snippet["note"] == "declares total_memory"


def test_fmt_value_summary_and_kinds():
    assert [verdicts.fmt_value(v, u) for v, u in [(295.34, "FLOPs/byte"), (16.83, "GB/s"), (1.4724, "x"),
                                                  (0.0625, ""), (1e-4, ""), (True, ""), (12345, "tokens"),
                                                  ("fp32", ""), (None, "x")]] == [
        "295 FLOPs/byte", "16.8 GB/s", "1.47 x", "0.062", "1.00e-04", "true", "12,345 tokens", "fp32", "n/a"]
    rows = [{"verdict": "holds", "evidence": "measured"}, {"verdict": "wrong", "evidence": "arithmetic"},
            {"verdict": "holds", "evidence": "arithmetic"}]
    counts = verdicts.summary(rows)
    assert counts["holds"] == 2 and counts["wrong"] == 1 and sum(counts.values()) == 3
    assert list(counts) == list(verdicts.VERDICTS)
    kinds = verdicts.by_kind(rows)
    assert kinds["measured"]["holds"] == 1 and kinds["arithmetic"] == {**dict.fromkeys(verdicts.VERDICTS, 0),
                                                                        "holds": 1, "wrong": 1}


# ---- computed checks -----------------------------------------------------------------------------

def test_whisper_arithmetic_known_answer():
    f = computed.whisper_window_flops()
    d, ffn = 1280, 5120
    assert f["encoder"] == 32 * (2 * (4 * d * d + 2 * d * ffn) * 1500 + 4 * 1500**2 * d)
    assert 629e6 < (4 * d * d + 2 * d * ffn) * 32 < 630e6  # large-v3's encoder: ~0.63 B weights
    hour = computed.whisper_hour_seconds()
    assert hour["value"] == pytest.approx(120 * f["total"] / 989.4e12) and 0.25 < hour["value"] < 0.35


def test_star_ratio_and_bias_share(monkeypatch):
    assert computed.star_ratio()["value"] == pytest.approx(50 / 15)  # the closer of 50/15 and 50/12
    assert computed.linear_bias_share()["value"] == 0  # no shipped LLM config adds a bias
    qwen2 = {"model_type": "qwen2", "qkv_bias": True}  # a family that does: the share must see it
    monkeypatch.setattr(computed, "load_config", lambda n: qwen2 if n == "Qwen3-4B" else {})
    shown = computed.linear_bias_share()
    assert shown["value"] == pytest.approx(1 / 5) and "Qwen3-4B" in shown["note"]


def test_declared_fields_reads_a_stub(tmp_path):
    stub = tmp_path / "s.pyi"
    stub.write_text("class _CudaDeviceProperties:\n    name: str\n    total_memory: int\nclass Other: ...\n")
    assert computed._declared_fields(stub, "_CudaDeviceProperties") == {"name", "total_memory"}
    assert computed._declared_fields(stub, "Missing") is None
    assert computed._declared_fields(tmp_path / "absent.pyi", "A") is None
    with pytest.raises(KeyError, match="known"):
        computed.compute("no_such_check")


# ---- pages that open offline, and make report's reuse-or-run -------------------------------------

def executed_notebook(error: bool = False, run: str | None = None):
    nb = nbformat.v4.new_notebook()
    if run:
        nb.metadata["labkit"] = {"run": run}  # as labkit.chapters.run_chapter stamps it
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
        if short == SETUP_ROW.chapter:
            assert SETUP_ROW.expect is not None
            results.record(short, SETUP_ROW.key, passing(SETUP_ROW.expect), "x")
        nbformat.write(executed_notebook(run=results.RUN_ID), out_dir / CHAPTERS[short])  # run_chapter stamps
        return 0

    monkeypatch.setattr(build, "run_chapter", fake_run)
    out, work = tmp_path / "reports", tmp_path / "build"
    work.mkdir()
    report = build.build(out, build_dir=work)
    assert sorted(calls) == ["hardware", "setup"]
    assert {r["id"]: r["verdict"] for r in report["rows"]}[SETUP_ROW.id] == "holds"
    assert report["chapters"]["production"]["state"] == "no notebook yet"
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    mine = f"machines/{machines.slug(*MACHINE)}.json"
    assert files == {"index.html", "glossary.html", "results.json", "chapters/lab.css",
                     "chapters/00_setup.html", "chapters/04_gpu_hardware.html", mine}
    assert site.page_digest((out / "chapters" / "00_setup.html").read_text()) == "d0"
    assert report["chapters"]["setup"]["digest"] == "d0"
    setup = json.loads((out / mine).read_text())["chapters"]["setup"]
    assert setup["values"]["ridge_flops_per_byte"]["value"] == 3.6
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
    DIGESTS["hardware"] = "d1"  # its notebook, ledger file or rules changed
    why = build.staleness(results.load("hardware"), work / CHAPTERS["hardware"])
    assert why and why.startswith("its notebook, ledger file, checks, or a labkit module or data file it")
    build.build(out, chapters=["setup"], build_dir=work)  # only setup may run; hardware is stale, left out
    assert calls.count("hardware") == 1
    assert not (out / "chapters" / "04_gpu_hardware.html").exists()
    assert report_left_out(out)["hardware"].startswith("not run (its notebook, ledger file, checks, or")
    build.build(out, build_dir=work)  # make report: only the changed chapter runs again
    assert calls.count("hardware") == 2 and calls.count("setup") == 2
    DIGESTS.clear()
    broken.add("setup")
    again = build.build(out, chapters=["setup"], rerun=True, build_dir=work)
    assert again["chapters"]["setup"]["error"] == "no usable results: the run recorded nothing"
    assert {r["id"]: r["verdict"] for r in again["rows"]}[SETUP_ROW.id] == "not measured"


SETUP_ROW = next(c for c in CLAIMS if c.chapter == "setup" and c.evidence == "measured" and "/" not in c.key
                 and c.expect is not None and c.expect.op != "==")


def passing(e: ledger.Expect) -> float:
    """A value that meets a numeric ``expect``."""
    if e.op == "range":
        assert e.lo is not None and e.hi is not None
        return (e.lo + e.hi) / 2
    assert isinstance(e.value, float)
    return e.value + (1 if e.op in (">", ">=") else -1)


def report_left_out(out: Path) -> dict:
    return {s: i["state"] for s, i in json.loads((out / "results.json").read_text())["chapters"].items()}


def test_staleness_known_answers(tmp_path, fixed, monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "small")
    monkeypatch.delenv("LABKIT_STUDY", raising=False)
    nb = tmp_path / "00_setup.ipynb"
    header = {"chapter": "setup", "digest": "d0", "machine": MACHINE[0], "profile": "small",
              "started": "2000-01-01T00:00:00+00:00", "updated": "2000-01-01T00:00:00+00:00"}
    assert build.staleness(None, nb) == "no results recorded yet"
    header["run"] = "kernel-1"
    assert build.staleness(header, nb) == "its executed notebook is missing"
    nb.write_text('{"metadata": {"labkit": {"run": "kernel-1"}}}')
    assert build.staleness(header, nb) is None
    # a later run (an AVX2 run whose results went elsewhere) overwrote the executed copy
    nb.write_text('{"metadata": {"labkit": {"run": "kernel-2"}}}')
    another = "its executed notebook comes from another run than the recorded values"
    assert build.staleness(header, nb) == another
    nb.write_text("{}")  # a copy from before run ids were stamped
    assert build.staleness(header, nb) == another
    nb.write_text('{"metadata": {"labkit": {"run": "kernel-1"}}}')
    assert build.staleness({**header, "machine": "another"}, nb) == "recorded on another machine"
    assert build.staleness({**header, "profile": "full"}, nb) == "recorded with profile full"
    studied = {**header, "study": True}  # a report's run: with the Going further studies
    assert build.staleness(studied, nb) == "recorded with the Going further studies"
    monkeypatch.setenv("LABKIT_STUDY", "1")
    assert build.staleness(studied, nb) is None
    assert build.staleness(header, nb) == "recorded without the Going further studies"
    monkeypatch.delenv("LABKIT_STUDY")
    other_code = {**header, "digest": "d9"}
    stale = build.staleness(other_code, nb)
    assert stale and stale.startswith("its notebook, ledger file, checks, or a labkit module")
    assert build.staleness(other_code, nb, just_ran=True) is None  # the run just made, whatever the code
    assert (build.staleness({"values": {}}, nb) or "").startswith("its results file has no run times")


# ---- machines side by side, no absolute paths ------------------------------------------------------

def test_machine_files_slug_and_relative_paths(tmp_path):
    line = "cpu · Intel(R) Xeon(R) Processor (x86_64, 2 cores) · torch 2 · Linux · torch CPU kernels AVX2"
    s = machines.slug(line, "cpu")
    assert s.startswith("cpu-intel-xeon-") and s != machines.slug(line.replace("AVX2", "AVX512"), "cpu")
    home = Path.home()
    where = [f"{paths.REPO}/build/x.json", f"{home}/.cache/labkit", f"{tempfile.gettempdir()}/x.pt"]
    assert machines.relative_paths({"a": where, "n": 3}) == {
        "a": ["./build/x.json", "~/.cache/labkit", "$TMPDIR/x.pt"], "n": 3}
    # a checkout inside the temporary folder (a fresh clone in /tmp/x): each path is replaced whole
    tmp = tempfile.gettempdir()
    clone, text = Path(tmp) / "x", f"{tmp}/x/a.json {tmp}/x.pt {tmp}/xy"
    assert machines.unpath(text, clone, Path("/nohome")) == "./a.json $TMPDIR/x.pt $TMPDIR/xy"
    (tmp_path / "machines").mkdir()
    (tmp_path / "machines" / "broken.json").write_text("{")
    (tmp_path / "machines" / "other.json").write_text(json.dumps({"machine": "gpu · H100", "rows": {}}))
    assert [m["file"] for m in machines.read_machines(tmp_path)] == ["machines/other.json"]


def test_the_front_page_shows_other_machines_beside_this_one(tmp_path, monkeypatch, fixed):
    res = synthetic_results(tmp_path, monkeypatch)
    rows, _ = report_of(res)
    first = rows[0]
    other = {"machine": "cuda · NVIDIA H200 (139 GiB) · AMD EPYC", "date": "2026-12-01", "commit": "abc",
             "rows": {first["id"]: {"key": first["key"], "expect": first["expect"], "value": 42.0,
                                    "unit": "x", "verdict": "depends"},
                      rows[1]["id"]: {"key": "an_old_key", "expect": rows[1]["expect"], "value": 7654.5,
                                      "unit": "x", "verdict": "holds"}}}
    info = {s: {"number": n[:2], "notebook": n, "state": "ran"} for s, n in CHAPTERS.items()}
    html = page.index_page({"machine": MACHINE[0], "date": "2026-01-01", "source": SOURCE, "profile": "small",
                            "summary": verdicts.summary(rows), "by_kind": verdicts.by_kind(rows),
                            "chapters": info, "rows": rows, "results": res, "machines": [other]})
    assert "NVIDIA H200" in html and "42.0 x" in html and "not in this ledger then" in html
    # a row re-keyed since that machine's run shows no figure from the old rule beside the new one
    assert "judged by another rule then" in html, rows[1]
    assert "7654.5" not in html
    assert machines.same_rule({"key": "k", "expect": "> 1"}, {"key": "k", "expect": "> 1"})
    assert not machines.same_rule({"key": "k", "expect": "> 2"}, {"key": "k", "expect": "> 1"})
    assert not machines.same_rule({"value": 1.0}, {"key": "k", "expect": "> 1"})  # rule not recorded


def _one_cell_chapter(folder: Path, source: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, folder / CHAPTERS["setup"])


@pytest.mark.slow  # starts a Jupyter kernel (about 4 s)
def test_run_chapter_stamps_the_kernels_run_on_the_executed_copy(tmp_path, monkeypatch, capsys):
    """The report pairs a page with the run whose figures it shows: an executed copy carries the run id
    its kernel recorded under, and a run that recorded nothing carries none."""
    from labkit import chapters

    monkeypatch.setenv(results.ENV_VAR, str(tmp_path / "results"))  # the kernel inherits it
    monkeypatch.setattr(chapters, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(chapters, "REPO", tmp_path)
    monkeypatch.setattr(chapters, "available", lambda: {"setup": CHAPTERS["setup"]})
    _one_cell_chapter(tmp_path, "from labkit import results\nresults.record('setup', 'x', 1.0, 'u')\n"
                                "print('CHECK ok   it held')\nprint('holds  1.0 a claim')")
    assert chapters.run_chapter("setup", timeout=120, out_dir=tmp_path / "build") == 0
    shown = capsys.readouterr().out  # the last cell's output: the checks, then the claims
    assert "CHECK ok   it held" in shown and "holds  1.0 a claim" in shown
    executed = tmp_path / "build" / CHAPTERS["setup"]
    run = (results.load("setup") or {})["run"]
    assert build.executed_run(executed) == run and run != results.RUN_ID  # the kernel's, not this process's
    _one_cell_chapter(tmp_path, "x = 1")  # records nothing: the copy must not claim the old run
    assert chapters.run_chapter("setup", timeout=120, out_dir=tmp_path / "build") == 0
    assert build.executed_run(executed) is None
    assert build.staleness(results.load("setup"), executed) is not None


def test_the_committed_report_is_refused_from_a_tree_with_changes(tmp_path, monkeypatch):
    import subprocess

    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)
    run("init", "-q")
    (repo / "x.py").write_text("1")
    run("add", "x.py")
    run("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    monkeypatch.setattr(build, "REPO", repo)
    assert build.unclean(repo / "reports") is None  # a clean tree
    (repo / "reports" / "index.html").write_text("new")  # the report's own files do not count
    assert build.unclean(repo / "reports") is None
    (repo / "x.py").write_text("2")
    why = build.unclean(repo / "reports")
    assert why and "x.py" in why and "--out" in why
    assert build.unclean(tmp_path / "elsewhere") is None  # written elsewhere: any tree
    assert build.unclean(tmp_path / "elsewhere", share=repo / "reports" / "machines")
    assert build.main(["--out", str(repo / "reports")]) == 2


def test_machine_labels_say_what_each_column_is():
    from labkit.report.machines import machine_label

    xeon = ("cpu · Intel(R) Xeon(R) Processor (x86_64, 2 cores / 2 threads, 24 GiB RAM, ISA avx avx2 fma "
            "avx512f avx512_bf16 amx_tile) · torch 2.13.0+cpu · Python 3.11.7 · Linux")
    capped = "AVX2 cap emulated on Intel Xeon (has AVX-512, BF16, AMX)"
    assert machine_label(xeon + " · torch CPU kernels AVX2") == capped
    assert machine_label(xeon + " · torch CPU kernels AVX512") == "Intel Xeon, AMX: real"
    epyc = ("cpu · AMD EPYC 7B13 (x86_64, 2 cores / 2 threads, 24 GiB RAM, ISA avx avx2 fma) · torch · "
            "torch CPU kernels AVX2")
    assert machine_label(epyc) == "AMD EPYC 7B13, AVX2: real"


def test_the_headline_counts_only_measured_holds_as_held_here():
    by_kind = {k: dict.fromkeys(verdicts.VERDICTS, 0) for k in verdicts.KINDS}
    by_kind["measured"] |= {"holds": 3, "does not hold here": 2, "not measured": 1}
    by_kind["computed"] |= {"holds": 7}
    by_kind["simulated"] |= {"holds": 4}
    text = page.held_by_kind(by_kind)
    assert "Held on this machine: <b>3</b> of 5 claims measured here" in text
    assert "computed from configs, files or datasheets: 7 of 7 hold" in text and "simulated: 4 of 4" in text


def test_the_decode_speed_table_shows_what_chapters_recorded():
    from labkit.report.decode_speeds import SPEEDS, decode_speed_rows, decode_speed_section

    results = {"metrics": {"values": {"llamacpp_bench_gen_tps": {"value": 104.1, "unit": "tok/s",
                                                                 "note": "llama-bench, 2 threads"}}},
               "selection": None}
    rows = decode_speed_rows(results)
    assert [(r["chapter"], r["key"]) for r in rows] == [("metrics", "llamacpp_bench_gen_tps")]
    assert "104" in rows[0]["value"] and rows[0]["note"] == "llama-bench, 2 threads"
    assert "llama-bench, 2 threads" in decode_speed_section(results)
    assert decode_speed_section({}) == ""
    # every key names a figure its chapter recorded for the committed report (GGUF figures come from
    # labkit.experiments.gguf_levels.figures, out of the notebooks' sight)
    committed = json.loads((REPO / "reports" / "results.json").read_text())["results"]
    for chapter, key, *_ in SPEEDS:
        assert key in ((committed.get(chapter) or {}).get("values") or {}), (chapter, key)


def test_the_chapter_table_shows_judged_claims_with_reasons_and_lists_outside_facts_in_one_paragraph():
    from labkit.report.claims_table import claims_text

    rows: list[dict[str, Any]] = [
        {"verdict": "depends", "value": 2.5, "unit": "x", "claim": "A is faster", "expect": "> 3",
         "reason": "only on big inputs"},
        {"verdict": "not checkable offline", "value": None, "claim": "Vendor X ships images", "reason": "a"},
        {"verdict": "not checkable offline", "value": None, "claim": "Tool Y is well-known", "reason": "b"}]
    text = claims_text(rows)
    assert text.splitlines()[:2] == ["depends  2.50 x  A is faster (expected > 3)",
                                     "         why: only on big inputs"]
    assert text.splitlines()[2] == ("not checkable offline (2; why, in the report): Vendor X ships images; "
                                    "Tool Y is well-known")
    assert "why: a" not in text
    assert claims_text([]) == "(no claims)"
    point = {"verdict": "holds", "value": 3.1, "unit": "x", "claim": "C", "lo": 3.1, "hi": 3.1}   # no band
    assert claims_text([point]) == "holds  3.10 x  C" and verdicts.fmt_value(-391.2, "%") == "-391%"
