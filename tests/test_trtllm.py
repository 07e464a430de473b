"""TensorRT-LLM's transfer CSVs, written by code that follows each writer's format.

Writers read (NVIDIA/TensorRT-LLM):
- ``tensorrt_llm/_torch/disaggregation/native/perf_logger.py`` at 03037528b294dd85afbe981c37578c526ba35cbf
  (the header, the ``%(asctime)s.%(msecs)03d,`` prefix) and the ``csv_line`` f-strings of
  ``native/transfer.py`` (``{…:.3f}`` latencies, ``{…:.2f}`` MiB/s);
- ``cpp/tensorrt_llm/batch_manager/dataTransceiver.cpp`` at 03dd9bb8387c5c3015f41124da0f338751a177c0 and
  859f042647d8171554bdb8179f23beffcb074efb (``TransferSession::exportMeasure``: ``RequestID`` plus one
  ``,Delay(ms),Duration(ms),Bandwidth(Gbps)`` per measure), and a later stored version of the same
  file whose header is ``RequestID,RequestInfo,Preparation,Preprocess,Transmissions,Postprocess`` plus
  ``,Delay,Duration,Bandwidth(Gbps)`` per measure; ``std::ofstream`` prints doubles with six
  significant digits (``%g``);
- ``cpp/tensorrt_llm/batch_manager/cacheTransceiver.cpp`` (the generation-side summary,
  ``RequestID,gen_side_transfer_time(ms),kv_cache_size``).
"""

from __future__ import annotations

import pytest

from hybridtrace.ingest.trtllm import (
    CPP_V1_TRIPLE,
    CPP_V2_STAGES,
    CPP_V2_TRIPLE,
    PY_HEADER,
    SUMMARY_HEADER,
    looks_like_trtllm,
    parse_trtllm,
)
from hybridtrace.schema import table_schema


def python_task_csv(rows: list[dict]) -> bytes:
    """As PerfLogManager writes: the header once, then the logger's local stamp and the task's csv_line."""
    out = [PY_HEADER]
    for r in rows:
        if r["task"] == "KVRecvTask":
            # the receive task has only its size; the latency fields stay empty
            line = f"KVRecvTask,{r['rid']},{r['peer']},{r['size']},,,,,,,"
        else:
            line = (
                f"{r['task']},{r['rid']},{r['peer']},{r['size']},{r['size'] / r['entries']},{r['entries']},"
                f"{r['prep_ms']:.3f},{r['queue_ms']:.3f},{r['xfer_ms']:.3f},{r['task_ms']:.3f},"
                f"{r['size'] / (r['xfer_ms'] / 1000) / (1024.0 * 1024.0):.2f}"
            )
        out.append(f"{r['stamp']},{line}")
    return ("\n".join(out) + "\n").encode()


def _g(value: float) -> str:
    return f"{value:g}"  # what operator<< prints for a double at the default precision


def cpp_csv(requests: list[tuple[int, list[tuple[float, float, int]]]], *, v2: bool = False) -> bytes:
    """As exportMeasure writes: the header from the first request's measure count, then one line each."""
    first = requests[0][1]
    header = "RequestID," + CPP_V2_STAGES if v2 else "RequestID"
    header += ("," + (CPP_V2_TRIPLE if v2 else CPP_V1_TRIPLE)) * len(first)
    out = [header]
    for rid, measures in requests:
        line = str(rid)
        if v2:
            line += ",0.05,0.2,0.1,0.0,0.3"  # the five stage delays, ms
        for delay, duration, size in measures:
            gbps = size * 8.0 / duration / 1e6 if v2 else size * 8 / (duration / 1000) / 1e9
            line += f",{_g(delay)},{_g(duration)},{_g(gbps)}"
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def test_python_task_rows_become_transfers_per_peer_rank():
    data = python_task_csv(
        [
            {
                "stamp": "2026-04-21 10:00:00.123",
                "task": "KVSendTask",
                "rid": 77,
                "peer": 1,
                "size": 1048576,
                "entries": 256,
                "prep_ms": 0.1,
                "queue_ms": 0.2,
                "xfer_ms": 1.5,
                "task_ms": 2.0,
            },
            {
                "stamp": "2026-04-21 10:00:00.124",
                "task": "KVSendTask",
                "rid": 77,
                "peer": 0,
                "size": 2097152,
                "entries": 512,
                "prep_ms": 0.1,
                "queue_ms": 0.4,
                "xfer_ms": 3.0,
                "task_ms": 4.0,
            },
            {
                "stamp": "2026-04-21 10:00:00.125",
                "task": "AuxSendTask",
                "rid": 77,
                "peer": 0,
                "size": 64,
                "entries": 1,
                "prep_ms": 0.0,
                "queue_ms": 0.0,
                "xfer_ms": 0.1,
                "task_ms": 0.1,
            },
            {"stamp": "2026-04-21 10:00:00.300", "task": "KVRecvTask", "rid": 77, "peer": 0, "size": 1048576},
        ]
    )
    assert looks_like_trtllm(data, "ctx0_0.csv")
    tables, rejects = parse_trtllm(data, "src", name="/runs/a/ctx0_2.csv")
    assert rejects == []
    rows = tables["transfers"].to_pylist()
    assert tables["transfers"].schema == table_schema("transfers").arrow_schema()
    assert [(r["side"], r["remote_rank"], r["transported_bytes"]) for r in rows] == [
        ("send", 1, 1048576), ("send", 0, 2097152), ("recv", 0, 1048576)]  # fmt: skip
    send = rows[0]
    assert send["engine_id"] == "ctx0" and send["rank"] == 2 and send["descriptors"] == 256
    assert send["xfer_s"] == pytest.approx(0.0015) and send["wait_s"] == pytest.approx(0.0002)
    assert send["reported_bytes_per_s"] == pytest.approx(666.67 * 2**20)
    assert send["ts"] == pytest.approx(1776765600.123)
    assert rows[2]["xfer_s"] is None and rows[2]["descriptors"] is None
    assert tables["engines"].to_pylist()[0]["source_kind"] == "trtllm"


def test_python_task_zone_is_the_one_given():
    data = python_task_csv([{"stamp": "2026-04-21 12:00:00.000", "task": "KVRecvTask", "rid": 1, "peer": 0,
                             "size": 10}])  # fmt: skip
    tables, _ = parse_trtllm(data, "src", name="g_0.csv", tz="Europe/Berlin")
    assert tables["transfers"].column("ts")[0].as_py() == pytest.approx(1776765600.0)


@pytest.mark.parametrize("v2", [False, True])
def test_cpp_rows_one_transfer_per_measure_whatever_the_header_says(v2):
    # request 5 had one connection, request 6 three: the header has the first request's one triple
    many = [(0.1, 1.0, 1000000), (0.2, 2.0, 4000000), (0.3, 1.5, 3)]
    data = cpp_csv([(5, [(0.5, 2.0, 1048576)]), (6, many)], v2=v2)
    assert looks_like_trtllm(data, "")
    tables, rejects = parse_trtllm(data, "src", name="/out/ctx/rank_3_send.csv")
    assert rejects == []
    rows = tables["transfers"].to_pylist()
    assert [(r["request_id"], r["seq"]) for r in rows] == [("5", 0), ("6", 0), ("6", 1), ("6", 2)]
    assert all(r["side"] == "send" and r["rank"] == 3 and r["engine_id"] == "ctx" for r in rows)
    # no time, no peer and no byte count in these files
    assert all(r["ts"] is None and r["remote_rank"] is None and r["transported_bytes"] is None for r in rows)
    assert rows[0]["xfer_s"] == pytest.approx(0.002) and rows[0]["wait_s"] == pytest.approx(0.0005)
    # bytes = rate x time, to the six digits the writer keeps
    assert rows[0]["reported_bytes_per_s"] * rows[0]["xfer_s"] == pytest.approx(1048576, rel=1e-5)
    assert tables["engines"].to_pylist()[0]["role"] == "prefill"


def test_cpp_zero_duration_keeps_the_measure_without_a_rate():
    data = b"RequestID,Delay(ms),Duration(ms),Bandwidth(Gbps)\n9,0.1,0,inf\n"
    tables, rejects = parse_trtllm(data, "src", name="rank_0_recv.csv")
    assert rejects == []
    assert tables["transfers"].to_pylist()[0]["reported_bytes_per_s"] is None


def test_bad_rows_are_rejects_with_their_line_numbers():
    data = (
        b"RequestID,Delay(ms),Duration(ms),Bandwidth(Gbps)\n"
        b"1,0.5,2,4.19\n"
        b"\n"
        b"2,0.5,2\n"  # a triple cut short
        b"3,x,2,4\n"  # not a number
        b"4,0.5,-2,4\n"  # negative duration
        b"5,0.5,2,4,0.1,nan,1\n"  # one bad measure of two: the line goes
        b"\xff\xfe,1,1,1\n"
    )
    tables, rejects = parse_trtllm(data, "src", name="rank_0_recv.csv")
    assert [r["request_id"] for r in tables["transfers"].to_pylist()] == ["1"]
    assert [(n, reason.split(":")[0]) for n, reason, _ in rejects] == [
        (4, "wrong number of fields"),
        (5, "Delay is not a number"),
        (6, "Duration is negative"),
        (7, "Duration is not a finite number"),
        (8, "invalid UTF-8"),
    ]
    py = (PY_HEADER + "\n2026-04-21 10:00:00.123,KVSendTask,1,0,12,1.0,12,0.1,0.1,0.1,0.1,1.0\n"
          "2026-02-30 10:00:00.000,KVSendTask,2,0,12,1.0,12,0.1,0.1,0.1,0.1,1.0\n"
          "2026-04-21 10:00:00.200,KVMaybeTask,3,0,12,1.0,12,0.1,0.1,0.1,0.1,1.0\n"
          "2026-04-21 10:00:00.300,KVSendTask,4,0,1e999,1.0,12,0.1,0.1,0.1,0.1,1.0\n").encode()  # fmt: skip
    tables, rejects = parse_trtllm(py, "src", name="a_0.csv")
    assert tables["transfers"].num_rows == 1
    assert [(n, reason.split(":")[0]) for n, reason, _ in rejects] == [
        (3, "time stamp is not a date and time"), (4, "unknown task_type KVMaybeTask"),
        (5, "transfer_size_bytes is not a number")]  # fmt: skip


def test_generation_summary_has_no_rank():
    stamped = ("timestamp," + SUMMARY_HEADER, "2026-04-21 10:00:00.000,42,12.345,1024")
    for header, line in ((SUMMARY_HEADER, "42,12.345,1024"), stamped):
        data = f"{header}\n{line}\n".encode()
        assert looks_like_trtllm(data, "")
        tables, rejects = parse_trtllm(data, "src", name="/o/gen0_1_gen_transfer_summary.csv")
        row = tables["transfers"].to_pylist()[0]
        assert rejects == [] and row["rank"] is None and row["engine_id"] == "gen0"
        assert row["transported_bytes"] == 1024 and row["xfer_s"] == pytest.approx(0.012345)


def test_other_csvs_are_not_taken():
    assert not looks_like_trtllm(b"RequestID,Bandwidth(Gbps)\n1,80\n", "x_0_recv.csv")
    assert not looks_like_trtllm(b"a,b,c\n", "rank_0_send.csv")
    tables, rejects = parse_trtllm(b"a,b\n1,2\n", "src", name="x.csv")
    assert tables["transfers"].num_rows == 0 and rejects[0][:2] == (
        1,
        "not a TensorRT-LLM transfer CSV header",
    )


def test_python_send_rows_reach_the_byte_check_but_no_file_sizes_the_engine(tmp_path):
    """Through ``ingest``: a context rank's KVSendTask rows of one request are one `reported_bytes`
    row (the peers' parts summed: 1,048,576 + 2,097,152 = 3,145,728 B, exact); the receive row is
    not judged. The files name no TP size and no token count, so the row says why it is not
    judged instead of being guessed at (the case finding_reported_bytes_excess/trtllm_python_bytes
    judges such rows where the model and the request are known)."""
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    send = {"task": "KVSendTask", "rid": 77, "entries": 256, "prep_ms": 0.1, "queue_ms": 0.2, "xfer_ms": 1.5,
            "task_ms": 2.0}  # fmt: skip
    data = python_task_csv([
        {**send, "stamp": "2026-04-21 10:00:00.123", "peer": 1, "size": 1048576},
        {**send, "stamp": "2026-04-21 10:00:00.124", "peer": 0, "size": 2097152},
        {"stamp": "2026-04-21 10:00:00.300", "task": "KVRecvTask", "rid": 77, "peer": 0, "size": 1048576},
    ])  # fmt: skip
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "ctx0_2.csv").write_bytes(data)
    columns = "engine_id, request_id, rank, send_rows, peers, transported_bytes, unsized"
    sql = f"SELECT {columns} FROM reported_bytes"
    no_tp = "byte model: TP size unknown (no trace engine record or worker names in the log)"
    for model, why in ((None, "no model config serves the engine"), ("nemotron-nano-12b-v2", no_tp)):
        store = tmp_path / f"store-{model}"
        ingest([tmp_path / "in"], store, model=model)
        con = Store(store).connect()
        assert con.sql(sql).fetchall() == [("ctx0", "77", 2, 2, 2, 3145728, why)]
        assert con.sql("SELECT count(*) FROM finding_reported_bytes_excess").fetchall() == [(0,)]
