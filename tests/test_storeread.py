"""The tests' store reader (tests/storeread.py) answers as a new connection would."""

from __future__ import annotations

import shutil

import pytest
import storeread
from tracegen import engine_record, transfer_records, write_jsonl

from hybridtrace.errors import StoreDamagedError
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store


def fresh(store, sql: str) -> list[tuple]:
    return Store(store).connect().sql(sql).fetchall()


def test_answers_follow_every_change_to_the_store(tmp_path):
    trace = tmp_path / "in" / "decode-0" / "trace.jsonl"
    write_jsonl(trace, [engine_record("decode-0", "decode", 2), *transfer_records(2)])
    store = tmp_path / "s"
    ingest([tmp_path / "in"], store, model="nemotron-nano-12b-v2")
    tables = "SELECT count(*) FROM transfers"
    views = "SELECT count(*), sum(expected_bytes) FROM transfer_bytes"
    assert storeread.rows(store, tables) == fresh(store, tables) == [(4,)]
    assert storeread.rows(store, views) == fresh(store, views)
    # a second commit is seen at once, by the table and by the views over it
    write_jsonl(tmp_path / "in" / "decode-0" / "more.jsonl", transfer_records(3, seed=1))
    ingest([tmp_path / "in"], store)
    assert storeread.rows(store, tables) == fresh(store, tables) == [(10,)]
    assert storeread.rows(store, views) == fresh(store, views)
    # a table folder deleted by hand: the store refuses to open, through the reader too
    shutil.rmtree(store / "transfers")
    with pytest.raises(StoreDamagedError, match="no file of that table is left"):
        fresh(store, tables)
    with pytest.raises(StoreDamagedError, match="no file of that table is left"):
        storeread.rows(store, tables)
