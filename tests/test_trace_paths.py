"""The trace's fast path and its careful path give identical stores on malformed input.

The inputs are the malformed records the other trace tests use (tests/test_ingest_trace.py,
tests/test_parser_hardening.py, tests/test_hardening_inputs.py, built with tests/tracegen.py),
each between clean records, in chunks small enough that clean chunks take the fast path and
those holding a bad line the careful one. The same inputs are then ingested with the fast
path turned off, and every table of the two stores is compared row by row.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from test_hardening_inputs import DEEP
from test_parser_hardening import _FLOAT_FIELDS, _NON_FINITE, _base_records
from tracegen import dropped_record, engine_record, release_record, transfer_records

from hybridtrace.ingest import run as ingest_run
from hybridtrace.ingest import trace
from hybridtrace.ingest.limits import LINE_LIMIT
from hybridtrace.schema import TABLES
from hybridtrace.store import Store

# Columns that say when a run happened, not what it read.
RUN_COLUMNS = {"batch_id", "ingested_at"}


def _clean(n: int, seed: int) -> list[str]:
    return [json.dumps(r) for r in transfer_records(n, seed=seed)]


def _bad_records() -> list[str]:
    """Every malformed or out-of-range record of the other trace tests, one line each."""
    record = next(r for r in transfer_records(1) if r["type"] == "transfer")
    bad = [
        '{"type": "transfer", "v": 1, "ts": 1764400000',  # truncated JSON
        json.dumps({**record, "rank": "zero", "ts": 1.0}),
        json.dumps({**record, "status": "maybe", "ts": 2.0}),
        json.dumps({**record, "status": "maybe", "ts": record["ts"] + 0.5}),  # the enum alone is wrong
        json.dumps(engine_record("decode-9", "observer", 2)),
        json.dumps({"type": "transfer", "v": 1}),
        "not json",
        '{"type": "header", "v": 1}',
        json.dumps(record).replace('"v": 1', '"v": "1"'),
        json.dumps({**record, "v": 2}),
        json.dumps([record]),
        json.dumps({**record, "rank": "x"}),
        json.dumps({**record, "request_id": {"a": 1}}),
        json.dumps({**record, "request_id": [1]}),
        json.dumps({**record, "request_id": True}),
        json.dumps({**record, "rank": 1.5}),
        json.dumps({**record, "rank": True}),
        json.dumps({**record, "xfer_s": "0.1"}),
        json.dumps({**record, "tp_size": 0}),
        json.dumps({**record, "rank": record["tp_size"]}),
        json.dumps({**record, "remote_rank": -1}),
        json.dumps({**record, "ts": record["ts"] * 1000}),
        json.dumps({**record, "ts": 1e300}),
        json.dumps({**record, "bytes": -1}),
        json.dumps({**record, "post_s": -0.001}),
        json.dumps({**record, "xfer_s": -0.5}),
        json.dumps({**record, "link": "x" * LINE_LIMIT}),  # over the line limit
        '{"v": 1, "type": "transfer", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"v": 1, "type": "transfer", "x": ' + "[" * 100_000,
        json.dumps(record)[:-1] + f', "extra": {DEEP}}}',  # an unknown field nested deep: read
    ]
    bases = _base_records()
    for rtype, name in _FLOAT_FIELDS:
        for literal, _ in _NON_FINITE:
            item = {**bases[rtype], name: 0.5}
            bad.append(json.dumps(item).replace(f'"{name}": 0.5', f'"{name}": {literal}'))
    return bad


def _inputs(root: Path) -> None:
    """One trace per kind of trouble, each bad line between runs of clean records."""
    root.mkdir(parents=True)
    lines: list[str] = []
    for n, bad in enumerate(_bad_records()):
        lines += [*_clean(2, seed=n), bad]
    lines += _clean(2, seed=999)
    body = "\n".join(lines).encode() + b"\n"
    body = body.replace(b"not json", b"\xff\xfe\xfa invalid utf-8\nnot json")
    (root / "bad" / "trace.jsonl").parent.mkdir()
    (root / "bad" / "trace.jsonl").write_bytes(body)
    # record types that change from chunk to chunk, ids given as numbers, groups, a repeated line
    records = [engine_record("decode-0", "decode", 2), *transfer_records(12, seed=3)]
    records[5]["groups"] = [{"group": 0, "kind": "attention", "blocks": 3, "bytes": 100, "descriptors": 6}]
    records[6]["request_id"] = 12345
    records += [release_record("prefill-0", "p-1", 1764400030.0), dropped_record("decode-0", 3, 1764400040.0)]
    later_engine = engine_record("decode-0", "decode", 2, ts=1764400100.0)
    records += [*transfer_records(6, seed=4), records[2], later_engine]
    mixed = "\n".join(json.dumps(r) for r in records).encode() + b"\n"
    (root / "mixed").mkdir()
    (root / "mixed" / "trace.jsonl").write_bytes(b"\xef\xbb\xbf" + mixed)
    # blank lines of a CRLF file, and a last record cut short in a file gone quiet
    clean = _clean(3, seed=7)
    (root / "crlf").mkdir()
    crlf = "\r\n".join([clean[0], "", clean[1], " \t", *clean[2:]]) + "\r\n"
    (root / "crlf" / "trace.jsonl").write_text(crlf)
    (root / "cut").mkdir()
    (root / "cut" / "trace.jsonl").write_text("\n".join(_clean(3, seed=8))[:-10])
    stamp = time.time() - 3600
    for path in root.rglob("*.jsonl"):
        os.utime(path, (stamp, stamp))


def _tables(store: Path) -> dict[str, list[tuple]]:
    """Every committed row of every table, without the columns that date the run, sorted."""
    s = Store(store)
    out = {}
    for table in TABLES:
        parts = [s.files.read_table(rel) for rel in s.committed_files(table)]
        if not parts:
            out[table] = []
            continue
        data = pa.concat_tables(parts, promote_options="default")
        data = data.select([c for c in data.column_names if c not in RUN_COLUMNS])
        rows = [tuple(sorted(row.items())) for row in data.to_pylist()]
        out[table] = sorted(rows, key=repr)
    return out


@pytest.fixture
def small_chunks(monkeypatch):
    # a few records per chunk: clean chunks and chunks with a bad line alternate
    monkeypatch.setattr(ingest_run, "CHUNK_BYTES", 2048)


def test_fast_and_careful_paths_give_identical_stores_on_malformed_input(tmp_path, monkeypatch, small_chunks):
    _inputs(tmp_path / "in")
    taken = {"fast": 0, "careful": 0}
    parse = trace.FastReader.parse

    def counted(self, *args):
        tables = parse(self, *args)
        taken["fast" if tables is not None else "careful"] += 1
        return tables

    monkeypatch.setattr(trace.FastReader, "parse", counted)
    mixed = ingest_run.ingest([tmp_path / "in"], tmp_path / "mixed-store")
    assert taken["fast"] and taken["careful"]  # both paths read part of the input

    monkeypatch.setattr(trace.FastReader, "parse", lambda self, *args: None)
    careful = ingest_run.ingest([tmp_path / "in"], tmp_path / "careful-store")
    assert mixed.rejects == careful.rejects and mixed.rejects >= len(_bad_records())
    fast_tables, careful_tables = _tables(tmp_path / "mixed-store"), _tables(tmp_path / "careful-store")
    assert fast_tables["transfers"] and fast_tables["rejects"] and fast_tables["log_events"]
    for table in TABLES:
        assert fast_tables[table] == careful_tables[table], table


def test_a_chunk_with_a_record_type_the_one_before_lacked_is_read_whole(tmp_path, small_chunks):
    # The reader reads a chunk with the fields of the types the chunk before it held; a chunk
    # whose engine record comes after many transfer-only chunks keeps every field of it.
    records = [r for r in transfer_records(40) if r["type"] == "transfer"]
    engine = engine_record("decode-0", "decode", 2, ts=1764400500.0, vllm_version="0.11.0")
    lines = [json.dumps(r) for r in [*records, engine]]
    folder = tmp_path / "in" / "decode-0"
    folder.mkdir(parents=True)
    (folder / "trace.jsonl").write_text("\n".join(lines) + "\n")
    reader = trace.FastReader()
    first = reader.parse("\n".join(lines[:5]).encode(), 1, 5, "src")
    assert first is not None and reader.types == frozenset({"transfer"})
    tables = reader.parse(lines[-1].encode(), 41, 1, "src")
    assert tables is not None and tables["engines"]["vllm_version"].to_pylist() == ["0.11.0"]
    assert reader.types == frozenset({"engine"})
    ingest_run.ingest([tmp_path / "in"], tmp_path / "store")
    con = Store(tmp_path / "store").connect(with_queries=False)
    assert con.sql("SELECT vllm_version, tp_size FROM engines").fetchall() == [("0.11.0", 2)]


def test_a_field_the_chunks_before_lacked_is_read_when_it_comes(tmp_path, small_chunks):
    # Fields no chunk of the object has given a value yet are read as Null; a chunk that gives
    # one is refused by that read and read again with the field typed, and keeps its values.
    records = [r for r in transfer_records(40, seed=5) if r["type"] == "transfer"]
    for r in records:
        for name in ("groups", "link", "remote_agent_name"):
            r.pop(name, None)
    groups = [{"group": 0, "kind": "attention", "blocks": 3, "bytes": 100, "descriptors": 6}]
    late = {**records[-1], "ts": records[-1]["ts"] + 1, "link": "rdma", "groups": groups}
    lines = [json.dumps(r) for r in [*records, late]]
    reader = trace.FastReader()
    assert reader.parse("\n".join(lines[:5]).encode(), 1, 5, "src") is not None
    assert "link" not in reader.filled and "groups" not in reader.filled
    reads = []
    read = trace.FastReader._read

    def counted(block, types, filled=None):
        frame = read(block, types, filled)
        reads.append((filled is not None, frame is not None))
        return frame

    trace.FastReader._read = staticmethod(counted)
    try:
        tables = reader.parse(lines[-1].encode(), 41, 1, "src")
    finally:
        trace.FastReader._read = staticmethod(read)
    assert reads == [(True, False), (False, True)]  # refused as Null, then read typed
    assert tables is not None and tables["transfers"]["link"].to_pylist() == ["rdma"]
    assert json.loads(tables["transfers"]["groups"][0].as_py())[0]["bytes"] == 100
    assert {"link", "groups"} <= reader.filled
    # the same rows as a reader that never narrowed
    fresh = trace.FastReader().parse(lines[-1].encode(), 41, 1, "src")
    assert all(fresh[t].equals(tables[t]) for t in tables)
    # and a whole object read in small chunks gives the careful path's store
    folder = tmp_path / "in" / "decode-0"
    folder.mkdir(parents=True)
    (folder / "trace.jsonl").write_text("\n".join(lines) + "\n")
    ingest_run.ingest([tmp_path / "in"], tmp_path / "fast")
    original = trace.FastReader.parse
    trace.FastReader.parse = lambda self, *args: None
    try:
        ingest_run.ingest([tmp_path / "in"], tmp_path / "careful")
    finally:
        trace.FastReader.parse = original
    fast, careful = _tables(tmp_path / "fast"), _tables(tmp_path / "careful")
    assert fast["transfers"] and all(fast[t] == careful[t] for t in TABLES)
