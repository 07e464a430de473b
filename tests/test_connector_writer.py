"""The trace writer and record builders that run inside vLLM: no analysis stack, no
blocking, nothing lost silently (drops are counted into the trace), parts rotate by size."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from hybridtrace.connector import records
from hybridtrace.connector.writer import TraceWriter, part_name, trace_dir
from hybridtrace.trace_v1 import validate


def _lines(folder: Path) -> list[dict]:
    out = []
    for part in sorted(folder.glob("*.jsonl")):
        out += [json.loads(line) for line in part.read_text().splitlines()]
    return out


def _engine() -> dict:
    return records.engine_record(
        ts=1764400000.0, engine_id="decode-0", role="decode", tp_size=2, rank=1, model="m",
        kv_cache_dtype="bfloat16", kv_buffer_device="cuda", use_host_buffer=False, agent_name="a-1",
        groups=[{"group": 0, "kind": "attention", "layers": 2, "padding_layers": 0, "block_tokens": 64,
                 "page_bytes": 8192}],
    )


def _transfer(i: int) -> dict:
    return records.transfer_record(
        ts=1764400001.0 + i, request_id=f"r{i}", remote_request_id=f"p{i}", engine_id="decode-0",
        remote_engine_id="prefill-0", rank=1, tp_size=2, remote_rank=1, remote_tp_size=2, status="ok",
        post_s=1e-5, xfer_s=1e-3, transported_bytes=4096 * i, descriptors=i, staging_bytes=0,
    )


def test_importing_the_connector_loads_no_analysis_stack():
    code = (
        "import sys, hybridtrace.connector, hybridtrace.connector.records, hybridtrace.connector.tap;"
        "print(sorted(m for m in ('polars', 'duckdb', 'pyarrow', 'altair', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_records_are_valid_trace_v1():
    assert validate(_engine()) == []
    assert validate(_transfer(3)) == []
    assert validate(records.release_record(ts=1764400002.0, engine_id="prefill-0", rank=0,
                                           request_id="p1")) == []
    assert validate(records.dropped_record("decode-0", 0, 123, 5)) == []
    request = records.request_record(ts=1764400003.0, request_id="cmpl-1-0a1b2c3d", engine_id="decode-0",
                                     missing_tokens=10, external_request_id="cmpl-1")
    assert validate(request) == []


def test_a_fact_not_seen_is_left_out_not_guessed():
    record = records.transfer_record(
        ts=1764400001.0, request_id="r", remote_request_id=None, engine_id="d", remote_engine_id="p",
        rank=0, tp_size=1, remote_rank=0, remote_tp_size=1, status="failed", post_s=None, xfer_s=0.0,
        transported_bytes=0, descriptors=None, staging_bytes=0,
    )
    assert record["post_s"] is None and record["descriptors"] is None and record["remote_request_id"] is None
    assert validate(record) == []


def test_group_split_is_exact_only_when_it_adds_up():
    groups = [(0, "mamba", 1), (1, "attention", 2)]
    split, exact = records.group_split({1: (3, 200, 2), 0: (1, 100, 2)}, 0, groups, 300)
    assert exact
    assert split == [
        {"group": 0, "kind": "mamba", "blocks": 1, "bytes": 100, "descriptors": 2},
        # 3 kernel blocks at 2 per logical block: 2 logical blocks
        {"group": 1, "kind": "attention", "blocks": 2, "bytes": 200, "descriptors": 2},
    ]
    assert not records.group_split({1: (2, 200, 2)}, 1, groups, 200)[1]  # a descriptor unplaced
    assert not records.group_split({1: (2, 200, 2)}, 0, groups, 300)[1]  # NIXL counted more


def test_records_are_built_and_written_off_the_callers_thread(tmp_path):
    writer = TraceWriter(tmp_path, engine_id="decode-0", role="decode", rank=1)
    writer.header(_engine())
    for i in range(1000):
        writer.emit(_transfer, i)
    writer.close()
    rows = _lines(tmp_path)
    assert [r["type"] for r in rows[:2]] == ["engine", "transfer"]
    assert [r["request_id"] for r in rows[1:]] == [f"r{i}" for i in range(1000)]
    assert writer.parts == [tmp_path / part_name("decode-0", "decode", 1, writer.pid, 1)]
    assert writer.parts[0].name == f"decode-0.decode.tp1.pid{writer.pid}.0001.jsonl"


def test_parts_rotate_by_size_and_each_opens_with_the_engine_record(tmp_path):
    writer = TraceWriter(tmp_path, engine_id="decode-0", role="decode", rank=1, part_bytes=4096)
    writer.header(_engine())
    for i in range(300):
        writer.emit(_transfer, i)
        if i % 50 == 0:
            writer.flush()
    writer.close()
    assert len(writer.parts) > 2
    for part in writer.parts:
        first = json.loads(part.read_text().splitlines()[0])
        assert first["type"] == "engine"
    rows = [r for r in _lines(tmp_path) if r["type"] == "transfer"]
    assert sorted(r["request_id"] for r in rows) == sorted(f"r{i}" for i in range(300))


def test_a_full_queue_drops_and_says_how_many(tmp_path):
    writer = TraceWriter(tmp_path, engine_id="decode-0", role="decode", rank=0, queue_records=10,
                         flush_s=60)
    writer._wake.set = lambda: None  # keep the writer asleep while the queue fills
    for i in range(25):
        writer.emit(_transfer, i)
    assert writer.dropped == 15
    del writer._wake.set
    writer.close()
    rows = _lines(tmp_path)
    assert sum(r["type"] == "transfer" for r in rows) == 10
    (dropped,) = [r for r in rows if r["type"] == "dropped"]
    assert dropped["records"] == 15 and validate(dropped) == []


def test_a_record_that_cannot_be_built_is_skipped_and_said_once(tmp_path, caplog):
    def broken(i: int) -> dict:
        raise ValueError("no")

    writer = TraceWriter(tmp_path, engine_id="e", role="decode", rank=0)
    with caplog.at_level(logging.WARNING, logger="hybridtrace.connector"):
        for i in range(3):
            writer.emit(broken, i)
        writer.emit(_transfer, 7)
        writer.close()
    assert [r["request_id"] for r in _lines(tmp_path)] == ["r7"]
    assert sum("could not be built" in m for m in caplog.messages) == 1


def test_an_unwritable_folder_stops_tracing_not_the_engine(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = TraceWriter(blocker / "trace", engine_id="e", role="decode", rank=0)
    with caplog.at_level(logging.ERROR, logger="hybridtrace.connector"):
        for i in range(5):
            writer.emit(_transfer, i)
        writer.flush()
        writer.close()
    assert any("cannot write the trace" in m for m in caplog.messages)


def test_the_folder_comes_from_the_extra_config_then_the_environment(monkeypatch):
    monkeypatch.delenv("HYBRIDTRACE_TRACE_DIR", raising=False)
    assert trace_dir({}) is None and trace_dir(None) is None
    monkeypatch.setenv("HYBRIDTRACE_TRACE_DIR", "/env")
    assert trace_dir({}) == "/env"
    assert trace_dir({"hybridtrace_dir": "/cfg"}) == "/cfg"
