"""Each analysis connection's own DuckDB database, started from a catalog bound before.

Creating the views and macros of ``queries/`` binds each view, and a view is bound with
every view it reads: some ninety statements that take most of a second, paid by every
process that opens a store for analysis (``query``, ``analyze``, the scheduled job). A
database file keeps its views as they were bound. So the first analysis connection of a
version of hybridtrace and DuckDB saves its catalog as a *template*, and each later one
copies the template (under a megabyte) into a file of its own and opens that: its store's
raw views, engine models and thresholds are created in it as before, and the views of
``queries/`` are there already.

The template's views were bound over another store's raw views. They hold for this store
when its base objects (everything the connection makes before the views of ``queries/``)
have the same names, columns and types; the template records them (``_catalog_base``) and
the connection compares. Where they differ (a store an older version wrote, say), the
views are made again over them, as a connection without a template makes them.

The files live in a directory of the user's own (mode 0700, under /dev/shm where there is
one): a connection's file is removed when the connection is collected or the process
exits, files of processes that are gone are removed by the next one, and a template no
connection used for a week goes when another is saved. Where there is no such
directory, connections are in memory, as before.

A folder of it (``derived/``) keeps what opening a store computes from its data (the link
fits, ``derived_table``), one file per state of the data: a connection on files an earlier
one read reads the result back instead of computing it again. A scheduled job on a growing
store leaves one such file per kind and run; the ``KEPT_PER_KIND`` of each kind used last
stay, and no connection lists them (only a write of one does).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import itertools
import os
import re
import shutil
import stat
import tempfile
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

BASE_TABLE = "_catalog_base"
# every object a connection holds, with its columns: views and tables, main and temp
_OBJECTS = f"""
SELECT table_name AS name, column_index, column_name, data_type
FROM duckdb_columns() WHERE NOT internal AND table_name <> '{BASE_TABLE}'
"""
_SEQUENCE = itertools.count()
_OPEN: dict[str, Path] = {}  # files of this process' connections, removed at exit


def _directory() -> Path | None:
    """The user's own directory for these files, made if need be; None when none can be had."""
    if not hasattr(os, "getuid"):
        return None  # no user ids to own a directory by: connections stay in memory
    shared = Path("/dev/shm")
    parent = shared if shared.is_dir() and os.access(shared, os.W_OK) else Path(tempfile.gettempdir())
    where = parent / f"hybridtrace-catalog-{os.getuid()}"
    try:
        where.mkdir(mode=0o700, exist_ok=True)
        info = where.lstat()
    except OSError:
        return None
    # another user's directory, or one others can write to, could hold a catalog of theirs
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return where


def _derived_directory() -> Path | None:
    """The folder of the derived tables, in the user's directory (None: none can be had)."""
    where = _directory()
    if where is None:
        return None
    folder = where / "derived"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return folder


@functools.cache
def _key() -> str:
    """What the template's views depend on: DuckDB's version, the SQL of ``queries/`` and the
    tables' schemas (the base objects the views are bound over come from them: a template of
    other schemas would not hold, and every connection would make its views again)."""
    import duckdb

    from hybridtrace import __version__
    from hybridtrace.queries_loader import sql_modules
    from hybridtrace.schema import TABLES, table_schema

    digest = hashlib.sha256(f"{duckdb.__version__}|{__version__}".encode())
    for module in sql_modules():
        digest.update(f"\0{module.name}\0{module.text}".encode())
    for name in TABLES:
        digest.update(f"\0{name}\0{table_schema(name).arrow_schema()}".encode())
    return digest.hexdigest()[:24]


def code_key() -> str:
    """Digest of the code an analysis runs: DuckDB's and hybridtrace's versions, the SQL of ``queries/``."""
    return _key()


def _remove(path: Path) -> None:
    _OPEN.pop(str(path), None)
    for leftover in (path, Path(f"{path}.wal")):
        with contextlib.suppress(OSError):
            leftover.unlink()


@atexit.register
def _remove_all() -> None:
    for path in list(_OPEN.values()):
        _remove(path)


# Files kept per kind (templates, each kind of derived table): the most recently used. A
# scheduled job every five minutes on a growing store writes one link fit a run; a connection
# looks up only the one of its data.
KEPT_PER_KIND = 64
# Where derived tables were kept before they had a folder of their own: removed on sight.
_FLAT_DERIVED = re.compile(r"(linkfits|repeats)-[0-9a-f]{32}\.arrow")


def _gone(name: str) -> bool:
    """Whether ``name`` is a connection file or a file half written (``<kind>-<pid>-...``) of
    a process of this user's that no longer runs."""
    parts = name.split("-")
    if parts[0] not in ("conn", "partial") or len(parts) < 2 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # running, as another user: not ours to judge
    return False


def _sweep(where: Path) -> None:
    """Remove the connection files (and templates half written) of processes no longer running,
    and derived tables an older hybridtrace kept beside them (see ``KEPT_PER_KIND``)."""
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            if _gone(entry.name) or _FLAT_DERIVED.fullmatch(entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _prune(kept: Path, kind: str) -> None:
    """Keep the ``KEPT_PER_KIND`` files of ``kind`` in ``kept``'s folder used last (``kept``
    among them: templates of other versions, derived tables of other data), and none unused
    for a week; remove the files half written by processes that are gone."""
    import time

    used: list[tuple[float, str]] = []
    with contextlib.suppress(OSError), os.scandir(kept.parent) as entries:
        for entry in entries:
            if _gone(entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            elif entry.name.startswith(f"{kind}-") and entry.path != str(kept):
                with contextlib.suppress(OSError):
                    used.append((entry.stat().st_mtime, entry.path))
    used.sort(reverse=True)
    week_ago = time.time() - 7 * 86400
    for rank, (mtime, path) in enumerate(used, start=1):
        if rank >= KEPT_PER_KIND or mtime < week_ago:
            with contextlib.suppress(OSError):
                os.unlink(path)


class CatalogConnection:
    """A connection on a file of its own, and what its template says (``from_template``)."""

    def __init__(self, *, in_memory: bool = False) -> None:
        """``in_memory``: no file, no template (as where there is no directory to keep them)."""
        import duckdb

        self.template: Path | None = None
        self.path: Path | None = None
        self.from_template = False
        self.base: list[tuple] = []  # the template's base objects, as _OBJECTS lists them
        where = None if in_memory else _directory()
        if where is None:
            self.con = duckdb.connect(":memory:")
            return
        _sweep(where)
        self.template = where / f"catalog-{_key()}.duckdb"
        self.path = where / f"conn-{os.getpid()}-{next(_SEQUENCE)}-{uuid.uuid4().hex[:8]}.duckdb"
        if self.template.exists():
            try:
                shutil.copyfile(self.template, self.path)
                os.utime(self.template)  # in use: see _prune
                self.con = self._open()
                self.base = self.con.execute(f"SELECT * FROM {BASE_TABLE} ORDER BY ALL").fetchall()
                self.from_template = True
                return
            except (OSError, duckdb.Error):
                # a template cut short (a full disk) or of another make: start without it
                with contextlib.suppress(OSError):
                    self.template.unlink()
                _remove(self.path)
        self.con = self._open()

    def _open(self) -> duckdb.DuckDBPyConnection:
        import duckdb

        assert self.path is not None
        con = duckdb.connect(str(self.path))
        _OPEN[str(self.path)] = self.path
        weakref.finalize(con, _remove, self.path)
        return con

    def _stored(self) -> dict[str, str]:
        """Each view and table the database file holds (not the temporary ones): its kind."""
        return dict(self.con.execute(
            "SELECT view_name, 'VIEW' FROM duckdb_views() WHERE NOT internal AND NOT temporary "
            "UNION ALL SELECT table_name, 'TABLE' FROM duckdb_tables() WHERE NOT temporary"
        ).fetchall())  # fmt: skip

    def clear_base(self) -> None:
        """Drop the template's base objects, for the store's own to be made in their place."""
        stored = self._stored()
        for name in sorted({row[0] for row in self.base} & set(stored)):
            self.con.execute(f'DROP {stored[name]} "{name}"')
        self.con.execute(f"DROP TABLE {BASE_TABLE}")

    def views_hold(self, query_names: set[str]) -> bool:
        """Whether the template's views hold here: the base objects made since are the ones
        they were bound over, column for column and type for type."""
        return [row for row in base_objects(self.con) if row[0] not in query_names] == self.base

    def query_names(self) -> set[str]:
        """The names of the template's views and tables that are not base objects."""
        return set(self._stored()) - {row[0] for row in self.base} - {BASE_TABLE}

    def save_template(self, base: list[tuple]) -> None:
        """Save this connection's catalog as the template, with ``base`` as its base objects.

        Written to a file of its own first and renamed into place, so a reader finds the
        old template or the new one whole. A failure leaves no template: nothing is lost.
        """
        if self.template is None or self.path is None:
            return
        import duckdb

        partial = self.template.with_name(f"partial-{os.getpid()}-{uuid.uuid4().hex[:8]}.duckdb")
        try:
            self.con.execute(
                f"CREATE TABLE {BASE_TABLE} (name VARCHAR, column_index INTEGER, column_name VARCHAR, "
                "data_type VARCHAR)"
            )
            self.con.executemany(f"INSERT INTO {BASE_TABLE} VALUES (?, ?, ?, ?)", base)
            self.con.execute("CHECKPOINT")
            shutil.copyfile(self.path, partial)
            os.replace(partial, self.template)
            _prune(self.template, "catalog")
        except (OSError, duckdb.Error):
            with contextlib.suppress(OSError):
                partial.unlink()
        finally:
            self.con.execute(f"DROP TABLE IF EXISTS {BASE_TABLE}")


# What opening a store computes from its data beyond the catalog (the link fits), kept per
# state of the data: the SQL of every view of the connection names every file it reads, and
# a store's files are written once under names of their own, so the same SQL reads the same
# rows and gives the same result. A store with a batch more, or compacted, has other SQL.
_ARROW_SOURCE = re.compile(r"__duckdb_source_\w+")


def _derived_path(
    kind: str, con: duckdb.DuckDBPyConnection, code: str, *, of_views: bool = True
) -> Path | None:
    where = _derived_directory()
    if where is None:
        return None
    if not of_views:  # ``code`` names every file the result reads
        digest = hashlib.sha256(f"{_key()}\0{code}".encode()).hexdigest()[:32]
        return where / f"{kind}-{digest}.arrow"
    # The analysis' own state is left out: nothing computed at open reads it. The manifest
    # (`sources`) counts by its rows, not its files: what is made of it at open (which engine
    # an instance folder is) reads its rows, and the batch each analysis commits its state in
    # adds a file of no rows. Either would otherwise make the next connection compute again.
    from hybridtrace.schema import TABLES, table_schema

    # the raw views of the incremental analysis' state tables (analyze/incremental.py)
    state = [table_schema(t).view for t in TABLES if t.startswith("analysis_")]
    views = con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND NOT list_contains(?, view_name) "
        "ORDER BY view_name",
        [[*state, "sources"]],
    ).fetchall()
    # The rows as a multiset: their count, and the sum and the exclusive or of each row's
    # 64-bit hash. The text of every row sorted and hashed cost 0.4 s of each open of a store
    # of a week's reads (40,000 rows), this 30 ms (DuckDB's hash is fixed for its version,
    # which _key holds).
    manifest = con.execute(
        "SELECT count(*) || ' ' || coalesce(sum(CAST(hash(s) AS HUGEINT)), 0) || ' ' "
        "|| coalesce(bit_xor(hash(s)), 0) FROM sources s"
    ).fetchall()[0][0]
    digest = hashlib.sha256(f"{_key()}\0{code}\0{manifest}".encode())
    for name, sql in views:
        # a view over an Arrow table the connection made (the engine models, from the store's
        # files and this code) names it by a number of the connection's own
        digest.update(f"\0{name}\0{_ARROW_SOURCE.sub('__duckdb_source', sql)}".encode())
    return where / f"{kind}-{digest.hexdigest()[:32]}.arrow"


def derived_table(
    kind: str,
    con: duckdb.DuckDBPyConnection,
    code: str,
    compute: Callable[[], pa.Table],
    *,
    of_views: bool = True,
) -> pa.Table:
    """``compute()``'s table for the data behind ``con``, kept from an earlier connection
    that read the same files with the same ``code`` (the text of what computes it) when
    there is one; else computed and kept for the next. A kept table that cannot be read is
    computed again. Without ``of_views`` the files are not read off ``con``'s views and
    manifest: ``code`` names every one the result depends on."""
    import pyarrow as pa

    path = _derived_path(kind, con, code, of_views=of_views)
    if path is not None and path.exists():
        try:
            # read into memory (the file is small), so no table refers to a mapping of it
            with pa.OSFile(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
            os.utime(path)  # in use: see _prune
            return table
        except (OSError, pa.ArrowException):
            with contextlib.suppress(OSError):
                path.unlink()
    table = compute()
    if path is not None:
        partial = path.with_name(f"partial-{os.getpid()}-{uuid.uuid4().hex[:8]}.arrow")
        try:
            with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(partial, path)
            _prune(path, kind)
        except (OSError, pa.ArrowException):
            with contextlib.suppress(OSError):
                partial.unlink()
    return table


def base_objects(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """Every object of ``con`` with its columns, sorted: before the views of ``queries/``, the base."""
    return con.execute(f"SELECT * FROM ({_OBJECTS}) ORDER BY ALL").fetchall()
