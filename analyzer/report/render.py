"""Turn collected report data into one self-contained HTML page, or a short Markdown note.

Templates live in ``reports/`` (package ``hybridtrace.reports``) with ``_partials``.
Autoescaping is on, so every string that came from a log is shown as text. Chart specs
go into ``<script type="application/json">`` blocks with ``<``, ``>`` and ``&`` written as
JSON escapes, so no value can close the block; Vega, Vega-Lite and vega-embed are inlined
from vl-convert's bundle, so the page needs no network.
"""

from __future__ import annotations

import functools
import json
import os
import re
from importlib import resources
from pathlib import Path

import jinja2

from hybridtrace import __version__
from hybridtrace.analyze.rules import report_kinds
from hybridtrace.kinds import ALL_KINDS
from hybridtrace.report.charts import Chart, build_charts
from hybridtrace.report.data import ReportData
from hybridtrace.units import format_bytes


def _load_template(name: str) -> str | None:
    path = resources.files("hybridtrace.reports").joinpath(*name.split("/"))
    return path.read_text(encoding="utf-8") if path.is_file() else None


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = lambda v: "–" if v is None else format_bytes(v)
    env.filters["num"] = _number
    env.filters["ratio"] = lambda v: "–" if v is None else f"{v:.4f}"
    env.filters["md"] = _markdown_text
    env.filters["mdcode"] = _markdown_code
    return env


def _markdown_code(value) -> str:
    """A value as a Markdown code span: shown exactly, never interpreted."""
    text = " ".join(str(value).split())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def _markdown_text(value) -> str:
    """A value as literal text in Markdown: every ASCII punctuation mark backslash-escaped.

    So no string from a log can become a link, an image, emphasis, a tag or a table cell
    break in a chat message or a pull-request comment.
    """
    text = "–" if value is None else " ".join(str(value).split())
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)


def _number(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def script_json(value) -> str:
    """JSON safe inside a <script> block: nothing in it can end the block or start a tag."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@functools.cache
def vega_bundle() -> str:
    """vega-embed with Vega and Vega-Lite, as one script (from vl-convert, no network).

    vl-convert assembles the bundle on every call (over a second), so it is kept in the
    user's cache folder, keyed by both versions; a cache that cannot be written is skipped.
    """
    import altair as alt
    import vl_convert

    version = "_".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybridtrace"
    cached = cache / f"vega-embed-{vl_convert.__version__}-vl{version}.js"
    try:
        bundle = cached.read_text(encoding="utf-8")
    except OSError:
        bundle = vl_convert.javascript_bundle(vl_version=version)
        try:
            cache.mkdir(parents=True, exist_ok=True)
            staged = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            staged.write_text(bundle, encoding="utf-8")
            staged.replace(cached)
        except OSError:
            pass
    if "</script" in bundle.lower():  # would end the inline block early
        raise RuntimeError("the Vega bundle cannot be inlined: it contains a closing script tag")
    return bundle


_DOC_LINK = re.compile(r'href="(?:\./)?([a-z_]+)\.md"')
_INDEX_LINK = re.compile(r'href="\.\./findings\.md(#[^"]*)?"')


@functools.cache
def kind_docs() -> dict[str, str]:
    """Each finding kind's docs page as HTML, its links turned into links within the page."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    folder = resources.files("hybridtrace.docs").joinpath("findings")
    pages = {}
    for kind in ALL_KINDS:
        page = folder.joinpath(f"{kind}.md")
        if not page.is_file():
            continue
        html = md.render(page.read_text(encoding="utf-8"))
        html = _DOC_LINK.sub(lambda m: f'href="#doc-{m.group(1)}"', html)
        pages[kind] = _INDEX_LINK.sub('href="#docs"', html)
    return pages


def _context(data: ReportData, charts: list[Chart], empty: list[str]) -> dict:
    summary = data.summary
    by_kind = summary["findings_by_kind"]
    return {
        "version": __version__,
        "data": data,
        "summary": summary,
        "inputs": data.inputs,
        "charts": charts,
        "empty_charts": empty,
        "kinds": [k for k in report_kinds(by_kind) if k in by_kind],
        "docs": kind_docs(),
        "script_json": script_json,
    }


def render_html(data: ReportData) -> str:
    charts, empty = build_charts(data)
    context = _context(data, charts, empty)
    context["vega_bundle"] = vega_bundle()
    return _environment().get_template("report.html.j2").render(context)


def render_markdown(data: ReportData) -> str:
    return _environment().get_template("report.md.j2").render(_context(data, [], []))
