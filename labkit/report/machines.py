"""Each machine's figures beside the report (every chapter): ``reports/machines/<machine>.json``.

``make report`` writes the file of the machine it runs on (what each chapter recorded, the digest
of the chapter sources it ran, and each claim's value and verdict there) and leaves the files other
machines wrote. The report's front page shows them side by side per claim, so a reader sees how a
verdict moves with the hardware (an AVX2-only CPU, one with AMX, a GPU); the machine that made the
pages stays the one the chapters show. Committed files carry no absolute path: the checkout is
written as ``.`` and the home folder as ``~``.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from ..paths import REPO

FOLDER = "machines"


def slug(machine: str, device: str) -> str:
    """A file name for a machine line: device, the CPU or GPU's name, and a digest of the whole line
    (two machines with one CPU name but other ISA, memory or torch get two files)."""
    first = machine.split(" · ")[1] if " · " in machine else machine
    name = re.sub(r"\([^)]*\)|\b(R|TM)\b|Processor|CPU", " ", first)
    words = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-")
    return f"{device}-{words}-{hashlib.sha256(machine.encode()).hexdigest()[:8]}"


def unpath(text: str, repo: Path = REPO, home: Path | None = None) -> str:
    """``text`` with the checkout's absolute path made ``.``, the home folder ``~`` and the temporary
    folder ``$TMPDIR``: what a committed report may say of the machine that made it."""
    tmp = tempfile.gettempdir().rstrip("/")
    pairs = [(str(repo), "."), (str(home or Path.home()), "~"), (tmp, "$TMPDIR")]
    for path, short in sorted(pairs, key=lambda p: -len(p[0])):  # the longest first: a checkout in /tmp
        text = re.sub(re.escape(path) + r"(?![\w.\-])", short, text)  # whole names: /tmp/x, not /tmp/x.pt
    return text


def relative_paths(obj: Any, repo: Path = REPO, home: Path | None = None) -> Any:
    """``obj`` (JSON-like) with every string passed through :func:`unpath`."""
    home = home or Path.home()
    if isinstance(obj, str):
        return unpath(obj, repo, home)
    if isinstance(obj, dict):
        return {k: relative_paths(v, repo, home) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [relative_paths(v, repo, home) for v in obj]
    return obj


def machine_label(machine: str) -> str:
    """A short name for a machine line that says what it is: the CPU or GPU, its fastest feature, and
    whether torch's kernels were capped below what the CPU has (``make report-avx2`` emulates an
    AVX2-only CPU on a newer one), e.g. ``Intel Xeon, AMX: real`` or ``AVX2 cap emulated on Intel
    Xeon (has AVX-512, AMX)``."""
    parts = machine.split(" · ")
    if parts[0] != "cpu" and len(parts) > 1:
        return f"{parts[1].split(' (')[0]}: real GPU"
    cpu = parts[1] if len(parts) > 1 else machine
    name = cpu.split(" (")[0].replace("(R)", "").replace("(TM)", "").replace(" Processor", "").strip()
    isa = cpu.split("ISA ", 1)[1].rstrip(")").split() if "ISA " in cpu else []
    has = [label for flag, label in (("avx512f", "AVX-512"), ("avx512_bf16", "BF16"), ("amx_tile", "AMX"))
           if flag in isa]
    tag = "torch CPU kernels "
    kernels = next((p.removeprefix(tag) for p in parts if p.startswith(tag)), "")
    if kernels == "AVX2" and "AVX-512" in has:
        return f"AVX2 cap emulated on {name} (has {', '.join(has)})"
    return f"{name}, {has[-1] if has else 'AVX2'}: real" if name else machine


def machine_record(report: dict[str, Any]) -> dict[str, Any]:
    """What one machine's file holds, from the report dict: the machine, when and from what, each
    chapter's digest, run and values, and each claim's key, expectation, value, spread and verdict (the
    key and expectation say which rule judged it: :func:`same_rule`)."""
    chapters = {short: {"digest": data.get("digest", ""), "started": data.get("started", ""),
                        "values": data.get("values", {})}
                for short, data in report["results"].items() if data}
    fields = ("key", "expect", "value", "unit", "lo", "hi", "verdict", "evidence")
    rows = {r["id"]: {k: r.get(k) for k in fields} for r in report["rows"]}
    return {"machine": report["machine"], "device": report["device"], "date": report["date"],
            "commit": (report["source"].get("commit") or "")[:12], "profile": report["profile"],
            "summary": report["summary"], "by_kind": report["by_kind"], "chapters": chapters, "rows": rows}


def same_rule(theirs: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether another machine's row was judged by the rule the ledger has now (the same key and the
    same expectation): a row re-keyed or re-banded since then measured something else, so its figure
    and verdict must not sit beside this one's. A file that did not record its rule never matches."""
    return "key" in theirs and all(theirs.get(k) == row.get(k) for k in ("key", "expect"))


def write_machine(out: Path, report: dict[str, Any], folder: str = FOLDER) -> Path:
    """Write this machine's file into ``out/machines/`` (``out/<folder>``); returns its path."""
    path = out / folder / f"{slug(report['machine'], report['device'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(machine_record(report), indent=1, ensure_ascii=False) + "\n")
    return path


def read_machines(out: Path) -> list[dict[str, Any]]:
    """Every machine file in ``out/machines/`` (unreadable ones skipped), each with its ``file`` name."""
    found = []
    for path in sorted((out / FOLDER).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rows"), dict):
            found.append({**data, "file": f"{FOLDER}/{path.name}"})
    return found
