"""Which rows the store already holds: dedupe a batch by its tables' keys.

The same record read twice (a log re-read whole after a change, a rotated ``.gz`` copy of a
live log) must count once, so a batch drops the rows whose key a committed file already
holds, reading only the files and the key range the batch could collide with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.schema import table_schema
from hybridtrace.store.commit import partitions

if TYPE_CHECKING:
    from hybridtrace.store.commit import Store


def existing_keys(store: Store, table: str, data: pa.Table) -> pa.Table | None:
    """Key columns the store already holds that could collide with ``data``'s keys.

    Only files in ``data``'s partitions are read, and only rows within its range of
    the key's time (or line) column, so the cost follows the batch, not the store.
    """
    schema = table_schema(table)
    directories = {d + "/" for d, _ in partitions(schema, data)}
    files = [f for f in store.committed_files(table) if any(f.startswith(d) for d in directories)]
    if not files or not schema.key:
        return None
    where = ""
    ranged = next((c for c in ("ts", "end_ts", "line_number") if c in schema.key), None)
    if ranged is not None:
        low, high = pc.min(data[ranged]).as_py(), pc.max(data[ranged]).as_py()
        if low is not None:
            where = f" WHERE {ranged} BETWEEN {low!r} AND {high!r}"
            if pc.any(pc.is_null(data[ranged])).as_py():
                where += f" OR {ranged} IS NULL"
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
    existing = existing_keys(store, table, data)
    if existing is not None and existing.num_rows:
        old = pl.from_arrow(existing)
        assert isinstance(old, pl.DataFrame)
        frame = frame.join(old.unique(), on=key, how="anti", nulls_equal=True)
    kept = frame.to_arrow().cast(data.schema) if frame.height != data.num_rows else data
    return kept, data.num_rows - kept.num_rows
