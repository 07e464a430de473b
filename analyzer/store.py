"""The store: Parquet files per table, a ``sources`` manifest, DuckDB views over both.

Layout under the store root::

    _meta.json                                   schema version
    transfers/day=2026-11-29/engine_id=d0/part-<batch>-<n>.parquet
    sources/part-<batch>.parquet                 the commit record of a batch

A batch commits when its ``sources`` file appears (written last, by atomic rename).
Data files carry their batch id in the name; the views read only files of committed
batches, so a process killed mid-batch leaves a readable store, and the files it left
are removed by the next run, which then reads the same objects again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hybridtrace.errors import UsageError
from hybridtrace.schema import SCHEMA_VERSION, TABLES, TableSchema, table_schema

DEFAULT_STORE = "hybridtrace-data"
_PART = re.compile(r"^part-(?P<batch>[0-9a-f]{32})(?:-\d+)?\.parquet$")


def default_store() -> str:
    return os.environ.get("HYBRIDTRACE_STORE") or DEFAULT_STORE


def new_batch_id() -> str:
    return uuid.uuid4().hex


def _write_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd", compression_level=1)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    # The rename itself must reach the disk before anything that depends on it.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _partition_dir(value: object) -> str:
    # Engine ids can hold any character; keep directory names safe and reversible.
    return quote(str(value), safe="")


class Store:
    """A local store root. Bucket-backed stores come with the bucket issue."""

    def __init__(self, root: str | Path) -> None:
        text = str(root)
        if "://" in text:
            raise UsageError(f"{text}: bucket stores are not supported yet; use a local path")
        self.root = Path(root)

    # --- layout -----------------------------------------------------------------------

    def init(self) -> None:
        self.check_version()
        self.root.mkdir(parents=True, exist_ok=True)
        meta = self.root / "_meta.json"
        if not meta.exists():
            tmp = meta.with_suffix(".tmp")
            tmp.write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
            os.replace(tmp, meta)

    @property
    def schema_version(self) -> int | None:
        meta = self.root / "_meta.json"
        if not meta.exists():
            return None
        return int(json.loads(meta.read_text())["schema_version"])

    @contextlib.contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Hold the store's writer lock: one ingest at a time (a crashed one releases it)."""
        import fcntl

        handle = open(self.root / ".writer.lock", "a")  # noqa: SIM115 - closed below
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise UsageError(
                    f"{self.root}: another ingest is writing to this store; try again when it ends"
                ) from exc
            yield
        finally:
            handle.close()

    def check_version(self) -> None:
        version = self.schema_version
        if version is not None and version > SCHEMA_VERSION:
            raise UsageError(
                f"{self.root}: written by a newer hybridtrace (store schema {version}, this one reads "
                f"up to {SCHEMA_VERSION}); upgrade hybridtrace"
            )

    def exists(self) -> bool:
        return (self.root / "_meta.json").exists()

    def _files(self, table: str) -> list[Path]:
        directory = self.root / table
        if not directory.exists():
            return []
        return sorted(p for p in directory.rglob("part-*.parquet") if _PART.match(p.name))

    def committed_batches(self) -> set[str]:
        batches = set()
        for path in self._files("sources"):
            match = _PART.match(path.name)
            if match:
                batches.add(match.group("batch"))
        return batches

    def committed_files(self, table: str, batches: set[str] | None = None) -> list[Path]:
        batches = self.committed_batches() if batches is None else batches
        out = []
        for path in self._files(table):
            match = _PART.match(path.name)
            if match and match.group("batch") in batches:
                out.append(path)
        return out

    def recover(self) -> int:
        """Remove what an interrupted batch left behind; returns how many files went."""
        if not self.root.exists():
            return 0
        batches = self.committed_batches()
        removed = 0
        for tmp in self.root.rglob("*.tmp"):
            tmp.unlink(missing_ok=True)
            removed += 1
        for table in TABLES:
            if table == "sources":
                continue
            for path in self._files(table):
                match = _PART.match(path.name)
                if match and match.group("batch") not in batches:
                    path.unlink(missing_ok=True)
                    removed += 1
        return removed

    # --- writing ----------------------------------------------------------------------

    def write_batch(self, batch_id: str, tables: dict[str, pa.Table], sources: pa.Table) -> None:
        """Write a batch's data files, then commit it by writing its ``sources`` file."""
        for name, data in tables.items():
            if data.num_rows:
                self._write_table(batch_id, table_schema(name), data)
        schema = table_schema("sources")
        _write_atomic(schema.conform(sources), self.root / "sources" / f"part-{batch_id}.parquet")

    def _partitions(self, schema: TableSchema, data: pa.Table) -> list[tuple[Path, pa.Table]]:
        """(directory, rows) per partition of ``data``."""
        if not schema.partition:
            return [(self.root / schema.name, data)]
        combos = data.group_by(list(schema.partition), use_threads=False).aggregate([]).to_pylist()
        out = []
        for combo in combos:
            directory = self.root / schema.name
            mask = None
            for column in schema.partition:
                value = combo[column]
                directory = directory / f"{column}={_partition_dir(value)}"
                if len(combos) > 1:
                    test = pc.is_null(data[column]) if value is None else pc.equal(data[column], value)
                    mask = test if mask is None else pc.and_(mask, test)
            out.append((directory, data if mask is None else data.filter(mask)))
        return out

    def _write_table(self, batch_id: str, schema: TableSchema, data: pa.Table) -> None:
        data = schema.conform(data)
        for n, (directory, part) in enumerate(self._partitions(schema, data)):
            _write_atomic(part, directory / f"part-{batch_id}-{n}.parquet")

    # --- reading ----------------------------------------------------------------------

    def connect(self, *, with_queries: bool = True) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with one view per table (committed data only)."""
        self.check_version()
        con = duckdb.connect(":memory:")
        batches = self.committed_batches()
        for name in TABLES:
            schema = table_schema(name)
            files = self.committed_files(name, batches)
            if files:
                listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
                columns = _select_list(schema, files)
                con.execute(
                    f"CREATE VIEW {schema.view} AS SELECT {columns} FROM "
                    f"read_parquet([{listing}], union_by_name = true, hive_partitioning = false)"
                )
            else:
                con.execute(f"CREATE VIEW {schema.view} AS {schema.empty_select()}")
        from hybridtrace.attach import engine_models

        con.register("_engine_models_table", engine_models(con))
        con.execute("CREATE VIEW engine_models AS SELECT * FROM _engine_models_table")
        if with_queries:
            from hybridtrace.analyze.thresholds import install as install_thresholds
            from hybridtrace.queries_loader import install_views

            install_thresholds(con)
            install_views(con)
        return con

    def existing_keys(self, table: str, data: pa.Table) -> pa.Table | None:
        """Key columns the store already holds that could collide with ``data``'s keys.

        Only files in ``data``'s partitions are read, and only rows within its range of
        the key's time (or line) column, so the cost follows the batch, not the store.
        """
        schema = table_schema(table)
        directories = {str(d) + os.sep for d, _ in self._partitions(schema, data)}
        files = [p for p in self.committed_files(table) if any(str(p).startswith(d) for d in directories)]
        if not files or not schema.key:
            return None
        listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
        where = ""
        ranged = next((c for c in ("ts", "end_ts", "line_number") if c in schema.key), None)
        if ranged is not None:
            low, high = pc.min(data[ranged]).as_py(), pc.max(data[ranged]).as_py()
            if low is not None:
                where = f" WHERE {ranged} BETWEEN {low!r} AND {high!r}"
                if pc.any(pc.is_null(data[ranged])).as_py():
                    where += f" OR {ranged} IS NULL"
        con = duckdb.connect(":memory:")
        try:
            return con.sql(
                f"SELECT {', '.join(schema.key)} FROM read_parquet([{listing}], union_by_name = true){where}"
            ).to_arrow_table()
        finally:
            con.close()

    def sources_frame(self) -> pa.Table:
        files = self.committed_files("sources")
        schema = table_schema("sources")
        if not files:
            return schema.arrow_schema().empty_table()
        return pa.concat_tables([schema.conform(pq.read_table(p)) for p in files])


def _select_list(schema: TableSchema, files: list[Path]) -> str:
    """Columns of ``schema``; one that older files lack reads as NULL, so old stores open."""
    present: set[str] = set()
    for path in files:
        present.update(pq.read_schema(path).names)
    parts = []
    for column in schema.columns:
        if column.name in present:
            parts.append(column.name)
        else:
            parts.append(f"CAST(NULL AS {column.duckdb_type}) AS {column.name}")
    return ", ".join(parts)


def dedupe(store: Store, table: str, data: pa.Table) -> tuple[pa.Table, int]:
    """Drop rows of ``data`` whose key the store (or an earlier row of ``data``) already holds.

    Duplicates are the same record read twice, so which copy stays does not matter; NULL
    keys compare equal.
    """
    import polars as pl

    schema = table_schema(table)
    if not schema.key or data.num_rows == 0:
        return data, 0
    key = list(schema.key)
    frame = pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    # A cheap hash first: most batches have no duplicate at all.
    if frame.select(pl.struct(key).hash(seed=7).is_duplicated().any()).item():
        frame = frame.unique(subset=key, keep="first", maintain_order=True)
    existing = store.existing_keys(table, data)
    if existing is not None and existing.num_rows:
        old = pl.from_arrow(existing)
        assert isinstance(old, pl.DataFrame)
        frame = frame.join(old.unique(), on=key, how="anti", nulls_equal=True)
    kept = frame.to_arrow().cast(data.schema) if frame.height != data.num_rows else data
    return kept, data.num_rows - kept.num_rows


def concat(tables: Iterable[pa.Table], schema: TableSchema) -> pa.Table:
    parts = [schema.conform(t) for t in tables if t is not None and t.num_rows]
    if not parts:
        return schema.arrow_schema().empty_table()
    return pa.concat_tables(parts)
