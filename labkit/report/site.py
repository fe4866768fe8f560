"""The executed chapters as web pages that open offline (every chapter, for the lab report).

nbconvert's ``HTMLExporter`` (installed with JupyterLab) renders each executed notebook with its
outputs; matplotlib figures are already PNGs inside the notebook and stay embedded as data URIs.
Its ``lab`` template also adds ``<script src=...>`` tags for require.js, MathJax, Mermaid and the
widget manager, all from CDNs; the template below drops them (the chapters use no LaTeX, Mermaid
or JavaScript outputs), and links one shared ``lab.css`` (JupyterLab's light theme, 260 kB) instead
of inlining it into every page. Progress-bar widgets (tqdm) cannot render without their JavaScript,
so each is replaced by its final text, read from the widget state the notebook saved.

Why nbconvert rather than jupyter-book: it is already installed, renders a notebook as it ran
(no re-execution, no Sphinx project), and works offline; jupyter-book would add a build toolchain
to produce the same pages plus a navigation the report's index already gives.
"""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path
from typing import Any

import nbformat

from .glossary import link_glossary
from .machines import unpath

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block notebook_css %}<link rel="stylesheet" href="lab.css">{% endblock notebook_css %}
{%- block body_header -%}
{{ super() }}
<nav class="labkit-nav"><a href="../index.html">&larr; the lab report: every claim, checked</a></nav>
{%- endblock body_header -%}
"""
EXTRA_CSS = """
/* labkit: page chrome (from nbconvert's lab template, which inlines it) */
a.anchor-link { display: none; }
.jp-InputArea, .jp-InputArea-editor { overflow: hidden; }
.jp-OutputArea-output pre { line-height: inherit; font-family: inherit; }
.jp-RenderedText pre { color: var(--jp-content-font-color1); font-size: var(--jp-code-font-size); }
.jp-Collapser { display: none; }
.labkit-nav { font-family: var(--jp-ui-font-family); padding: 8px 16px; }
"""


def exporter() -> Any:
    """An nbconvert ``HTMLExporter`` on the ``lab`` template with every network reference removed."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"labkit.html.j2": TEMPLATE})],
                        template_file="labkit.html.j2")


def widget_text(state: dict[str, Any], model_id: str) -> str | None:
    """The text a saved widget showed last: an ``HBox`` of tqdm's description, bar and counts becomes
    ``"Loading: 100% ██████████ 272/272 [00:01<00:00]"``. ``None`` for a widget not in ``state``."""
    model = state.get(model_id)
    if model is None:
        return None
    s = model.get("state", {})
    name = model.get("model_name", "")
    if name == "FloatProgressModel" or name == "IntProgressModel":
        done = s.get("value", 0) / (s.get("max") or 1)
        return "█" * round(10 * done) + "·" * (10 - round(10 * done))
    if "children" in s:
        parts = [widget_text(state, c.removeprefix("IPY_MODEL_")) for c in s["children"]]
        return " ".join(p for p in parts if p)
    text = s.get("value", s.get("description", ""))
    return html.unescape(re.sub(r"<[^>]+>", "", str(text))).strip() or None


def offline_notebook(nb: Any) -> Any:
    """A copy of ``nb`` that renders without JavaScript: widget outputs become their final text
    (``text/plain``) and the saved widget state is dropped."""
    nb = copy.deepcopy(nb)
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                text = widget_text(state, data.pop(WIDGET_VIEW).get("model_id", ""))
                if text:
                    data["text/plain"] = text
                elif "text/plain" not in data:
                    data["text/plain"] = "(interactive widget)"
    return nb


def write_css(folder: Path, exp: Any = None) -> Path:
    """``folder/lab.css``: JupyterLab's light theme as nbconvert ships it, plus the page chrome."""
    exp = exp or exporter()
    parts = []
    for name in ("index.css", "theme-light.css"):
        found = next((Path(d) / "static" / name for d in exp.template_paths
                      if (Path(d) / "static" / name).is_file()), None)
        if found is None:
            raise FileNotFoundError(f"nbconvert's lab template has no static/{name}; reinstall nbconvert")
        parts.append(found.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lab.css"
    path.write_text("\n".join(parts) + EXTRA_CSS)
    return path


DIGEST = re.compile(r'<meta name="labkit-digest" content="([0-9a-f]*)">')


def page_digest(page: str) -> str | None:
    """The chapter digest a page was rendered with (:func:`render_notebook`), or ``None``."""
    m = DIGEST.search(page)
    return m[1] if m else None


def render_notebook(src: Path, dest: Path, title: str, exp: Any = None, digest: str = "") -> int:
    """Render the executed notebook ``src`` to ``dest`` (HTML, opens offline; ``lab.css`` must sit
    next to it, see :func:`write_css`), stamped with the chapter's ``digest`` (the staleness test
    compares it with the tree's) and with the machine's absolute paths taken out
    (:func:`labkit.report.machines.unpath`); its links to ``glossary.md`` lead to the report's
    ``../glossary.html`` (:func:`labkit.report.glossary.link_glossary`). Returns the page's size in bytes."""
    exp = exp or exporter()
    nb = offline_notebook(nbformat.read(src, as_version=4))
    body, _ = exp.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = body.replace("<head>", f'<head>\n<meta name="labkit-digest" content="{digest}">', 1)
    body = link_glossary(unpath(body))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(body)
    return len(body.encode())


RESOURCE = re.compile(r"""<(?:script|link|img|iframe|source|video|audio|embed|object)\b[^>]*?"""
                      r"""\b(?:src|href|data)\s*=\s*["']?((?:https?:)?//[^"'\s>]+)""", re.IGNORECASE)
CSS_URL = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])((?:https?:)?//[^"')\s]+)""", re.IGNORECASE)


def network_refs(page: str) -> list[str]:
    """What opening ``page`` (HTML or CSS) would fetch from the network: scripts, stylesheets, images,
    frames and CSS ``url()``/``@import`` with an http(s) or protocol-relative address. Links a reader
    may click (``<a href>``) are not fetched and not listed."""
    return RESOURCE.findall(page) + CSS_URL.findall(page)


def notebook_status(nb: Any) -> dict[str, Any]:
    """``{"ok": bool, "error": str}`` of an executed notebook: the first error output's last line."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return {"ok": False, "error": f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"[:300]}
    return {"ok": True, "error": ""}
