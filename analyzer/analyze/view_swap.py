"""Views redefined for a while, then put back as they were, without binding them again.

The analysis points views at other relations for the length of a step (a snapshot, the
scope's cut tables, the merged state). DuckDB binds a view when it is created, so putting
an original back by creating it again binds it again: for a view over ten finding views
that costs more than the step itself. So the original is never touched. DuckDB resolves a
name when a query runs, looking in the connection's temporary schema first: a temporary
view (or table) of the same name *shadows* the store's view for every query and every view
that reads the name, and dropping it brings the original back. Two statements a swap; the
analysis makes dozens of swaps, and each statement costs DuckDB about half a millisecond
however small.

A name that is temporary already (an enclosing swap, or a view the analysis made
temporary) cannot be shadowed again: that one is moved aside under a name of its own for
the duration and renamed back afterwards, its text and binding untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count

import duckdb

__all__ = ["catalog_objects", "swapped_views", "view_sql", "view_sqls"]

# Names the temporary originals are kept under, unique across nested swaps of one name.
_ASIDE = count(1)


def view_sql(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
    """The text of view ``name`` as a query sees it (a temporary one before the store's), None
    when there is none."""
    found = con.execute(
        "SELECT sql FROM duckdb_views() WHERE view_name = ? AND NOT internal ORDER BY temporary DESC",
        [name],
    ).fetchall()
    return found[0][0] if found else None


def view_sqls(con: duckdb.DuckDBPyConnection, names: list[str]) -> dict[str, str]:
    """The text of each of ``names`` that is a view, as a query sees it (one look-up for all)."""
    found = con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE list_contains(?, view_name) AND NOT internal "
        "ORDER BY temporary",  # a temporary view shadows the store's: it comes last, and stays
        [names],
    ).fetchall()
    return dict(found)


def catalog_objects(con: duckdb.DuckDBPyConnection, names: list[str]) -> tuple[set[str], dict[str, str]]:
    """Which of ``names`` are views (the store's or temporary ones), and for those that are
    temporary objects now, their kind ('VIEW' or 'TABLE'), in one look-up: a name that is not
    temporary can be shadowed with one statement."""
    found = con.execute(
        "SELECT view_name, temporary, 'VIEW' FROM duckdb_views() "
        "WHERE NOT internal AND list_contains(?, view_name) "
        "UNION ALL SELECT table_name, true, 'TABLE' FROM duckdb_tables() "
        "WHERE temporary AND list_contains(?, table_name)",
        [names, names],
    ).fetchall()
    views = {name for name, _, kind in found if kind == "VIEW"}
    return views, {name: kind for name, temporary, kind in found if temporary}


@contextmanager
def swapped_views(con: duckdb.DuckDBPyConnection, replacements: dict[str, str]) -> Iterator[None]:
    """Each view of ``replacements`` defined as its SQL for the duration, then as it was (a
    name that was no view is gone again). A temporary table of the name is moved aside as a
    temporary view is.

    The create does the looking (it fails when a temporary object has the name already): the
    catalog is not listed first, which would cost as much as the swap.
    """
    undo: list[str] = []
    try:
        for name, sql in replacements.items():
            try:
                con.execute(f"CREATE TEMP VIEW {name} AS {sql}")
                undo.append(f"DROP VIEW temp.main.{name}")
                continue
            except duckdb.CatalogException:
                kind = catalog_objects(con, [name])[1].get(name)
                if kind is None:
                    raise
            kept = f"_aside_{next(_ASIDE)}_{name}"
            con.execute(f"ALTER {kind} temp.main.{name} RENAME TO {kept}")
            undo.append(f"ALTER {kind} temp.main.{kept} RENAME TO {name}")
            con.execute(f"CREATE TEMP VIEW {name} AS {sql}")
            undo.append(f"DROP VIEW temp.main.{name}")
        yield
    finally:
        for statement in reversed(undo):
            con.execute(statement)
