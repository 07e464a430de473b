"""Store files dictionary-encode only the columns whose values repeat, and read back the same."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from hybridtrace.store.roots import (
    DICTIONARY_SAMPLE,
    PARQUET_OPTIONS,
    dictionary_columns,
    write_parquet_table,
)


def _encodings(path) -> dict[str, tuple[str, ...]]:
    group = pq.ParquetFile(path).metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}


def test_only_repeating_columns_get_a_dictionary(tmp_path) -> None:
    n = 10_000
    table = pa.table(
        {
            "ts": [1764400000.0 + i * 0.001 for i in range(n)],  # every value distinct
            "engine_id": ["decode-0"] * n,
            "rank": pa.array([i % 4 for i in range(n)], pa.int32()),
            "request_id": [f"cmpl-{i // 2}" for i in range(n)],  # half distinct: not worth it
            "note": pa.nulls(n, pa.string()),
        }
    )
    assert dictionary_columns(table) == ["engine_id", "rank", "note"]
    write_parquet_table(table, str(tmp_path / "t.parquet"))
    encodings = _encodings(tmp_path / "t.parquet")
    assert "RLE_DICTIONARY" in encodings["engine_id"] and "RLE_DICTIONARY" in encodings["rank"]
    assert "RLE_DICTIONARY" not in encodings["ts"] and "RLE_DICTIONARY" not in encodings["request_id"]
    assert pq.read_table(tmp_path / "t.parquet").equals(table)
    # the row groups keep the store's size (other code reads by them)
    assert pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(0).num_rows == min(
        n, PARQUET_OPTIONS["row_group_size"]
    )


def test_the_sample_judges_only_the_first_rows() -> None:
    # distinct within the sample, repeating after it: judged by what the sample saw
    n = DICTIONARY_SAMPLE * 2
    table = pa.table({"x": list(range(DICTIONARY_SAMPLE)) + [0] * DICTIONARY_SAMPLE})
    assert table.num_rows == n
    assert dictionary_columns(table) == []
    assert dictionary_columns(pa.table({"x": pa.array([], pa.int64())})) == ["x"]
    assert dictionary_columns(pa.table({"l": [[1], [2]]})) == []  # nested: written plain
