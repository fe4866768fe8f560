"""The glossary as a page of the offline report (every chapter): ``notebooks/glossary.md`` becomes
``glossary.html`` beside the report's ``index.html``.

Each chapter's opening links to ``glossary.md`` (it opens beside the notebooks in JupyterLab and on a
forge); on the report's chapter pages :func:`link_glossary` points that link at ``../glossary.html``.
The markdown is rendered with ``mistune``, which nbconvert already depends on, and every ``###`` term
gets the anchor a forge would give it (:func:`anchor`), so ``glossary.md#ttft`` and
``glossary.html#ttft`` name the same entry. The page reuses the chapter pages' ``lab.css``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import mistune

from ..paths import NOTEBOOKS

GLOSSARY = NOTEBOOKS / "glossary.md"
TERM = re.compile(r"^###\s+(.+?)\s*$", re.MULTILINE)
LINK = re.compile(r'href="glossary\.md(#[^"]*)?"')
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Glossary · the lab report</title>
<link rel="stylesheet" href="{css}">
</head>
<body class="jp-Notebook" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<nav class="labkit-nav"><a href="index.html">&larr; the lab report: every claim, checked</a></nav>
<main class="jp-RenderedHTMLCommon jp-RenderedMarkdown" style="max-width: 60em; padding: 0 16px 32px;">
{body}</main>
</body>
</html>
"""


def anchor(term: str) -> str:
    """The id of a heading, as a forge makes it: lower case, punctuation dropped, spaces as hyphens
    (``"Ops:byte ratio"`` -> ``"opsbyte-ratio"``). HTML tags and entities in ``term`` are ignored."""
    text = html.unescape(re.sub(r"<[^>]+>", "", term)).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def terms(text: str) -> list[str]:
    """The terms of a glossary: the text of every ``### `` heading of the markdown ``text``."""
    return TERM.findall(text)


def link_glossary(page: str) -> str:
    """A chapter page with its links to ``glossary.md`` (and its anchors) pointed at the report's
    ``../glossary.html``."""
    return LINK.sub(lambda m: f'href="../glossary.html{m[1] or ""}"', page)


def to_html(text: str) -> str:
    """The markdown ``text`` as an HTML fragment, each heading with its :func:`anchor` as id."""
    class Renderer(mistune.HTMLRenderer):
        def heading(self, text: str, level: int, **attrs: Any) -> str:
            return f'<h{level} id="{anchor(text)}">{text}</h{level}>\n'

    return str(mistune.create_markdown(renderer=Renderer(escape=True))(text))


def render_glossary(dest: Path, src: Path = GLOSSARY, css: str = "chapters/lab.css") -> int:
    """Render the glossary ``src`` to ``dest`` (HTML, opens offline; ``css`` is the chapter pages'
    stylesheet, relative to ``dest``). Returns the page's size in bytes."""
    page = PAGE.format(css=css, body=to_html(src.read_text()))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(page)
    return len(page.encode())
