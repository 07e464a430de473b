"""Views redefined for a while, then put back as they were, without binding them again.

The analysis points views at other relations for the length of a step (a snapshot, the
scope's cut tables, the merged state). DuckDB binds a view when it is created, so putting
an original back by creating it again binds it again: for a view over ten finding views
that costs more than the step itself. Renaming costs nothing: the original is moved aside
under a name of its own, the replacement takes its name, and afterwards the replacement is
dropped and the original renamed back, its text and binding untouched. A view that reads
the swapped name reads whichever holds the name when it runs (DuckDB resolves names at query
time), which is what a replacement is for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count

import duckdb

__all__ = ["swapped_views", "view_sql", "view_sqls"]

# Names the originals are kept under, unique across nested swaps of one name.
_ASIDE = count(1)


def view_sql(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
    """The text of view ``name`` (not DuckDB's own), None when there is none."""
    found = con.execute(
        "SELECT sql FROM duckdb_views() WHERE view_name = ? AND NOT internal", [name]
    ).fetchall()
    return found[0][0] if found else None


def view_sqls(con: duckdb.DuckDBPyConnection, names: list[str]) -> dict[str, str]:
    """The text of each of ``names`` that is a view (one look-up for all of them)."""
    found = con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE list_contains(?, view_name) AND NOT internal",
        [names],
    ).fetchall()
    return dict(found)


@contextmanager
def swapped_views(con: duckdb.DuckDBPyConnection, replacements: dict[str, str]) -> Iterator[None]:
    """Each view of ``replacements`` defined as its SQL for the duration, then as it was (a
    name that was no view is dropped again).

    ``IF EXISTS`` does the looking: the catalog is not listed first (a listing of every view
    costs a millisecond or two, and a small incremental analysis swaps views dozens of times).
    """
    aside: list[tuple[str, str]] = []
    try:
        for name, sql in replacements.items():
            kept = f"_aside_{next(_ASIDE)}_{name}"
            con.execute(f"ALTER VIEW IF EXISTS {name} RENAME TO {kept}")
            aside.append((name, kept))
            con.execute(f"CREATE VIEW {name} AS {sql}")
        yield
    finally:
        for name, kept in reversed(aside):
            con.execute(f"DROP VIEW IF EXISTS {name}")
            con.execute(f"ALTER VIEW IF EXISTS {kept} RENAME TO {name}")
