"""The chapters: short names used by ``make lab-<name>`` and ``labkit run <name>``.

:func:`run_chapter` executes a notebook headless in a fresh kernel (nbclient), writes the
executed copy to ``build/``, prints every line the notebook's checks printed, and returns
a process exit code (0 when every cell ran, so every check held).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .paths import NOTEBOOKS, REPO

CHAPTERS: dict[str, str] = {
    "setup": "00_setup.ipynb",
    "concepts": "01_key_concepts.ipynb",
    "metrics": "02_metrics.ipynb",
    "internals": "03_llm_internals.ipynb",
    "hardware": "04_gpu_hardware.ipynb",
    "stack": "05_software_stack.ipynb",
    "optimization": "06_optimization.ipynb",
    "beyond": "07_beyond_llms.ipynb",
    "production": "08_production.ipynb",
}


def available() -> dict[str, str]:
    """Short name -> notebook file, for the chapters whose notebook exists."""
    return {k: v for k, v in CHAPTERS.items() if (NOTEBOOKS / v).exists()}


def notebook_path(name: str) -> Path:
    """Notebook file of chapter ``name``; ``ValueError`` listing the chapters that exist."""
    chapters = available()
    if name not in chapters:
        raise ValueError(f"unknown chapter {name!r}; available: {', '.join(chapters)}")
    return NOTEBOOKS / chapters[name]


def run_chapter(name: str, timeout: int = 1800, out_dir: Path | None = None) -> int:
    """Execute chapter ``name`` top to bottom; print its ``CHECK`` lines; 0 if all held."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = notebook_path(name)
    out_dir = out_dir or REPO / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    print(f"running {path.relative_to(REPO)} ...", flush=True)
    status = 0
    try:
        client.execute()
    except CellExecutionError as e:
        status = 1
        print(str(e).strip().splitlines()[-1], file=sys.stderr)
    finally:
        nbformat.write(nb, out)
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            for line in str(o.get("text", "")).splitlines():
                if line.startswith(("CHECK", "✔", "✘")):
                    print(line)
    print(f"executed copy: {out}")
    return status
