"""Which rows the store already holds: dedupe a batch by its tables' keys.

The same record read twice (a log re-read whole after a change, a rotated ``.gz`` copy of a
live log) must count once, so a batch drops the rows whose key a committed file already
holds, reading only the files and the key range the batch could collide with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from hybridtrace.schema import TableSchema, table_schema
from hybridtrace.store.commit import canonical_directory, partitions

if TYPE_CHECKING:
    from hybridtrace.store.commit import Store


# A key's column that orders its rows in time (or in the object): duplicates share its value,
# so only stored rows within a batch's range of it can collide with the batch.
RANGE_COLUMNS = ("ts", "end_ts", "line_number")


def range_column(schema: TableSchema) -> str | None:
    return next((c for c in RANGE_COLUMNS if c in schema.key), None)


def key_range(data: pa.Table, column: str) -> tuple[object, object, bool]:
    """(lowest, highest, any null) of ``column`` in ``data``; both bounds None when all are null."""
    import pyarrow.compute as pc

    bounds = pc.min_max(data[column]).as_py()
    return bounds["min"], bounds["max"], data[column].null_count > 0


def note_written(store: Store, rel: str, schema: TableSchema, data: pa.Table) -> None:
    """Remember the key range of a data file the store writes, for later batches of the run.

    A data file never changes once written (its name holds its batch id), so the range stays
    true for as long as the file exists.
    """
    column = range_column(schema)
    if column is not None and schema.key:
        store.key_ranges[rel] = key_range(data, column)


def _may_overlap(store: Store, rel: str, batch: tuple[object, object, bool]) -> bool:
    """Whether file ``rel`` can hold a row within the batch's key range (True when unknown)."""
    known = store.key_ranges.get(rel)
    if known is None:
        return True  # written by another process: its rows are filtered by the scan instead
    low, high, nulls = known
    if batch[2] and nulls:
        return True  # NULL keys compare equal
    return low is not None and low <= batch[1] and high >= batch[0]


def existing_keys(store: Store, table: str, data: pa.Table) -> pa.Table | None:
    """Key columns the store already holds that could collide with ``data``'s keys.

    Only files in ``data``'s partitions are read, and only rows within its range of
    the key's time (or line) column, so the cost follows the batch, not the store. A file
    this store wrote in this process whose range the batch's cannot overlap is not opened:
    a trace read in order gives each batch later times than every file before it.
    """
    schema = table_schema(table)
    if not schema.key:
        return None
    # a store written before nulls were named Hive's way may still hold "=None" directories
    # (until its next writer migrates them): both spellings name the same partition here
    directories = {canonical_directory(d) for d, _ in partitions(schema, data)}
    files = [
        f for f in store.committed_files(table) if canonical_directory(f.rsplit("/", 1)[0]) in directories
    ]
    where = ""
    ranged = range_column(schema)
    if ranged is not None:
        low, high, nulls = key_range(data, ranged)
        if low is not None:
            files = [f for f in files if _may_overlap(store, f, (low, high, nulls))]
            where = f" WHERE {ranged} BETWEEN {low!r} AND {high!r}"
            if nulls:
                where += f" OR {ranged} IS NULL"
    if not files:
        return None
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        source = store.files.scan(con, table, files, schema.arrow_schema())
        try:
            return con.sql(f"SELECT {', '.join(schema.key)} FROM {source}{where}").to_arrow_table()
        except duckdb.BinderException:
            # files written before a key column existed (engines.rank): it reads as null
            present = {row[0] for row in con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()}
            types = {c.name: c.duckdb_type for c in schema.columns}
            keys = [k if k in present else f"CAST(NULL AS {types[k]}) AS {k}" for k in schema.key]
            return con.sql(f"SELECT {', '.join(keys)} FROM {source}{where}").to_arrow_table()
    finally:
        con.close()


def strictly_increasing(column: pa.ChunkedArray) -> bool:
    """Whether every value of ``column`` is greater than the one before it (no nulls, no NaN)."""
    import pyarrow.compute as pc

    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_temporal(kind)):
        return False  # no order worth proving here: the hash decides
    if column.null_count:
        return False  # NULL keys compare equal: two of them may be one key
    values = column.combine_chunks()
    if len(values) < 2:
        return True
    # each value against the one before it; NaN compares false, so is not proven distinct
    return bool(pc.all(pc.greater(values.slice(1), values.slice(0, len(values) - 1))).as_py())


def _may_repeat(schema: TableSchema, data: pa.Table) -> bool:
    """Whether two rows of ``data`` may share their key (False only when proven they do not).

    A trace or a log is read in order, so a batch's time (or line) column mostly increases
    from row to row; then it holds no value twice, and since that column is part of the key,
    no key repeats either. One pass over one column proves it, where hashing every key
    column of every row costs several. Anything else (a tie, a step back, a null) is left to
    the hash, which is exact.
    """
    import polars as pl

    ranged = range_column(schema)
    if ranged is not None and strictly_increasing(data[ranged]):
        return False
    key = list(schema.key)
    keys = pl.from_arrow(data.select(key), rechunk=False)
    assert isinstance(keys, pl.DataFrame)
    return bool(keys.select(pl.struct(key).hash(seed=7).is_duplicated().any()).item())


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
    repeated = _may_repeat(schema, data)
    existing = existing_keys(store, table, data)
    if not repeated and (existing is None or existing.num_rows == 0):
        return data, 0
    frame = pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    if repeated:
        frame = frame.unique(subset=key, keep="first", maintain_order=True)
    if existing is not None and existing.num_rows:
        old = pl.from_arrow(existing)
        assert isinstance(old, pl.DataFrame)
        frame = frame.join(old.unique(), on=key, how="anti", nulls_equal=True)
    kept = frame.to_arrow().cast(data.schema) if frame.height != data.num_rows else data
    return kept, data.num_rows - kept.num_rows
