"""The lab report's front page, ``index.html`` (every chapter): one self-contained HTML file.

What it shows, top to bottom: the machine and date, how many claims got each verdict, the chapter
index (links to the executed chapters' pages), the claims table (claim, what the tutorial says,
what this machine measured, the verdict and why, the chapter), the bundled model's decode speed as
each chapter measured it, then every value each chapter recorded. Plain HTML with inline CSS: no
script, no font or stylesheet from the network.
"""

from __future__ import annotations

from html import escape
from typing import Any

from .decode_speeds import decode_speed_section
from .machines import machine_label, same_rule
from .verdicts import VERDICTS, fmt_value

COLORS = {"holds": "#1a7f37", "does not hold here": "#9a6700", "depends": "#8250df", "wrong": "#cf222e",
          "inconclusive": "#bc4c00", "needs a GPU": "#0969da", "not measured": "#6e7781",
          "not checkable offline": "#57606a"}
KIND_TEXT = {"measured": "measured on this machine",
             "simulated": "simulated (a model's output, fed measured inputs)",
             "gpu": "needs a GPU to measure",
             "computed": "computed from configs, files or datasheets (any machine)",
             "lookup": "looked up: a datasheet, price or config value restated",
             "arithmetic": "the tutorial's own arithmetic, re-done", "outside": "an outside fact"}
CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto;
       max-width: 1360px; padding: 0 16px; color: #1f2328; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 32px; }
.meta { color: #57606a; font-size: 13px; } .meta code { font-size: 12px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0; }
table.claims { table-layout: fixed; }
th, td { border-bottom: 1px solid #d0d7de; padding: 6px 8px; text-align: left; vertical-align: top; }
table.claims td { overflow-wrap: anywhere; }  /* fixed columns: a long key may break anywhere; other
                                                 tables size to their words and keep them whole */
th { background: #f6f8fa; font-size: 13px; }
td.q { font-style: italic; color: #424a53; max-width: 340px; }
td.v { font-variant-numeric: tabular-nums; }
.headline { font-size: 17px; } .headline b { font-size: 20px; }
.small { color: #57606a; font-size: 12px; } .badge { color: #fff; border-radius: 10px;
  padding: 1px 8px; font-size: 12px; white-space: nowrap; }
.counts span { margin-right: 12px; }
"""


def badge(verdict: str) -> str:
    """A verdict as a colored label."""
    return f'<span class="badge" style="background:{COLORS.get(verdict, "#6e7781")}">{escape(verdict)}</span>'


def _also(row: dict[str, Any]) -> str:
    items = [f"{escape(a['key'])} {escape(fmt_value(a['value'], a['unit']))}" if a["value"] is not None
             else f"{escape(a['key'])}: {escape(a['note'])}" for a in row["also"]]
    return f'<div class="small">{"; ".join(items)}</div>' if items else ""


def _value(row: dict[str, Any]) -> str:
    if row.get("value") is None:
        return "&mdash;"
    shown = escape(fmt_value(row["value"], row.get("unit", "")))
    if row.get("lo") is not None and row.get("hi") is not None:
        n = f" over {row['n']} runs" if row.get("n") else ""
        shown += (f'<div class="small">{escape(fmt_value(row["lo"]))}..'
                  f'{escape(fmt_value(row["hi"], row.get("unit", "")))}{escape(n)}</div>')
    return shown


def _machines(row: dict[str, Any], machines: list[dict[str, Any]]) -> str:
    cells = []
    for m in machines:
        r = m["rows"].get(row["id"])
        if r is None:
            cells.append('<td class="small">not in this ledger then</td>')
        elif not same_rule(r, row):
            cells.append('<td class="small">judged by another rule then</td>')
        else:
            cells.append(f'<td class="v">{_value(r)}<div>{badge(r["verdict"])}</div></td>')
    return "".join(cells)


def claim_row(row: dict[str, Any], chapters: dict[str, dict[str, Any]],
              others: list[dict[str, Any]] | None = None) -> str:
    """One ``<tr>`` of the claims table (``others``: other machines' files, one column each)."""
    ch = chapters.get(row["chapter"], {})
    link = (f'<a href="{escape(ch["html"])}">{escape(ch["number"])} {escape(row["chapter"])}</a>'
            if ch.get("html") else escape(row["chapter"]))
    reason = f'<div class="small">{escape(row["reason"])}</div>' if row["reason"] else ""
    when = f"<br>recorded {escape(row['at'][:10])}" if row.get("at") else ""
    expect = f"expected {escape(row['expect'])}" if row.get("expect") else ""
    section = f" &middot; tutorial: {escape(row['section'])}" if row.get("section") else ""
    return (f'<tr id="{escape(row["id"])}"><td><b>{escape(row["claim"])}</b>'
            f'<div class="small">{escape(row["id"])} &middot; {escape(KIND_TEXT[row["evidence"]])}'
            f'{section}</div></td>'
            f'<td class="q">{escape(row["tutorial"])}</td>'
            f'<td class="v">{_value(row)}<div class="small">{expect}{when}</div></td>'
            f'<td>{escape(row["measure"])}{_also(row)}</td>'
            f"<td>{badge(row['verdict'])}{reason}</td>{_machines(row, others or [])}<td>{link}</td></tr>")


OTHERS = " Other machines' figures (their files in machines/) are shown beside this one's."


def kind_counts(by_kind: dict[str, dict[str, int]]) -> str:
    """A table: for each kind of evidence, how many claims got each verdict (holds counted apart)."""
    head = "".join(f"<th>{badge(v)}</th>" for v in VERDICTS)
    body = "".join(f"<tr><td>{escape(KIND_TEXT[k])}</td>" + "".join(
        f'<td class="v">{n or ""}</td>' for n in counts.values())
        + f'<td class="v">{sum(counts.values())}</td></tr>'
        for k, counts in by_kind.items() if sum(counts.values()))
    return f"<table><tr><th>evidence</th>{head}<th>rows</th></tr>{body}</table>"


def held_by_kind(by_kind: dict[str, dict[str, int]]) -> str:
    """The headline: how many measured claims held on this machine, then the holds of every other kind
    of evidence counted apart (a computed or looked-up hold is no measurement)."""
    def holds(kind: str) -> tuple[int, int]:
        counts = by_kind.get(kind, {})
        judged = sum(n for v, n in counts.items() if v not in ("not checkable offline", "not measured"))
        return counts.get("holds", 0), judged

    held, of = holds("measured")
    rest = "; ".join(f"{escape(KIND_TEXT[k].split(' (')[0].split(':')[0])}: {h} of {n} hold"
                     for k in ("simulated", "computed", "lookup", "arithmetic") for h, n in [holds(k)] if n)
    return (f'<p class="headline">Held on this machine: <b>{held}</b> of {of} claims measured here.</p>'
            f'<p class="small">Other evidence, counted apart: {rest}.</p>')


def chapter_rows(chapters: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The chapter index: number, name, page link, where its results came from, and its verdicts."""
    out = []
    for short, ch in chapters.items():
        mine = [r for r in rows if r["chapter"] == short]
        counts = ", ".join(f"{sum(r['verdict'] == v for r in mine)} {v}" for v in VERDICTS
                           if any(r["verdict"] == v for r in mine))
        page = f'<a href="{escape(ch["html"])}">{escape(ch["notebook"])}</a>' if ch.get("html") else escape(
            ch["notebook"])
        state = escape(ch.get("state", ""))
        if ch.get("error"):
            state += f'<div class="small">{escape(ch["error"])}</div>'
        out.append(f"<tr><td>{escape(ch['number'])}</td><td>{escape(short)}</td><td>{page}</td>"
                   f"<td>{state}</td><td>{escape(ch.get('date', ''))}</td><td>{escape(counts)}</td></tr>")
    return "\n".join(out)


def values_section(results: dict[str, dict[str, Any] | None]) -> str:
    """Every value each chapter recorded, chapter by chapter, with unit, note and time."""
    out = []
    for short, data in results.items():
        if not data:
            continue
        out.append(f'<h3 id="values-{escape(short)}">{escape(short)} <span class="small">'
                   f'{escape(data.get("notebook", ""))}, run {escape(data.get("started", ""))}</span></h3>')
        out.append("<table><tr><th>key</th><th>value</th><th>how</th><th>recorded</th></tr>")
        for key, e in data.get("values", {}).items():
            shown = fmt_value(e.get("value"), e.get("unit", "")) if e.get("value") is not None else (
                e.get("nonfinite") or "n/a")
            out.append(f'<tr><td><code>{escape(key)}</code></td><td class="v">{escape(shown)}</td>'
                       f'<td class="small">{escape(e.get("note", ""))}</td>'
                       f'<td class="small">{escape(e.get("at", ""))}</td></tr>')
        out.append("</table>")
    return "\n".join(out)


def index_page(report: dict[str, Any]) -> str:
    """The whole ``index.html`` from the report dict :func:`labkit.report.build.build` assembles
    (``machine``, ``date``, ``source``, ``profile``, ``summary``, ``by_kind``, ``chapters``, ``rows``,
    ``results``, ``machines``: every machine file, this one's included)."""
    src = report["source"]
    commit = (src.get("commit") or "no git checkout")[:12]
    commit += " with local changes" if src.get("dirty") else ""
    counts = "".join(f"<span>{badge(v)} {n}</span>" for v, n in report["summary"].items() if n)
    others = [m for m in report.get("machines", []) if m.get("machine") != report["machine"]]
    heads = "".join(f'<th>{escape(machine_label(m["machine"]))}'
                    f'<div class="small">{escape(m.get("date", "")[:10])}, '
                    f'{escape(m.get("commit", ""))}</div></th>'
                    for m in others)
    cols = ('<colgroup><col style="width:17%"><col style="width:19%"><col style="width:10%">'
            '<col style="width:22%"><col style="width:14%">' + '<col style="width:9%">' * len(others)
            + '<col style="width:7%"></colgroup>')
    claims = "\n".join(claim_row(r, report["chapters"], others) for r in report["rows"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Inference Engineering Lab: the tutorial's claims, checked</title><style>{CSS}</style></head>
<body>
<h1>The tutorial's claims, checked on this machine</h1>
<p class="meta">Machine: <b>{escape(machine_label(report["machine"]))}</b> &middot;
{escape(report["machine"])}<br>Report made {escape(report["date"])} from commit
<code>{escape(commit)}</code>, profile <code>{escape(report["profile"])}</code>, by <code>make report</code>
(<code>python -m labkit.report</code>). Measured values carry the date their chapter recorded them.</p>
{held_by_kind(report["by_kind"])}
<p class="counts">{counts}</p>
<h2>Verdicts by kind of evidence</h2>
<p class="small">Only a figure measured on this machine makes a claim "held on this machine". The other
kinds are counted apart: a simulation (a model's output, even when fed measured inputs), a figure computed
from shipped configs, files or datasheets (the same on any machine), a value looked up and restated, the
tutorial's own arithmetic re-done with its own inputs, or (for a GPU claim) a GPU run. Outside facts
(uptime, release dates) are listed but no offline lab can check them. What the lab checks of its own code
(the from-scratch model equals transformers', speculation writes what plain decoding writes) is no claim:
those checks run in each chapter and fail it when the code is wrong.</p>
{kind_counts(report["by_kind"])}
<p class="small"><b>holds</b>: the value meets the expected range (a value with a spread over repeated runs
holds only when the whole interval does). <b>does not hold here</b>: it does not, on this machine (the
reason says why). <b>depends</b>: the figure depends on a choice (model size, workload), shown beside it.
<b>wrong</b>: the tutorial's claim is wrong, whatever the machine. <b>inconclusive</b>: the spread over
repeated runs lies on both sides of the expectation. <b>needs a GPU</b>: only a GPU can measure it; the
computed expectation is shown. <b>not measured</b>: the chapter did not record the value.</p>
<h2>Chapters</h2>
<p class="small">Each page is the chapter as it ran for this report, with its outputs and plots; nothing
needs to run to read it. The terms they use: the <a href="glossary.html">glossary</a>.</p>
<table><tr><th>#</th><th>chapter</th><th>executed notebook</th><th>this report</th><th>recorded</th>
<th>verdicts</th></tr>
{chapter_rows(report["chapters"], report["rows"])}
</table>
<h2>Claims</h2>
<p class="small">{len(report["rows"])} claims.{OTHERS if others else ""}</p>
<table class="claims">{cols}<tr><th>claim</th><th>the tutorial says</th><th>value here</th>
<th>how it is measured</th><th>verdict</th>{heads}<th>chapter</th></tr>
{claims}
</table>
{decode_speed_section(report["results"])}
<h2>Every recorded value</h2>
{values_section(report["results"])}
</body></html>
"""
