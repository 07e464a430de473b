"""Asking questions of a test's local store: one connection per state of the store's files.

``Store.connect()`` creates every view afresh, which costs a few hundred milliseconds, and
a test that asks five questions of a store it has finished writing would pay that five
times. ``rows`` keeps the connection it made for the store's current files: a file added,
removed or rewritten anywhere under the store (a commit, a recovery, a compaction, a hand
edit) makes the next call connect again, so every answer is the one a new connection
gives. The connection never leaves this module, so no caller can change what the next one
sees (a threshold installed on it, a table created); give ``rows`` queries only.

A query that names nothing ``queries/`` defines (most tests ask of the tables themselves)
runs on a connection made without installing those views, which is most of a connection's
cost; the tables' own views are the same on both.
"""

from __future__ import annotations

import os
import re
from functools import cache
from importlib import resources
from pathlib import Path

import duckdb

from hybridtrace.store import Store

# Each test writes its own stores; the last few are plenty, and older ones are closed.
_KEPT = 6
_open: dict[tuple[Path, bool], tuple[tuple, duckdb.DuckDBPyConnection]] = {}


def _state(root: Path) -> tuple:
    """Every file under ``root`` with its size, change time and inode: equal tuples, equal stores."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                info = os.stat(path)
            except FileNotFoundError:  # deleted while we looked: the next look tells
                continue
            found.append((path, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino))
    return tuple(sorted(found))


@cache
def _query_names() -> frozenset[str]:
    """Every name the SQL library creates on a full connection (views, macros, tables)."""
    create = re.compile(
        r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\w*\s+)?(?:VIEW|MACRO|TABLE|FUNCTION)\s+"
        r"(?:IF\s+NOT\s+EXISTS\s+)?([A-Za-z_]\w*)",
        re.IGNORECASE,
    )
    names = {"_thresholds"}  # installed beside the views
    for path in resources.files("hybridtrace.queries").iterdir():
        if path.name.endswith(".sql"):
            names.update(m.lower() for m in create.findall(path.read_text(encoding="utf-8")))
    return frozenset(names)


def _connection(store: str | Path, *, with_queries: bool) -> duckdb.DuckDBPyConnection:
    root = Path(store).resolve()
    state = _state(root)
    key = (root, with_queries)
    kept = _open.get(key)
    if kept is not None and kept[0] == state:
        return kept[1]
    con = Store(root).connect(with_queries=with_queries)
    if kept is not None:
        kept[1].close()
    _open.pop(key, None)
    _open[key] = (_state(root), con)  # after connect: whatever it touched is part of the state
    while len(_open) > _KEPT:
        _open.pop(next(iter(_open)))[1].close()
    return con


def rows(store: str | Path, sql: str) -> list[tuple]:
    """The rows ``sql`` gives on a new connection to ``store`` (a bucket's is always new)."""
    if "://" in str(store):  # a bucket prefix: no files here to tell its state by
        return Store(str(store)).connect().sql(sql).fetchall()
    words = {w.lower() for w in re.findall(r"[A-Za-z_]\w*", sql)}
    if not words & _query_names():
        try:
            return _connection(store, with_queries=False).sql(sql).fetchall()
        except duckdb.CatalogException:  # a name the tables do not have: the full connection tells
            pass
    return _connection(store, with_queries=True).sql(sql).fetchall()
