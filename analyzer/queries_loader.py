"""Install the SQL modules of ``queries/`` as DuckDB views, in dependency order.

Each ``.sql`` file is one module of ``CREATE VIEW`` statements. Files whose names start
with ``_`` hold private helpers and load first; the rest load in name order.
"""

from __future__ import annotations

from importlib import resources

import duckdb


def sql_modules() -> list[tuple[str, str]]:
    root = resources.files("hybridtrace.queries")
    files = sorted(
        (p for p in root.iterdir() if p.name.endswith(".sql")),
        key=lambda p: (not p.name.startswith("_"), p.name),
    )
    return [(p.name, p.read_text(encoding="utf-8")) for p in files]


def install_views(con: duckdb.DuckDBPyConnection) -> None:
    for name, text in sql_modules():
        try:
            con.execute(text)
        except duckdb.Error as exc:
            raise RuntimeError(f"queries/{name}: {exc}") from exc
