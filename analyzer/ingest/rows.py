"""Small helpers that shape parsed rows into the tables the store takes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.schema import table_schema


def rows_table(rows: list[dict]) -> pa.Table:
    """Rows as a table with every key any row has (``from_pylist`` takes the first row's)."""
    if rows and all(row.keys() == rows[0].keys() for row in rows):
        return pa.Table.from_pylist(rows)  # the usual case, without a copy of every row
    keys = dict.fromkeys(key for row in rows for key in row)
    return pa.Table.from_pylist([{key: row.get(key) for key in keys} for row in rows])


def with_day(table: pa.Table, ts_column: str) -> pa.Table:
    """``table`` with its ``day`` partition column, the UTC date of ``ts_column``."""
    ts = table[ts_column].cast(pa.float64())
    millis = pc.cast(pc.multiply(ts, 1000.0), pa.int64(), safe=False)
    day = pc.cast(pc.cast(millis, pa.timestamp("ms", tz="UTC")), pa.date32())
    return table.append_column("day", day) if "day" not in table.column_names else table


def constant(table: pa.Table, name: str, value: str | None) -> pa.Table:
    """``table`` with one more string column holding ``value`` on every row."""
    return table.append_column(name, pa.array([value] * table.num_rows, pa.string()))


def reject_rows(rows: list[dict] | pa.Table, source_id: str, uri: str, fmt: str, now: float) -> pa.Table:
    """``rejects`` rows from (line_number, reason, raw) rows of one object."""
    table = rows if isinstance(rows, pa.Table) else rows_table(rows)
    n = table.num_rows
    if n == 0:
        return table_schema("rejects").arrow_schema().empty_table()
    return pa.table(
        {
            "source_id": pa.array([source_id] * n, pa.string()),
            "uri": pa.array([uri] * n, pa.string()),
            "line_number": table["line_number"].cast(pa.int64()),
            "format": pa.array([fmt] * n, pa.string()),
            "reason": table["reason"].cast(pa.string()),
            "raw": table["raw"].cast(pa.string()),
            "ingested_at": pa.array([now] * n, pa.float64()),
        }
    )
