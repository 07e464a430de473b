"""``hybridtrace report``: the store's analysis as one self-contained HTML page or a Markdown note.

Data moves one way: ``data`` reads views and findings, ``charts`` draws them with Altair,
``render`` fills the Jinja templates of ``reports/``. Nothing here makes a byte count or
a finding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hybridtrace.errors import UsageError
from hybridtrace.report.data import ReportData, collect
from hybridtrace.report.render import render_html, render_markdown

__all__ = ["ReportData", "collect", "render_html", "render_markdown", "write_report"]


def write_report(
    store: str | Path,
    out: str | Path,
    *,
    fmt: str = "html",
    config: str | None = None,
    scope: Callable | None = None,
) -> tuple[Path, ReportData]:
    """Analyse the store at ``store`` and write the report to ``out``; returns its path and data."""
    from hybridtrace.store.analysis import open_analysis
    from hybridtrace.store.publish import publish_text

    con = open_analysis(store, config=config)
    path = Path(out)
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; --out names the report file")
    data = collect(con, store=str(store), config=config, scope=scope)
    text = render_html(data) if fmt == "html" else render_markdown(data)
    publish_text(text, path)  # a reader never sees half a report
    return path, data
