"""Where the lab's files are: the checkout that holds ``labkit/``, its ``data/`` and ``notebooks/``
(every chapter reads shipped data through here).

``data/`` ships with the repository, not inside the ``labkit`` package: an editable install
(``make setup``) finds it next to the package. ``$LABKIT_DATA`` points elsewhere (a copy of the
folder, for a non-editable install); :func:`data` says how to get it when it is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("LABKIT_DATA") or REPO / "data")
NOTEBOOKS = REPO / "notebooks"
RESULTS_VAR = "LABKIT_RESULTS"


def results_dir() -> Path:
    """The folder of the chapters' results files (every chapter records there):
    ``$LABKIT_RESULTS``, else ``build/results`` in the checkout."""
    raw = os.environ.get(RESULTS_VAR, "").strip()
    return Path(raw).expanduser() if raw else REPO / "build" / "results"


def data(*parts: str) -> Path:
    """``data/<parts>``; ``FileNotFoundError`` saying how to get the folder when it is missing."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        if not DATA.is_dir():
            raise FileNotFoundError(
                f"the lab's data folder is not at {DATA}: labkit was installed without its repository. "
                "Clone the lab and `pip install -e .` from it (or `make setup`), or set LABKIT_DATA "
                "to a copy of its data/ folder")
        raise FileNotFoundError(f"{path} is missing from the lab's data folder {DATA}")
    return path


# The data files this process opened (paths relative to the checkout): a chapter's results name them,
# so a change to any of them makes its recorded run stale (labkit.chapters.digest). Python's audit
# hook sees every open() through Python (json, numpy, wave, tomllib...); a file a C library opens on
# its own path is not seen.
OPENED: set[str] = set()
_DATA_PREFIX = str(DATA) + os.sep


def used(path: str | Path) -> None:
    """Note that this process read ``path``, when it lies in ``data/``: for a file a C library opens
    itself (safetensors, an audio decoder), which the audit hook below cannot see."""
    full = os.path.abspath(os.fspath(path))
    if full.startswith(_DATA_PREFIX):
        OPENED.add(os.path.relpath(full, REPO))


def _note_open(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], str | Path):
        used(args[0])


sys.addaudithook(_note_open)
