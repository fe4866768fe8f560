"""The glossary (every chapter): every acronym the chapters' prose uses has an entry in
``notebooks/glossary.md``, every chapter's opening links to it, and the report renders it with an anchor
for each term. Reads the notebooks as JSON only: nothing runs."""

import json
import re
from pathlib import Path

from labkit.chapters import CHAPTERS
from labkit.paths import NOTEBOOKS
from labkit.report.glossary import GLOSSARY, anchor, link_glossary, render_glossary, terms

CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)  # code is not prose
LINK = re.compile(r"\]\([^)\s]*\)|<?https?://[^\s)>]+>?")  # nor are link targets and addresses
WORD = re.compile(r"\b[A-Z][A-Za-z0-9]*\b")
# Capitalized words that are names, not terms: product, model and company names, a file name.
NOT_TERMS = {
    "A22B", "L6", "T2V", "V3", "Wan2", "XL",  # pieces of model names (Qwen3-235B-A22B, all-MiniLM-L6-v2)
    "B200", "H100", "L4", "M4", "RTX",  # chips and cards the catalog names
    "NVIDIA", "README", "US",  # a company, a file, "US English"
}


def acronyms(markdown: str) -> set[str]:
    """The acronyms of a markdown text outside code and links: words that start with a capital and
    hold two or more capitals or digits, without a run of three lower-case letters (``KV``, ``P99``,
    ``LoRA``, ``FLOPs``, not ``Qwen3``); a plural ``s`` after capitals is dropped (``GPUs`` -> ``GPU``)."""
    found = set()
    for word in WORD.findall(LINK.sub(" ", CODE.sub(" ", markdown))):
        if sum(c.isupper() or c.isdigit() for c in word) < 2 or re.search(r"[a-z]{3}", word):
            continue
        if word.endswith("s") and re.fullmatch(r"[A-Z0-9]{2,}", word[:-1]):
            word = word[:-1]
        found.add(word)
    return found


def missing(markdown: str, glossary: str) -> set[str]:
    """The acronyms of ``markdown`` that ``glossary`` has no ``### `` entry for (names allowed)."""
    return acronyms(markdown) - set(terms(glossary)) - NOT_TERMS


def markdown_cells(notebook: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
            if c["cell_type"] == "markdown"]


def test_every_acronym_of_the_chapters_has_a_glossary_entry():
    glossary = GLOSSARY.read_text()
    gaps = {name: sorted(m) for name in CHAPTERS.values() if (NOTEBOOKS / name).exists()
            and (m := missing("\n".join(markdown_cells(NOTEBOOKS / name)), glossary))}
    assert not gaps, f"add these to notebooks/glossary.md (or to NOT_TERMS if a name): {gaps}"


def test_the_check_reports_an_unknown_acronym():
    glossary = GLOSSARY.read_text()
    text = "The ZQXW rate beside TTFT and KV, `NOPE()` in code, [a link](https://x.y/ABCD), on an H100."
    assert acronyms(text) == {"ZQXW", "TTFT", "KV", "H100"}
    assert missing(text, glossary) == {"ZQXW"}
    assert missing("More GPUs and LLMs, FLOPs, LoRA; Qwen3 is a name.", glossary) == set()


def test_the_glossary_is_alphabetical_and_each_entry_says_where_it_is_first_used():
    text = GLOSSARY.read_text()
    for section in text.split("\n## ")[1:]:
        names = terms(section)
        assert names == sorted(names, key=str.lower), section.splitlines()[0]
    entries = text.split("\n### ")[1:]
    assert len(entries) == len(terms(text)) >= 100
    used = re.compile(r"^First used: chapter \d\d[a-z]? \(.+\)\.$", re.MULTILINE)
    bad = [e.splitlines()[0] for e in entries if not used.search(e)]
    assert not bad, f"entries without a 'First used: chapter NN (section).' line: {bad}"
    assert len({anchor(t) for t in terms(text)}) == len(terms(text)), "two terms share an anchor"


def test_every_chapter_opening_links_to_the_glossary():
    unlinked = [name for name in CHAPTERS.values() if (NOTEBOOKS / name).exists()
                and "](glossary.md)" not in markdown_cells(NOTEBOOKS / name)[0]]
    assert not unlinked, f"the first markdown cell of these does not link to glossary.md: {unlinked}"


def test_the_glossary_renders_with_an_anchor_per_term_and_chapter_links_lead_to_it(tmp_path):
    page = tmp_path / "glossary.html"
    assert render_glossary(page) == len(page.read_bytes())
    html = page.read_text()
    names = terms(GLOSSARY.read_text())
    absent = [t for t in names if f'id="{anchor(t)}"' not in html]
    assert not absent, f"no element with the anchor of: {absent}"
    assert anchor("Ops:byte ratio") == "opsbyte-ratio" and anchor("Top-k and top-p") == "top-k-and-top-p"
    assert 'href="chapters/lab.css"' in html and "<script" not in html
    chapter = '<a href="glossary.md">glossary</a> <a href="glossary.md#ttft">TTFT</a> <a href="x.md">x</a>'
    assert link_glossary(chapter) == ('<a href="../glossary.html">glossary</a> '
                                      '<a href="../glossary.html#ttft">TTFT</a> <a href="x.md">x</a>')
