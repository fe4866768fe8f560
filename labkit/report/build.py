"""``make report`` / ``python -m labkit.report``: run the chapters (or reuse their last run) and write
the lab report (every chapter).

For each chapter the report needs two things from one run: ``build/results/<chapter>.json`` (what
the chapter recorded, :mod:`labkit.results`) and the executed notebook ``build/<notebook>.ipynb``.
It reuses them when they come from the same chapter sources (the digest of its notebook, ledger
file, checks, and every labkit module and data file the run used, :func:`labkit.chapters.digest`),
this machine, this profile and with the Going further studies or without them as now
(``python -m labkit.report`` runs them: ``LABKIT_STUDY=1`` unless set otherwise), the notebook was
written after the last value was recorded, and the run raised no error; otherwise it runs the
chapter (:func:`labkit.chapters.run_chapter`). So ``make report`` re-runs only the chapters whose
digest changed. ``--rerun`` runs every chapter; ``--chapters`` picks some (the others are reused
when fresh, else left "not measured").

Writes into ``--out`` (default ``reports/``): ``index.html`` (the claims table), ``chapters/<notebook>.html``
(the executed chapters, offline, each stamped with its digest) with their ``lab.css``, ``glossary.html``
(``notebooks/glossary.md``, which the chapter pages link to),
``results.json`` (everything, with each chapter's digest) and ``machines/<machine>.json`` (this
machine's figures and verdicts; the files other machines left there are shown beside this one's).
No absolute path of the machine is written: the checkout becomes ``.`` and the home folder ``~``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat

from ..chapters import CHAPTERS, available, digest, names, resolve, run_chapter
from ..paths import REPO
from ..results import load, machine_key, source
from ..settings import profile, study
from .glossary import render_glossary
from .ledger import load_ledger
from .machines import read_machines, relative_paths, write_machine
from .page import index_page
from .site import exporter, notebook_status, render_notebook, write_css
from .verdicts import by_kind, judge_all, summary

BUILD = REPO / "build"


def staleness(data: dict[str, Any] | None, executed: Path, just_ran: bool = False) -> str | None:
    """Why a chapter's recorded run cannot be reused (``None``: it can): no results, another machine,
    other chapter sources (its digest) or profile, no executed notebook stamped with the recorded run.
    ``just_ran``: the report has just run the chapter and these are that run's results, whatever
    changed meanwhile, so the digest is not compared."""
    if data is None:
        return "no results recorded yet"
    if not {"started", "updated"} <= data.keys():
        return "its results file has no run times (not written by labkit.results)"
    machine, _ = machine_key()
    if data.get("machine") != machine:
        return "recorded on another machine"
    if not just_ran and data.get("digest") != digest(data.get("chapter", ""), data.get("sources", [])):
        return ("its notebook, ledger file, checks, or a labkit module or data file it used changed since "
                "it ran")
    if data.get("profile") != profile().name:
        return f"recorded with profile {data.get('profile')}"
    if data.get("study", False) != study():
        return ("recorded with" if data.get("study") else "recorded without") + " the Going further studies"
    if not executed.is_file():
        return "its executed notebook is missing"
    if executed_run(executed) != data.get("run"):
        return "its executed notebook comes from another run than the recorded values"
    return None


def executed_run(executed: Path) -> str | None:
    """The run id :func:`labkit.chapters.run_chapter` stamped on an executed notebook (``None``: none)."""
    try:
        meta = json.loads(executed.read_text()).get("metadata", {})
    except (OSError, ValueError):
        return None
    run = meta.get("labkit", {}).get("run")
    return run if isinstance(run, str) else None


def chapter_state(short: str, build_dir: Path, run: bool, rerun: bool, timeout: int) -> dict[str, Any]:
    """Reuse or run chapter ``short``; returns what the report says about it, with ``data`` (its
    results, ``None`` when unusable) and ``executed`` (the executed notebook, or ``None``)."""
    executed = build_dir / CHAPTERS[short]
    _, number, stem, _ = names(short)
    info: dict[str, Any] = {"chapter": short, "number": number, "notebook": CHAPTERS[short], "stem": stem,
                            "digest": digest(short)}
    data = load(short)
    why = staleness(data, executed)
    status = notebook_status(nbformat.read(executed, as_version=4)) if why is None else {"ok": True}
    if run and (rerun or why or not status["ok"]):
        reason = "asked to rerun" if rerun else why or "its last run failed"
        print(f"== {number} {short}: running ({reason}) ...", flush=True)
        t0, before = time.perf_counter(), data and data.get("run")
        rc = run_chapter(short, timeout=timeout, out_dir=build_dir)
        data = load(short)
        ran = data is not None and data.get("run") != before  # a new kernel recorded: a new run id
        why = staleness(data, executed, just_ran=True) if ran else "the run recorded nothing"
        info["state"] = f"ran for this report in {time.perf_counter() - t0:.0f} s"
        info["rc"] = rc
        if why is not None:
            info.update(ok=False, error=f"no usable results: {why}", date="", data=None, executed=None)
            return info
    elif why is None:
        assert data is not None  # staleness() says None only of usable results
        print(f"== {number} {short}: reusing its run of {data['started']} (same notebook, ledger, checks, "
              "modules and data files, machine and profile)")
        info["state"] = "reused a run of the same chapter sources on this machine"
    else:
        print(f"== {number} {short}: not run ({why})")
        info.update(state=f"not run ({why})", ok=False, error="", date="", data=None, executed=None)
        return info
    assert data is not None
    status = notebook_status(nbformat.read(executed, as_version=4))
    info.update(ok=status["ok"], error=status["error"], date=data["started"], data=data, executed=executed,
                digest=data.get("digest", ""), sources=data.get("sources", []))
    return info


def build(out: Path, chapters: list[str] | None = None, rerun: bool = False, timeout: int = 1800,
          build_dir: Path = BUILD) -> dict[str, Any]:
    """Make the report in ``out``; returns the report dict (what ``results.json`` holds)."""
    claims = load_ledger()
    wanted = {resolve(c) for c in chapters} if chapters else set(available())
    machine, device = machine_key()
    info: dict[str, dict[str, Any]] = {}
    for short in CHAPTERS:
        if short in available():
            info[short] = chapter_state(short, build_dir, short in wanted, rerun, timeout)
        else:
            _, number, stem, _ = names(short)
            info[short] = {"chapter": short, "number": number, "notebook": CHAPTERS[short], "stem": stem,
                           "digest": "", "state": "no notebook yet", "ok": False, "error": "", "date": "",
                           "data": None,
                           "executed": None}
    results = {short: i.pop("data") for short, i in info.items()}
    rows = judge_all(claims, results, device)
    pages = out / "chapters"
    exp = exporter()
    write_css(pages, exp)
    written = set()
    for short, i in info.items():
        executed = i.pop("executed")
        if executed is not None:
            page = pages / f"{i['stem']}.html"
            render_notebook(executed, page, f"{i['number']} · {short}", exp, i["digest"])
            i["html"] = f"chapters/{page.name}"
            written.add(page.name)
    for old in pages.glob("*.html"):
        if old.name not in written:
            old.unlink()
    render_glossary(out / "glossary.html", css=f"{pages.name}/lab.css")
    report = {"machine": machine, "device": device, "date": datetime.datetime.now().astimezone().isoformat(
        timespec="seconds"), "source": source(), "profile": profile().name, "summary": summary(rows),
        "by_kind": by_kind(rows), "chapters": info, "rows": rows, "results": results}
    report = relative_paths(report)
    out.mkdir(parents=True, exist_ok=True)
    write_machine(out, report)
    machines = read_machines(out)
    (out / "index.html").write_text(index_page({**report, "machines": machines}))
    report["machines"] = [m["file"] for m in machines]
    (out / "results.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return report


def unclean(out: Path, share: Path | None = None) -> str | None:
    """Why a report may not be written into the committed ``reports/`` now (``None``: it may): the
    checkout differs from its commit outside ``reports/`` and ``build/``, so no commit anyone can check
    out would have made it. A report written elsewhere (``--out``) may come from any tree."""
    committed = (REPO / "reports").resolve()
    targets = [p.resolve() for p in (out, share) if p is not None]
    if not any(t == committed or t.is_relative_to(committed) for t in targets):
        return None

    try:
        changed = subprocess.run(["git", "status", "--porcelain", "--", ".", ":(exclude)reports",
                                  ":(exclude)build"], cwd=REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if changed.returncode != 0:
        return None  # not a git checkout: nothing to name
    lines = [x for x in changed.stdout.splitlines() if x.strip()]
    if not lines:
        return None
    shown = ", ".join(x[3:] for x in lines[:5]) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    return (f"the checkout has changes not committed ({shown}); the committed report must name a commit "
            "anyone can check out: commit them first, or write the report elsewhere with --out DIR")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.report", description="Check every claim of the "
                                "tutorial on this machine and write the lab report (HTML, offline).")
    p.add_argument("--out", type=Path, default=REPO / "reports", help="folder to write (default: reports/)")
    p.add_argument("--rerun", action="store_true", help="run every chosen chapter even if a fresh run exists")
    p.add_argument("--chapters", nargs="+", metavar="CHAPTER",
                   help="run or reuse only these (short name, number or notebook); default: all")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per notebook cell (default 1800)")
    p.add_argument("--build-dir", type=Path, default=BUILD,
                   help="folder of the executed notebooks (default: build/; results follow $LABKIT_RESULTS)")
    p.add_argument("--share", type=Path, metavar="DIR",
                   help="also copy this machine's file into DIR (e.g. reports/machines, from another --out)")
    a = p.parse_args(argv)
    why = unclean(a.out, a.share)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        t0 = time.perf_counter()
        report = build(a.out, a.chapters, a.rerun, a.timeout, a.build_dir)
        if a.share:
            mine = write_machine(a.share, report, folder="")
            print(f"this machine's figures: {mine}")
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in a.out.rglob("*") if f.is_file())
    print(", ".join(f"{n} {v}" for v, n in report["summary"].items()))
    failed = [s for s, i in report["chapters"].items() if i["error"]]
    if failed:
        print(f"chapters that failed: {', '.join(failed)} (see the report)")
    left = [s for s, i in report["chapters"].items() if i["state"].startswith("not run")]
    if left:
        print(f"left out, without results: {', '.join(left)} (--chapters {' '.join(left)} runs them)")
    took = time.perf_counter() - t0
    print(f"report: {a.out / 'index.html'} ({size / 1e6:.1f} MB in {a.out}, made in {took:.0f} s)")
    return 0
