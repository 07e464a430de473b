"""The store's committed state published as Apache Iceberg tables, for other engines to read.

A plain reader of the table folders sees every Parquet file there: those of batches that
never committed, and for an hour after a compaction the superseded ones, so it counts rows
twice. The Iceberg tables list exactly the committed files (``Store.committed_files``), so
Spark, Trino, Athena and DuckDB read exactly the rows hybridtrace's own views read.

- **Derived, not a second truth.** The store's commit (its ``sources`` file) stays the
  commit; ``sync`` makes each Iceberg table's file set equal the committed one — registers
  the missing files where they are (never copied), drops the superseded or gone ones — in
  one Iceberg commit per table, and nothing when they already agree. ``Store.write_batch``
  and ``Store.recover`` (which every writer runs first, and a compaction after its commit)
  call it, so a run killed between the store's commit and Iceberg's is repaired by the
  next writer, and uncommitted files are never registered.
- **The catalog** is pyiceberg's SQL catalog in a SQLite file, ``_iceberg/catalog.db``,
  with the tables' metadata under ``_iceberg/hybridtrace/<table>/metadata/``. In a
  bucket the file is downloaded, updated and uploaded whole, under the writer's lease.
  ``_iceberg/tables.json`` names each table's current metadata file, for engines that
  register a table by its metadata location (Athena, Trino, Spark's ``register_table``).
- **Opt in** per store: ``enable`` sets ``"iceberg": true`` in ``_meta.json`` and publishes
  once; a store without it never imports pyiceberg. A store that has it refuses a writer
  without pyiceberg (``require``) rather than let the tables fall behind.

Schema: one optional field per column in the column's order (ids 1…n), types mapped from
``schemas/*.toml``; the partition columns (``day``, ``engine_id``) are columns of the
files and identity partitions of the table. A column added to a schema file is added to
the table; older files read it as null (the table's name mapping matches by name).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridtrace.errors import UsageError
from hybridtrace.schema import TABLES, TableSchema, table_schema

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table

    from hybridtrace.store.commit import Store

NAMESPACE = "hybridtrace"
CATALOG = "_iceberg/catalog.db"
POINTERS = "_iceberg/tables.json"
_DIGEST = "hybridtrace.committed-files"  # snapshot summary: a digest of the file set it lists
# A table keeps this many snapshots at least, and those younger than the store's grace hour.
_KEEP_SNAPSHOTS = 32

_TYPES = {
    "string": "StringType",
    "json": "StringType",
    "int32": "IntegerType",
    "int64": "LongType",
    "float64": "DoubleType",
    "bool": "BooleanType",
    "date": "DateType",
}


def available() -> bool:
    """Whether pyiceberg and its SQL catalog can be imported (the ``iceberg`` extra)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("pyiceberg", "sqlalchemy"))


def require(store: Store) -> None:
    if not available():
        raise UsageError(
            f"{store}: this store publishes Iceberg tables, which needs pyiceberg: "
            'pip install "hybridtrace[iceberg]"'
        )


def iceberg_schema(schema: TableSchema) -> Any:
    """The Iceberg schema of a table: every column optional, ids in the column order."""
    from pyiceberg import types
    from pyiceberg.schema import Schema

    fields = [
        types.NestedField(n, c.name, getattr(types, _TYPES[c.type])(), required=False, doc=c.doc)
        for n, c in enumerate(schema.columns, start=1)
    ]
    return Schema(*fields)


def partition_spec(schema: TableSchema, ice: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    fields = [
        PartitionField(ice.find_field(name).field_id, 1000 + n, IdentityTransform(), name)
        for n, name in enumerate(schema.partition)
    ]
    return PartitionSpec(*fields)


def location(store: Store, rel: str) -> str:
    """The URI other engines open for a file of the store (kept literal: no quoting)."""
    if store.is_bucket:
        where = store.files.where  # type: ignore[union-attr]
        return f"{where.scheme}://{store.files.full(rel)}"
    return "file://" + os.path.abspath(store.files.full(rel))


@functools.cache
def _io_class() -> type:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    class StoreFileIO(PyArrowFileIO):
        """pyiceberg's file IO, reaching buckets with the store's own settings (``objects.py``)."""

        def _initialize_fs(self, scheme: str, netloc: str | None = None) -> Any:
            if scheme in ("s3", "gs"):
                from hybridtrace.store.objects import bucket

                return bucket(f"{scheme}://{netloc}/").filesystem
            return super()._initialize_fs(scheme, netloc)

    return StoreFileIO


def __getattr__(name: str) -> Any:
    # pyiceberg loads its file IO by a dotted name; the class is made on first use, so
    # importing this module imports no pyiceberg
    if name == "StoreFileIO":
        return _io_class()
    raise AttributeError(name)


@contextlib.contextmanager
def catalog(store: Store, *, write: bool = True) -> Iterator[SqlCatalog]:
    """The store's SQL catalog; in a bucket a local copy, uploaded whole afterwards when ``write``."""
    from pyiceberg.catalog.sql import SqlCatalog

    properties = {
        "py-io-impl": "hybridtrace.store.iceberg.StoreFileIO",
        "warehouse": location(store, "_iceberg"),
    }
    if not store.is_bucket:
        path = Path(store.files.full(CATALOG))
        path.parent.mkdir(parents=True, exist_ok=True)
        ice = SqlCatalog(NAMESPACE, uri=f"sqlite:///{path}", **properties)
        try:
            yield ice
        finally:
            ice.engine.dispose()
        return
    with tempfile.TemporaryDirectory(prefix="hybridtrace-iceberg-") as scratch:
        path = Path(scratch) / "catalog.db"
        if store.files.exists(CATALOG):
            with store.files.fs.open_input_file(store.files.full(CATALOG)) as handle:  # type: ignore[union-attr]
                path.write_bytes(handle.read())
        ice = SqlCatalog(NAMESPACE, uri=f"sqlite:///{path}", **properties)
        try:
            yield ice
        finally:
            ice.engine.dispose()
        if write:
            if store._lease_check is not None:
                store._lease_check()  # only the lease's holder replaces the catalog
            store.files.write_bytes(CATALOG, path.read_bytes())  # type: ignore[union-attr]


def _digest(files: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(files)).encode()).hexdigest()


def _current_files(table: Table) -> dict[str, Any]:
    """The data files the table's current snapshot lists, by path."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}
    out = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            out[entry.data_file.file_path] = entry.data_file
    return out


def _open_table(ice: SqlCatalog, name: str) -> Table:
    from pyiceberg.exceptions import NoSuchTableError

    schema = table_schema(name)
    ident = (NAMESPACE, name)
    try:
        table = ice.load_table(ident)
    except NoSuchTableError:
        ice_schema = iceberg_schema(schema)
        return ice.create_table(
            ident,
            ice_schema,
            partition_spec=partition_spec(schema, ice_schema),
            properties={
                "write.metadata.delete-after-commit.enabled": "true",
                "write.metadata.previous-versions-max": "8",
                # the files are the store's: hybridtrace, not Iceberg, deletes them
                "gc.enabled": "false",
                "schema.name-mapping.default": ice_schema.name_mapping.model_dump_json(),
                "comment": schema.doc,
            },
        )
    missing = [c for c in schema.columns if not _has_field(table, c.name)]
    if missing:  # a column added to schemas/: older files read it as null
        with table.update_schema() as update:
            update.union_by_name(iceberg_schema(schema))
        mapping = table.schema().name_mapping.model_dump_json()
        with table.transaction() as tx:
            tx.set_properties(**{"schema.name-mapping.default": mapping})
        table = ice.load_table(ident)
    return table


def _has_field(table: Table, column: str) -> bool:
    try:
        table.schema().find_field(column)
    except ValueError:
        return False
    return True


def committed_locations(store: Store) -> dict[str, list[str]]:
    """Each table's committed files, as the locations Iceberg lists them under."""
    batches = store.committed_batches()
    return {
        name: sorted(location(store, rel) for rel in store.committed_files(name, batches)) for name in TABLES
    }


def sync(store: Store) -> dict[str, tuple[int, int]]:
    """Make every Iceberg table list exactly the store's committed files; (added, removed) per
    table changed. Idempotent; runs under the writer lock, after the store's own commit."""
    wanted = committed_locations(store)
    synced: dict[str, str] = store.iceberg_synced
    digests = {name: _digest(files) for name, files in wanted.items()}
    if synced and all(synced.get(n) == d for n, d in digests.items()):
        return {}  # this process published exactly this state already
    changed: dict[str, tuple[int, int]] = {}
    pointers: dict[str, str] = {}
    with catalog(store) as ice:
        ice.create_namespace_if_not_exists(NAMESPACE)
        for name in TABLES:
            table = _open_table(ice, name)
            snapshot = table.current_snapshot()
            summary = snapshot.summary if snapshot is not None else None
            done = summary is not None and summary.get(_DIGEST) == digests[name]
            if not done and (snapshot is not None or wanted[name]):
                changed[name] = _commit(table, wanted[name], digests[name])
                table = ice.load_table((NAMESPACE, name))
            pointers[name] = table.metadata_location
            synced[name] = digests[name]
    _write_pointers(store, pointers)  # after the catalog (in a bucket: after its upload)
    return changed


def _commit(table: Table, wanted: list[str], digest: str) -> tuple[int, int]:
    """One Iceberg commit: the missing files registered, the ones no longer committed dropped."""
    from pyiceberg.table import _parquet_files_to_data_files

    current = _current_files(table)
    add = sorted(set(wanted) - set(current))
    remove = [current[path] for path in sorted(set(current) - set(wanted))]
    summary = {_DIGEST: digest}
    with _one_thread():
        with table.transaction() as tx, tx.update_snapshot(snapshot_properties=summary).overwrite() as update:
            for data_file in remove:
                update.delete_data_file(data_file)
            for data_file in _parquet_files_to_data_files(tx.table_metadata, add, table.io):
                update.append_data_file(data_file)
        _expire(table)
    return len(add), len(remove)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """pyiceberg's shared thread pool replaced by a one-thread pool for the duration.

    An overwrite picks the manifests that may hold the files it deletes with one evaluator
    object per partition spec, shared by the pool's threads, and that object keeps the
    manifest it is evaluating as an attribute: two threads at once can judge a manifest by the
    other's partition bounds, skip it, and fail the commit with "Missing required files to
    delete" (pyiceberg 0.12; seen under load; tests/test_iceberg.py checks that no two checks
    of the mirror's commits overlap). Our tables' manifests are few and small: read one after
    the other, they cost nothing.
    """
    from concurrent.futures import ThreadPoolExecutor

    from pyiceberg.utils.concurrent import ExecutorFactory

    # the pool, and in the releases that keep it, the process it was made in (a pool of
    # another process is made anew)
    saved = {name: getattr(ExecutorFactory, name) for name in ("_instance", "_instance_pid")
             if hasattr(ExecutorFactory, name)}  # fmt: skip
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridtrace-iceberg") as pool:
        ExecutorFactory._instance = pool
        if "_instance_pid" in saved:
            ExecutorFactory._instance_pid = os.getpid()
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(ExecutorFactory, name, value)


def _expire(table: Table) -> None:
    """Drop old snapshots from the metadata: their files may be gone (the store deletes
    superseded files an hour after a compaction), and each adds to every later metadata file."""
    from hybridtrace.store.commit import COMPACT_GRACE_S

    table.refresh()
    snapshots = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    if len(snapshots) <= 2 * _KEEP_SNAPSHOTS:
        return
    cutoff_ms = (time.time() - COMPACT_GRACE_S) * 1000
    old = [s.snapshot_id for s in snapshots[:-_KEEP_SNAPSHOTS] if s.timestamp_ms < cutoff_ms]
    if old:
        table.maintenance.expire_snapshots().by_ids(old).commit()


def _write_pointers(store: Store, pointers: dict[str, str]) -> None:
    text = json.dumps({"namespace": NAMESPACE, "tables": pointers}, indent=1, sort_keys=True)
    if not store.files.exists(POINTERS) or store.files.read_text(POINTERS) != text:
        store.files.write_text(POINTERS, text)


def enable(store: Store) -> list[dict[str, object]]:
    """Make ``store`` publish Iceberg tables from now on and publish its committed state; one
    row per table: its name, how many files it lists, its current metadata file."""
    require(store)
    store.init()
    with store.writer_lock():
        meta = json.loads(store.files.read_text("_meta.json"))
        if not meta.get("iceberg"):
            meta["iceberg"] = True
            store.files.write_text("_meta.json", json.dumps(meta))
        store.reload_meta()
        store.recover()  # migrates old partition names, then publishes
        files = committed_locations(store)
    pointers = json.loads(store.files.read_text(POINTERS))["tables"]
    return [{"table": t, "files": len(files[t]), "metadata": pointers[t]} for t in TABLES]


def snapshot_files(store: Store, table: str) -> list[str]:
    """The data files the named Iceberg table's current snapshot lists (for readers)."""
    with catalog(store, write=False) as ice:
        return sorted(_current_files(ice.load_table((NAMESPACE, table))))
