"""What each chapter measured, kept for the lab report (every chapter; the report is ``make report``).

A chapter calls :func:`record` for each figure the report checks a tutorial claim against::

    from labkit.results import record
    record("hardware", "decode_intensity_over_ridge", 0.03, "x", "fp32, batch 1")

Each call rewrites ``build/results/<chapter>.json`` at once (``$LABKIT_RESULTS`` names another
folder), so a run killed halfway keeps what it had recorded. The file's header says where the
values come from: the machine (one line, as ``labkit doctor`` describes it), the git commit (and
whether the working tree differed from it, with a digest of the difference), the profile, and when.

Runs do not mix: values belong to one *run*, one Python process (a chapter runs in one kernel
process, headless or in JupyterLab). The first call of a new process starts the file afresh, so
a key an older run recorded and this run did not can never survive into the report. Re-running
cells in the same kernel overwrites their keys.

Values are JSON: bool, int, float or str; numpy and torch scalars are converted. A NaN or infinite
float is kept as ``null`` with ``"nonfinite"`` saying which (strict JSON has no NaN).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

from .chapters import CHAPTERS, digest, used_sources
from .hardware.machine import detect
from .paths import REPO, RESULTS_VAR, results_dir
from .settings import profile, study

ENV_VAR = RESULTS_VAR
RUN_ID = uuid.uuid4().hex  # one per process: a new kernel is a new run
KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_LOCK = threading.Lock()
# What the chapters run (git pathspecs): a change here makes earlier results stale for the report.
CODE = ("labkit", "notebooks", "data", "pyproject.toml",
        ":(exclude)labkit/report", ":(exclude)data/claims")


def results_path(chapter: str, folder: Path | None = None) -> Path:
    """``<folder>/<chapter>.json``; ``ValueError`` for a name that is not a chapter's short name."""
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be a chapter's short name, one of {', '.join(CHAPTERS)}; "
                         f"got {chapter!r}")
    return (folder or results_dir()) / f"{chapter}.json"


def now() -> str:
    """Local time with its UTC offset, ISO 8601, to the second."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def machine_line(info: dict[str, Any]) -> str:
    """One line naming the machine from :func:`labkit.hardware.machine.detect`'s dict: device,
    accelerator and its memory, CPU, cores, RAM, ISA flags, torch, Python and OS. Only fields that
    do not change between runs (no free memory, no thread count), so two runs compare equal."""
    acc, cpu = info["accelerator"], info["cpu"]
    gib = 1024**3
    parts = [info["device"]]
    if info["device"] != "cpu":
        cc = f", compute capability {acc['compute_capability']}" if "compute_capability" in acc else ""
        parts.append(f"{acc['name']} ({acc['memory_bytes'] / gib:.0f} GiB{cc}, {acc.get('count', 1)} GPU(s))")
    parts.append(f"{cpu['name']} ({cpu['arch']}, {cpu['physical_cores']} cores / {cpu['logical_cores']} "
                 f"threads, {cpu['ram_bytes'] / gib:.0f} GiB RAM, ISA {' '.join(cpu['isa']) or '-'})")
    parts += [f"torch {info['torch']}", f"Python {info['python']}", info["os"]]
    return " · ".join(parts)


@functools.cache
def machine_key() -> tuple[str, str]:
    """``(machine_line, device)`` of this machine, detected once per process."""
    import torch

    info = detect()
    # the ISA torch's CPU kernels use: an AVX2 cap (make test-avx2) makes this another machine
    cap = torch.backends.cpu.get_cpu_capability()
    kernels = f" · torch CPU kernels {cap}" if info["device"] == "cpu" else ""
    return machine_line(info) + kernels, info["device"]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


@functools.cache
def source() -> dict[str, Any]:
    """The code the values come from: ``commit`` (``None`` outside a git checkout), ``dirty`` (what
    the chapters run differs from it) and ``diff_sha`` (digest of those changes, tracked and untracked,
    ``None`` when clean). Only :data:`CODE` counts: editing the README, the tests, the report's own
    code or its ledger, or writing a report, does not make recorded results stale."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff_sha": None}
    diff = _git("diff", "HEAD", "--no-ext-diff", "--binary", "--", *CODE) or ""
    untracked = (_git("ls-files", "--others", "--exclude-standard", "--", *CODE) or "").split("\n")
    h = hashlib.sha256(diff.encode())
    for name in sorted(n for n in untracked if n):
        path = REPO / name
        h.update(name.encode())
        if path.is_file() and path.stat().st_size <= 5 * 2**20:
            h.update(path.read_bytes())
        elif path.exists():
            h.update(str(path.stat().st_size).encode())
    dirty = bool(diff) or any(untracked)
    return {"commit": commit.strip(), "dirty": dirty, "diff_sha": h.hexdigest()[:16] if dirty else None}


def header(chapter: str) -> dict[str, Any]:
    """The header of a new results file of ``chapter`` for this process's run."""
    line, device = machine_key()
    stamp = now()
    return {"chapter": chapter, "notebook": CHAPTERS[chapter], "digest": digest(chapter), "run": RUN_ID,
            "started": stamp,
            "updated": stamp, "machine": line, "device": device, **source(), "profile": profile().name,
            "study": study(), "values": {}}


def plain(value: Any) -> tuple[bool | int | float | str | None, str | None]:
    """``(JSON value, nonfinite)``: numpy/torch scalars become Python ones; NaN and infinities become
    ``None`` with ``"nan"``, ``"inf"`` or ``"-inf"``. ``ValueError`` for anything else (lists, dicts)."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, bool | int | float | str):
        try:
            value = item()
        except (ValueError, RuntimeError):  # an array or tensor with more than one element
            pass
    if not isinstance(value, bool | int | float | str):
        raise ValueError(f"value must be a bool, int, float or str (a numpy or torch scalar is converted); "
                         f"got {type(value).__name__}: record one number per key")
    if isinstance(value, float) and not math.isfinite(value):
        return None, "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value, None


def load(chapter: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The results file of ``chapter`` as a dict, or ``None`` when there is none (or it is unreadable)."""
    path = results_path(chapter, folder)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("values"), dict) else None


def current(chapter: str) -> dict[str, Any] | None:
    """The results ``chapter`` recorded in **this** process's run (as :func:`load` returns them), or
    ``None`` when this process recorded nothing for it (a previous run's file is never returned)."""
    data = load(chapter)
    return data if data is not None and data.get("run") == RUN_ID else None


def seal(chapter: str) -> None:
    """Bring this run's results file of ``chapter`` up to date with every file the run has used by now
    (the chapter's closing cell calls it): a module imported after the last :func:`record` then counts
    in the digest too. Nothing happens when this process recorded nothing for the chapter."""
    with _LOCK:
        data = current(chapter)
        if data is not None:
            _save(chapter, data)


def unmeasured(chapter: str, key: str, why: str) -> None:
    """Record that ``key`` could not be measured in this run, and ``why`` (e.g. "llama.cpp is not built
    here: make llamacpp"): the report's verdict is then "not measured" with that reason, and the
    chapter's closing cell does not count the figure as forgotten."""
    if not isinstance(why, str) or not why.strip():
        raise ValueError("why must say, in words, why the figure could not be measured")
    _write(chapter, key, {"value": None, "unit": "", "note": why, "at": now(), "unmeasured": True})


def record(chapter: str, key: str, value: bool | int | float | str, unit: str = "", note: str = "", *,
           spread: tuple[float, float, int] | None = None) -> None:
    """Record one figure a chapter measured or computed, for the report.

    ``chapter`` is the short name (``"setup"``, ``"concepts"``, ... ``"production"``), ``key`` a name
    for the figure (letters, digits, ``_``, ``.``, ``-``), ``unit`` its unit as the report prints it
    (``"GB/s"``, ``"x"`` for ratios, ``""`` for counts and flags), ``note`` how it was measured.
    ``spread``: ``(lo, hi, n)`` when the value summarizes ``n`` repeated runs (e.g.
    :func:`labkit.stats.median_interval`); the report's verdict then uses the interval. The file is
    rewritten at once; the first call of a new process starts it afresh."""
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise ValueError(f"key must be a name of letters, digits, '_', '.' or '-', got {key!r}")
    if not isinstance(unit, str) or not isinstance(note, str):
        raise ValueError(f"unit and note must be strings, got {unit!r} and {note!r}")
    v, nonfinite = plain(value)
    extra: dict[str, Any] = {}
    if spread is not None:
        lo, hi, n = (plain(x)[0] for x in spread)
        numbers = isinstance(lo, int | float) and isinstance(hi, int | float) and isinstance(n, int)
        if not numbers or lo > hi:  # type: ignore[operator]
            raise ValueError(f"spread must be (lo, hi, n) with finite lo <= hi and n an int, got {spread!r}")
        extra = {"lo": lo, "hi": hi, "n": n}
    entry: dict[str, Any] = {"value": v, "unit": unit, "note": note, "at": now(), **extra}
    if nonfinite:
        entry["nonfinite"] = nonfinite
    _write(chapter, key, entry)


def _write(chapter: str, key: str, entry: dict[str, Any]) -> None:
    """Put ``entry`` under ``key`` in ``chapter``'s results file of this run, rewritten at once."""
    path = results_path(chapter)
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise ValueError(f"key must be a name of letters, digits, '_', '.' or '-', got {key!r}")
    with _LOCK:
        data = load(chapter, path.parent)
        if data is None or data.get("run") != RUN_ID:
            data = header(chapter)
        data["values"][key] = entry
        data["updated"] = entry["at"]
        _save(chapter, data)


def _save(chapter: str, data: dict[str, Any]) -> None:
    """Write ``data`` as ``chapter``'s results file, atomically, with the files the run has used so far
    and their digest."""
    path = results_path(chapter)
    data["sources"] = used_sources()  # what the run has used so far: its digest covers all of it
    data["digest"] = digest(chapter, data["sources"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
