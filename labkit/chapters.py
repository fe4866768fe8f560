"""The chapters, every chapter: the names ``make lab-<name>`` and ``labkit run <name>`` accept.

A chapter can be named four ways: its short name (``concepts``), its number (``01``; a chapter placed
between two others has a letter after it, ``02b``),
its notebook's file name with or without the number (``01_key_concepts``, ``key_concepts``; a
trailing ``.ipynb`` is fine). :func:`resolve` maps any of them to the short name.

:func:`run_chapter` executes a notebook headless in a fresh kernel (nbclient), writes the
executed copy to ``build/``, prints what its last cell printed (the lab's own checks, then the
chapter's claims with their verdicts), and returns a process exit code (0 when every cell ran, so
every check held).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from .paths import DATA, NOTEBOOKS, OPENED, REPO, results_dir

CHAPTERS: dict[str, str] = {
    "setup": "00_setup.ipynb",
    "concepts": "01_key_concepts.ipynb",
    "metrics": "02_metrics.ipynb",
    "selection": "02b_choosing_a_model.ipynb",
    "internals": "03_llm_internals.ipynb",
    "hardware": "04_gpu_hardware.ipynb",
    "stack": "05_software_stack.ipynb",
    "optimization": "06_optimization.ipynb",
    "speculation": "06b_speculation_caching.ipynb",
    "beyond": "07_beyond_llms.ipynb",
    "production": "08_production.ipynb",
}


def available() -> dict[str, str]:
    """Short name -> notebook file, for the chapters whose notebook exists."""
    return {k: v for k, v in CHAPTERS.items() if (NOTEBOOKS / v).exists()}


def names(short: str) -> tuple[str, str, str, str]:
    """The four names of chapter ``short``: ``(short, number, stem, stem without number)``,
    e.g. ``("concepts", "01", "01_key_concepts", "key_concepts")``."""
    stem = Path(CHAPTERS[short]).stem
    number, _, rest = stem.partition("_")
    return short, number, stem, rest


def sources(short: str) -> list[Path]:
    """What every run of a chapter depends on, whatever it imports: its notebook, its ledger file
    (``data/claims/NN_<short>.toml``), its own checks (``labkit/checks/<short>.py``) and the checks'
    machinery. A run adds what it used (:func:`used_sources`)."""
    number = names(short)[1]
    return [NOTEBOOKS / CHAPTERS[short], DATA / "claims" / f"{number}_{short}.toml",
            REPO / "labkit" / "checks" / f"{short}.py", REPO / "labkit" / "checks" / "__init__.py"]


def used_sources() -> list[str]:
    """The files this process used that a chapter's figures depend on, relative to the checkout: every
    labkit module it imported and every ``data/`` file it opened (:data:`labkit.paths.OPENED`)."""
    files = (getattr(m, "__file__", None) for m in list(sys.modules.values()))
    mods = {rel for f in files if isinstance(f, str) and (rel := _labkit_file(f))}
    return sorted(mods | {p for p in OPENED if not p.startswith("data/claims/")})


@functools.cache
def _labkit_file(f: str) -> str | None:
    """``f`` relative to the checkout when it is a labkit module outside ``labkit/report``, else None
    (cached: resolving thousands of module paths at every record was most of a record's cost)."""
    pkg = REPO / "labkit"
    path = Path(f).resolve()
    if path.is_relative_to(pkg) and not path.is_relative_to(pkg / "report"):
        return str(path.relative_to(REPO))
    return None


_HASHES: dict[tuple[str, int, int], bytes] = {}


def _file_hash(path: Path) -> bytes:
    """sha256 of a file's content (a notebook's cells without outputs; a missing file counts as empty),
    cached per path, size and modification time."""
    try:
        st = path.stat()
    except OSError:
        return hashlib.sha256(b"").digest()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        raw = path.read_bytes() if path.is_file() else b""
        if path.suffix == ".ipynb" and raw:  # outputs left out: an executed copy saved in place is the same

            nb = json.loads(raw)
            raw = json.dumps([[c["cell_type"], "".join(c["source"])] for c in nb["cells"]]).encode()
        _HASHES[key] = hashlib.sha256(raw).digest()
    return _HASHES[key]


def digest(short: str, used: list[str] | tuple[str, ...] = ()) -> str:
    """A 16-hex-digit digest of chapter ``short``'s :func:`sources` and the files a run of it ``used``
    (paths relative to the checkout, as :func:`used_sources` gives them). The report compares it with
    the digest a run recorded: any change to a notebook, ledger row, check, imported labkit module or
    data file the run read makes that run stale."""
    h = hashlib.sha256()
    paths = sources(short) + [REPO / u for u in sorted(set(used))]
    for path in dict.fromkeys(paths):
        h.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path.name).encode() + b"\0")
        h.update(_file_hash(path))
    return h.hexdigest()[:16]


def resolve(name: str) -> str:
    """Short name of the chapter called ``name`` in any of its forms (see :func:`names`); case, ``-``
    for ``_`` and a trailing ``.ipynb`` are ignored. ``ValueError`` lists every chapter in three forms."""
    key = name.strip().lower().removesuffix(".ipynb").replace("-", "_")
    chapters = available()
    for short in chapters:
        if key in names(short):
            return short
    if key.isdigit() and len(key) == 1:  # `labkit run 1` means 01
        return resolve(key.zfill(2))
    listing = ", ".join(f"{s} ({n} or {stem})" for s, n, stem, _ in map(names, chapters))
    raise ValueError(f"unknown chapter {name!r}; available: {listing}")


def notebook_path(name: str) -> Path:
    """Notebook file of chapter ``name`` (any form :func:`resolve` accepts); ``ValueError`` listing the
    chapters that exist."""
    return NOTEBOOKS / available()[resolve(name)]


def _recorded_run(short: str) -> str | None:
    """The run id (one per kernel) of chapter ``short``'s recorded results, ``None`` if none."""
    try:
        run = json.loads((results_dir() / f"{short}.json").read_text()).get("run")
    except (OSError, ValueError):
        return None
    return run if isinstance(run, str) else None


def run_chapter(name: str, timeout: int = 1800, out_dir: Path | None = None) -> int:
    """Execute chapter ``name`` top to bottom; print what its last cell printed (the lab's checks, then
    the chapter's claims with their verdicts); 0 if every cell ran, so every check held.

    The executed copy carries the run id its kernel recorded results under (``metadata.labkit.run``),
    so the report pairs a chapter's page with the very run whose figures it shows (a run that wrote
    its results elsewhere, ``$LABKIT_RESULTS``, leaves a copy no report of the default results uses)."""
    short = resolve(name)
    before = _recorded_run(short)
    path = notebook_path(name)
    out_dir = out_dir or REPO / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    nb = nbformat.read(path, as_version=4)
    partial = nbformat.v4.new_code_cell(f"from labkit.figures import keep_partial\n"
                                        f"keep_partial({short!r}, globals())")

    async def keep_what_ran(**_: object) -> None:  # a cell failed: record the figures of the cells above it
        nb.cells.append(partial)
        try:
            await client.async_execute_cell(partial, len(nb.cells) - 1)
        finally:
            nb.cells.remove(partial)

    # the kernel's own log at errors only: it warns at every start that its loopback TCP is unencrypted
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", on_cell_error=keep_what_ran,
                            extra_arguments=["--IPKernelApp.log_level=ERROR"],
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    print(f"running {path.relative_to(REPO)} ...", flush=True)
    status = 0
    try:
        client.execute()
    except CellExecutionError as e:
        status = 1
        print(str(e).strip().splitlines()[-1], file=sys.stderr)
        for o in partial.get("outputs", []):  # what keep_partial recorded before the failed cell
            print(str(o.get("text", "")).strip(), file=sys.stderr)
    finally:
        after = _recorded_run(short)
        if after and after != before:  # this kernel recorded: stamp its run on the copy
            nb.metadata["labkit"] = {"run": after}
        nbformat.write(nb, out)
    last = [c for c in nb.cells if c.cell_type == "code"][-1:]  # verify(): the checks, then the claims
    for cell in last:
        for o in cell.get("outputs", []):
            for line in str(o.get("text", "")).splitlines():
                print(line)
    print(f"executed copy: {out}")
    return status
