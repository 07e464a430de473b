"""The cheap proof that a batch holds no key twice (its time column strictly increases) only
skips the hash when it holds: a batch with a tie, a step back or a null is hashed, and a
batch proven free of repeats is still deduped against the store."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from tracegen import transfer_records

from hybridtrace.ingest import run as ingest_run
from hybridtrace.ingest.run import ingest
from hybridtrace.schema import table_schema
from hybridtrace.store import Store
from hybridtrace.store.keys import _may_repeat, strictly_increasing


def _count(store: Path, sql: str) -> int:
    return Store(store).connect(with_queries=False).sql(sql).fetchall()[0][0]


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_strictly_increasing_needs_every_step_up() -> None:
    assert strictly_increasing(pa.chunked_array([[1.0, 2.0], [3.0]]))
    assert strictly_increasing(pa.chunked_array([[5]]))
    assert not strictly_increasing(pa.chunked_array([[1.0, 2.0], [2.0]]))  # a tie across chunks
    assert not strictly_increasing(pa.chunked_array([[1.0, 3.0, 2.0]]))  # a step back
    assert not strictly_increasing(pa.chunked_array([[1.0, None, 3.0]]))  # nulls compare equal
    assert not strictly_increasing(pa.chunked_array([[1.0, float("nan"), 3.0]]))
    assert not strictly_increasing(pa.chunked_array([["a", "b"]]))  # not a column it orders


def test_a_repeated_key_is_always_found() -> None:
    schema = table_schema("requests")
    rows = {"engine_id": ["e", "e", "e"], "request_id": ["a", "b", "a"]}
    increasing = pa.table({**rows, "ts": [1.0, 2.0, 3.0]})
    assert not _may_repeat(schema, increasing)  # proven by ts alone
    repeated = pa.table({**rows, "ts": [1.0, 2.0, 1.0]})
    assert _may_repeat(schema, repeated)  # ts steps back: the hash finds the repeat
    tie = pa.table({**rows, "ts": [1.0, 2.0, 2.0]})
    assert not _may_repeat(schema, tie)  # a tie is not a repeat when the keys differ
    nulls = pa.table({"engine_id": ["e", "e"], "request_id": ["a", "a"], "ts": [None, None]},
                     schema=pa.schema([("engine_id", pa.string()), ("request_id", pa.string()),
                                       ("ts", pa.float64())]))  # fmt: skip
    assert _may_repeat(schema, nulls)  # NULL keys compare equal


def test_a_record_repeated_in_one_batch_is_dropped_once(tmp_path) -> None:
    records = transfer_records(20)
    # the same records again, later in the file: the batch's times step back
    _write(tmp_path / "in" / "decode-0" / "trace.jsonl", records + records[:7])
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    assert summary.duplicates == 7
    assert _count(tmp_path / "store", "SELECT count(*) FROM transfers") == 40
    assert _count(tmp_path / "store", "SELECT count(DISTINCT (request_id, rank)) FROM transfers") == 40


def test_an_ordered_batch_is_still_deduped_against_stored_rows(tmp_path, monkeypatch) -> None:
    # each object its own batch: the second's times strictly increase (no repeat within it)
    # but overlap the first's stored range, which holds some of its keys
    monkeypatch.setattr(ingest_run, "BATCH_OBJECTS", 1)
    records = transfer_records(30)
    _write(tmp_path / "in" / "a" / "trace.jsonl", records[:40])
    _write(tmp_path / "in" / "b" / "trace.jsonl", records[20:])
    summary = ingest([tmp_path / "in"], tmp_path / "store")
    overlap = sum(1 for r in records[20:40] if r["type"] == "transfer")
    assert overlap > 0
    assert summary.duplicates >= overlap
    assert _count(tmp_path / "store", "SELECT count(*) FROM transfers") == 60
    again = ingest([tmp_path / "in"], tmp_path / "store2")
    assert _count(tmp_path / "store2", "SELECT count(*) FROM transfers") == 60
    assert again.duplicates == summary.duplicates
