"""Store files carry Bloom filters of their request ids, so that a look-up of a few requests
(the incremental analysis' cut) skips the row groups that cannot hold them even when ids are
random, as vLLM's are, and every group's statistics span the whole range of ids."""

from __future__ import annotations

import hashlib

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridtrace.store.roots import (
    BLOOM_WRITTEN,
    PARQUET_OPTIONS,
    bloom_filters,
    dictionary_columns,
    write_parquet_table,
)

pytestmark = pytest.mark.skipif(not BLOOM_WRITTEN, reason="this pyarrow writes no Bloom filters")


def _random_id(i: int) -> str:
    return f"cmpl-{hashlib.md5(str(i).encode()).hexdigest()}-0"


def _excluded(con: duckdb.DuckDBPyConnection, path: str, column: str, value: str) -> list[bool]:
    rows = con.execute(
        "SELECT row_group_id, bloom_filter_excludes FROM parquet_bloom_probe(?, ?, ?) ORDER BY 1",
        [path, column, value],
    ).fetchall()
    return [excludes for _, excludes in rows]


def test_a_lookup_of_absent_ids_skips_every_row_group_and_a_present_one_reads_its_own(tmp_path) -> None:
    n = 2 * PARQUET_OPTIONS["row_group_size"] + 1000  # three row groups
    ids = [_random_id(i // 4) for i in range(n)]  # four reads per request, as TP 4 makes
    table = pa.table(
        {
            "request_id": ids,
            "remote_request_id": [i.replace("cmpl-", "cmpl-p-") for i in ids],
            "engine_id": ["decode-0"] * n,
            "rank": pa.array([i % 4 for i in range(n)], pa.int32()),
        }
    )
    chosen = bloom_filters(table, dictionary_columns(table))
    assert set(chosen) == {"request_id", "remote_request_id"}
    # sized for the distinct ids of one row group (a quarter of its rows), not of the file
    assert chosen["request_id"]["ndv"] == pytest.approx(PARQUET_OPTIONS["row_group_size"] / 4, rel=0.01)
    path = str(tmp_path / "t.parquet")
    write_parquet_table(table, path)
    assert pq.read_table(path).equals(table)  # the values read back the same
    con = duckdb.connect()
    groups = pq.ParquetFile(path).metadata.num_row_groups
    assert groups == 3
    for column in ("request_id", "remote_request_id"):
        absent = [_excluded(con, path, column, f"cmpl-new-{k}") for k in range(20)]
        # 1% false positives per group and id: 60 probes may let one through, not more
        assert sum(not e for probe in absent for e in probe) <= 2
    last = ids[-1]
    assert _excluded(con, path, "request_id", last) == [True, True, False]
    # and the look-up the cut makes finds exactly the rows of the ids asked for
    wanted = [ids[0], last]
    found = con.execute(f"SELECT request_id FROM read_parquet('{path}') WHERE request_id IN (?, ?)", wanted)
    assert sorted(r[0] for r in found.fetchall()) == sorted([ids[0]] * 4 + [last] * ids.count(last))


def test_repeated_or_other_columns_get_no_filter() -> None:
    n = 5000
    table = pa.table(
        {
            "request_id": ["cmpl-same"] * n,  # one value: a dictionary, its statistics serve
            "remote_request_id": pa.array([None] * n, pa.string()),
            "source_id": [_random_id(i) for i in range(n)],  # distinct, but not looked up by
            "rank": pa.array(list(range(n)), pa.int64()),
        }
    )
    assert bloom_filters(table, dictionary_columns(table)) == {}
    assert bloom_filters(table.slice(0, 0), []) == {}


def test_ingested_trace_files_carry_the_filters(tmp_path) -> None:
    from tracegen import engine_record, transfer_records, write_jsonl

    from hybridtrace.ingest.run import ingest

    write_jsonl(tmp_path / "in" / "a.jsonl", [engine_record("decode-0", "decode", 2), *transfer_records(50)])
    ingest([str(tmp_path / "in")], str(tmp_path / "s"), progress=False)
    files = sorted((tmp_path / "s" / "transfers").rglob("*.parquet"))
    assert files
    con = duckdb.connect()
    for path in files:
        assert _excluded(con, str(path), "request_id", "cmpl-not-in-the-store") == [True]
