"""Install the SQL modules of ``queries/`` as DuckDB views.

Each ``.sql`` file is one module of ``CREATE VIEW`` statements. Files whose names start
with ``_`` hold private helpers and load first; the rest load in name order, and a
statement that refers to a view of a later module is retried once that one is in, so
modules need not be named for their dependencies.
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
    # Statement by statement: one that refers to a view not created yet waits for the next
    # round, and nothing already created is created again (each creation binds the view).
    pending = [(name, sql) for name, text in sql_modules() for sql in con.extract_statements(text)]
    while pending:
        failed: list[tuple[str, duckdb.Statement, duckdb.Error]] = []
        for name, statement in pending:
            try:
                con.execute(statement)
            except duckdb.CatalogException as exc:  # refers to a view of a module not loaded yet
                failed.append((name, statement, exc))
        if len(failed) == len(pending):
            name, _, exc = failed[0]
            raise RuntimeError(f"queries/{name}: {exc}") from exc
        pending = [(name, statement) for name, statement, _ in failed]
