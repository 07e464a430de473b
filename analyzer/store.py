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
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

import duckdb
import pyarrow as pa
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
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


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

    def _write_table(self, batch_id: str, schema: TableSchema, data: pa.Table) -> None:
        data = schema.conform(data)
        if not schema.partition:
            _write_atomic(data, self.root / schema.name / f"part-{batch_id}.parquet")
            return
        import polars as pl

        frame = pl.from_arrow(data)
        groups = frame.partition_by(list(schema.partition), as_dict=True, maintain_order=True)
        for n, (values, part) in enumerate(groups.items()):
            directory = self.root / schema.name
            for column, value in zip(schema.partition, values, strict=True):
                directory = directory / f"{column}={_partition_dir(value)}"
            _write_atomic(
                part.to_arrow().cast(schema.arrow_schema()), directory / f"part-{batch_id}-{n}.parquet"
            )

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
            from hybridtrace.queries_loader import install_views

            install_views(con)
        return con

    def existing_keys(self, con: duckdb.DuckDBPyConnection, table: str) -> str | None:
        """SQL relation of the key columns already stored for ``table``, or None if empty."""
        schema = table_schema(table)
        files = self.committed_files(table)
        if not files or not schema.key:
            return None
        listing = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
        return f"SELECT DISTINCT {', '.join(schema.key)} FROM read_parquet([{listing}], union_by_name = true)"

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


def dedupe(con: duckdb.DuckDBPyConnection, store: Store, table: str, data: pa.Table) -> tuple[pa.Table, int]:
    """Drop rows of ``data`` whose key the store (or an earlier row of ``data``) already holds."""
    schema = table_schema(table)
    if not schema.key or data.num_rows == 0:
        return data, 0
    key = list(schema.key)
    con.register("_incoming", data)
    try:
        # One row per key inside the batch (duplicates are the same record); NULL keys
        # compare equal.
        numbered = f"SELECT *, row_number() OVER (PARTITION BY {', '.join(key)}) AS _rn FROM _incoming"
        sql = f"SELECT * EXCLUDE (_rn) FROM ({numbered}) WHERE _rn = 1"
        existing = store.existing_keys(con, table)
        if existing:
            on = " AND ".join(f"n.{k} IS NOT DISTINCT FROM o.{k}" for k in key)
            sql = f"SELECT n.* FROM ({sql}) n WHERE NOT EXISTS (SELECT 1 FROM ({existing}) o WHERE {on})"
        kept = con.sql(sql).to_arrow_table()
    finally:
        with contextlib.suppress(Exception):
            con.unregister("_incoming")
    return kept, data.num_rows - kept.num_rows


def concat(tables: Iterable[pa.Table], schema: TableSchema) -> pa.Table:
    parts = [schema.conform(t) for t in tables if t is not None and t.num_rows]
    if not parts:
        return schema.arrow_schema().empty_table()
    return pa.concat_tables(parts)
