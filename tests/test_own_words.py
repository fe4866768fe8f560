"""The lab's words are its own (every chapter): no ledger row and no notebook cell shares a run of
twelve or more consecutive words with the tutorial it mirrors. Facts and figures carry over; sentences
and code do not. Needs the tutorial at ``../shared/tutorial.txt`` (skipped with a message elsewhere)."""

import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT.parent / "shared" / "tutorial.txt"
RUN = 12


def words(text: str) -> list[str]:
    """Lower-case words and numbers; punctuation, quotes and code symbols are ignored."""
    return re.findall(r"[a-z0-9_]+", text.lower().replace("’", "'").replace("'", ""))


def runs(text: str, n: int = RUN) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def shared(text: str, source: set[tuple[str, ...]], n: int = RUN) -> str | None:
    """The first run of ``n`` words ``text`` shares with ``source`` (joined), or ``None``."""
    w = words(text)
    for i in range(len(w) - n + 1):
        if tuple(w[i:i + n]) in source:
            return " ".join(w[i:i + n])
    return None


def test_shared_finds_a_copied_sentence_and_ignores_a_paraphrase():
    src = runs("The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat today.")
    assert shared("As they say, the quick brown fox jumps over the lazy dog while the cat sleeps.", src)
    assert shared("A fast brown fox leaps over a lazy dog while a cat naps on a mat.", src) is None


def _texts():
    for path in sorted((ROOT / "data" / "claims").glob("*.toml")):
        for row in tomllib.loads(path.read_text()).get("claim", []):
            for field in ("claim", "tutorial", "measure", "reason"):
                yield f"{path.name} {row.get('id')} {field}", str(row.get(field, ""))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            yield f"{nb.name} cell {i}", "".join(cell["source"])


@pytest.mark.skipif(not TUTORIAL.is_file(), reason=f"no tutorial at {TUTORIAL}")
def test_no_ledger_row_or_notebook_cell_copies_the_tutorial():
    source = runs(TUTORIAL.read_text())
    copied = [f"{where}: '{hit}'" for where, text in _texts() if (hit := shared(text, source))]
    assert not copied, (f"{len(copied)} texts share {RUN}+ words with the tutorial; say it in the lab's own "
                        "words:\n" + "\n".join(copied))
