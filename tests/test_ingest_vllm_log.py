"""vLLM server logs: every recognised line shape, both eras, colour, gz, tracebacks, years."""

from __future__ import annotations

import gzip
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import storeread
from loggen import ENGINE_ID, REMOTE_ID, decode_log, kv_metrics, prefill_log, vllm_line

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store


def write(path: Path, text: str, *, mtime: datetime | None = None, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    stamp = (mtime or datetime(2026, 4, 22, tzinfo=UTC)).timestamp()
    os.utime(path, (stamp, stamp))
    return path


def rows(store: Path, sql: str) -> list[tuple]:
    return storeread.rows(store, sql)


@pytest.mark.parametrize("colour", [False, True])
def test_decode_log_lines(tmp_path, colour):
    write(tmp_path / "in" / "decode-a" / "vllm.log", decode_log(colour=colour))
    ingest([tmp_path / "in"], tmp_path / "s")
    s = tmp_path / "s"
    # KV Transfer metrics → intervals, MiB and seconds as vLLM means them
    intervals = rows(s, "SELECT engine_id, transfers, avg_xfer_s, avg_mib_per_transfer, avg_descriptors, "
                        "start_ts, end_ts FROM intervals ORDER BY end_ts")  # fmt: skip
    assert len(intervals) == 2
    first, second = intervals
    assert first[:5] == (ENGINE_ID, 24, pytest.approx(0.0124), 55.922, 2496.0)
    assert first[6] == datetime(2026, 4, 21, 10, 5, 21, tzinfo=UTC).timestamp()
    assert second[1] == 0 and second[5] == first[6]  # the next interval starts where this one ended
    # facts about the instance → one engines row
    engine = rows(s, "SELECT engine_id, block_tokens, mamba_padding_pct, padding_layers, kv_cache_tokens, "
                     "max_concurrency, conv_state_bytes, ssm_state_bytes, kv_buffer_device, use_host_buffer, "
                     "kv_layout, source_kind, tp_size FROM engines")  # fmt: skip
    assert engine == [(ENGINE_ID, 400, 1.78, 1, 4543600, 454.36, 18432, 786432, "cpu", True, "HND", "log", 2)]
    events = rows(
        s, "SELECT kind, request_id, remote_engine_id, rank, level FROM log_events ORDER BY ts, kind"
    )
    kinds = [e[0] for e in events]
    assert kinds == [
        "handshake_ok",
        "engine_stats",
        "engine_stats",
        "transfer_failed",
        "kv_load_failed",
        "kv_load_failed",
        "kv_load_recovered",
        "kv_expired_declined",
        "warning",
    ]
    failed = events[3]
    assert failed[1:] == ("cmpl-7f2d-0-5e9a0c21", REMOTE_ID, 0, "ERROR")
    assert {e[1] for e in events if e[0] == "kv_load_failed"} == {"cmpl-a-0", "cmpl-b-0"}
    assert events[7][1:3] == ("cmpl-z-0", "p-engine-7")
    # the failure's context dict is parsed (safely) and its traceback kept in the message
    details, message = rows(s, "SELECT details, message FROM log_events WHERE kind = 'transfer_failed'")[0]
    details = json.loads(details)
    assert details["num_local_blocks"] == 12 and details["xfer_state"] == "ERR"
    assert "RuntimeError: transfer failed" in message and "Traceback" in message
    stats = json.loads(
        rows(s, "SELECT details FROM log_events WHERE kind = 'engine_stats' ORDER BY ts")[0][0]
    )
    assert stats["avg_prompt_throughput_tokens_s"] == 1520.5 and stats["engine_index"] == 0
    # the INFO line of no interest is not kept; nothing was rejected
    assert rows(s, "SELECT count(*) FROM log_events WHERE message LIKE '%no interest%'") == [(0,)]
    assert rows(s, "SELECT count(*) FROM rejects") == [(0,)]


@pytest.mark.parametrize(("era", "timeout"), [("abort", 480), ("lease", None)])
def test_prefill_expiry_both_eras_and_handshake_mismatch(tmp_path, era, timeout):
    write(tmp_path / "in" / "prefill-a" / "vllm.log.1.gz", prefill_log(era=era), gz=True)
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT kind, request_id, details, engine_id FROM log_events ORDER BY ts")
    assert [e[0] for e in events] == ["kv_expired", "kv_expired_read", "handshake_mismatch"]
    details = json.loads(events[0][2])
    assert details["era"] == ("abort_timeout" if era == "abort" else "lease")
    assert details.get("timeout_s") == timeout and details["workers_read"] == 0
    assert events[0][1] == "cmpl-0c5e-0-1b8f" and events[0][3] == REMOTE_ID
    assert json.loads(events[2][2]) == {"local_hash": "abc123", "remote_hash": "def456"}


def test_year_from_mtime_with_rollover_and_explicit_year(tmp_path):
    text = vllm_line("first", level="WARNING", stamp="12-31 23:59:50") + "\n"
    text += vllm_line("second", level="WARNING", stamp="01-01 00:00:10") + "\n"
    write(tmp_path / "in" / "a" / "vllm.log", text, mtime=datetime(2027, 1, 1, 1, tzinfo=UTC))
    ingest([tmp_path / "in"], tmp_path / "s")
    stamps = [r[0] for r in rows(tmp_path / "s", "SELECT ts FROM log_events ORDER BY line_number")]
    assert stamps == [datetime(2026, 12, 31, 23, 59, 50, tzinfo=UTC).timestamp(),
                      datetime(2027, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp()]  # fmt: skip
    ingest([tmp_path / "in"], tmp_path / "s2", year=2024, tz="Europe/Paris")
    stamps = [r[0] for r in rows(tmp_path / "s2", "SELECT ts FROM log_events ORDER BY line_number")]
    # 23:59:50 in Paris (UTC+1 in winter) is 22:59:50 UTC; the rollover makes the second line 2025
    assert stamps[0] == datetime(2024, 12, 31, 22, 59, 50, tzinfo=UTC).timestamp()
    assert stamps[1] == datetime(2024, 12, 31, 23, 0, 10, tzinfo=UTC).timestamp()


def test_raw_traceback_lines_attach_to_the_error(tmp_path):
    text = "\n".join(
        [
            vllm_line("Worker failed", level="ERROR", stamp="04-21 10:00:00"),
            "(Worker_TP0 pid=305) Traceback (most recent call last):",
            '(Worker_TP0 pid=305)   File "a.py", line 3, in f',
            "(Worker_TP0 pid=305) ValueError: boom",
            "(Worker_TP0 pid=305) some unrelated print",
            vllm_line("after", level="WARNING", stamp="04-21 10:00:01"),
        ]
    )
    write(tmp_path / "in" / "a" / "vllm.log", text + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT kind, message FROM log_events ORDER BY line_number")
    assert [e[0] for e in events] == ["error", "warning"]
    assert events[0][1].endswith("ValueError: boom") and "unrelated" not in events[0][1]


def test_a_hash_mismatch_in_a_raw_traceback_after_an_info_line_is_kept(tmp_path):
    text = "\n".join(
        [
            vllm_line("Querying metadata on path: tcp://10.0.0.1:5600 at remote tp rank 0"),
            "(Worker_TP0 pid=305) Traceback (most recent call last):",
            "(Worker_TP0 pid=305)     raise RuntimeError(",
            "(Worker_TP0 pid=305) RuntimeError: NIXL compatibility hash mismatch. Local: 9c4e1f0b7a2d53e8, "
            "Remote: 1a2b3c4d5e6f7a8b. Prefill and decode instances have incompatible configurations.",
            vllm_line("Detected kv cache layout HND"),
        ]
    )
    write(tmp_path / "in" / "a" / "vllm.log", text + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT kind, details FROM log_events") == [
        ("handshake_mismatch", '{"local_hash": "9c4e1f0b7a2d53e8", "remote_hash": "1a2b3c4d5e6f7a8b"}')
    ]


def test_old_prefixless_shape_and_k8s_wrapper(tmp_path):
    text = "\n".join(
        [
            "WARNING 07-10 11:40:38 loggers.py:78] old shape, no bracket, no process",
            "2026-05-01T22:45:49.213Z " + vllm_line("wrapped", level="ERROR", stamp="05-01 22:45:49"),
        ]
    )
    write(tmp_path / "in" / "x" / "vllm.log", text + "\n", mtime=datetime(2026, 8, 1, tzinfo=UTC))
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT kind, ts, process, engine_id FROM log_events ORDER BY line_number")
    assert events[0][0] == "warning" and events[0][2] is None
    assert events[0][1] == datetime(2026, 7, 10, 11, 40, 38, tzinfo=UTC).timestamp()
    assert events[1][1] == pytest.approx(datetime(2026, 5, 1, 22, 45, 49, 213000, tzinfo=UTC).timestamp())
    assert events[0][3] == "x"  # no NIXL engine id in the log: the folder names the instance


def test_collector_stamps_with_an_offset_or_no_zone(tmp_path):
    text = "\n".join(
        [
            "2026-05-01T22:45:49.5+02:00 " + vllm_line("offset", level="ERROR", stamp="05-01 22:45:49"),
            "2026-05-01 22:45:59.25 | " + vllm_line("no zone", level="ERROR", stamp="05-01 22:45:59"),
            "2026-05-01T20:46:09Z " + vllm_line("utc", level="ERROR", stamp="05-01 22:46:09"),
        ]
    )
    write(tmp_path / "in" / "x" / "vllm.log", text + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", tz="Europe/Berlin")  # UTC+2 in May
    stamps = rows(tmp_path / "s", "SELECT ts FROM log_events ORDER BY line_number")
    utc = [(20, 45, 49, 500000), (20, 45, 59, 250000), (20, 46, 9, 0)]
    assert stamps == [(pytest.approx(datetime(2026, 5, 1, *t, tzinfo=UTC).timestamp()),) for t in utc]


def test_a_log_written_with_vllm_logging_prefix(tmp_path):
    expired = (
        "Releasing expired KV blocks for request r1 which were retrieved by 0 remote worker(s) "
        "before lease expired."
    )
    worker = vllm_line(expired, level="WARNING", process="Worker_TP1 pid=306")
    lines = [
        vllm_line("Initializing NIXL worker d-7").replace(" INFO ", " [decode-0] INFO "),
        worker.replace(" WARNING ", " [d0] WARNING "),
    ]
    write(tmp_path / "in" / "x" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT engine_id, kind, rank FROM log_events") == [("d-7", "kv_expired", 1)]


def test_rotated_gzip_copy_and_growing_log(tmp_path):
    log = write(tmp_path / "in" / "d" / "vllm.log", decode_log())
    ingest([tmp_path / "in"], tmp_path / "s")
    before = rows(tmp_path / "s", "SELECT count(*) FROM log_events")[0][0]
    write(tmp_path / "in" / "d" / "vllm.log.1.gz", log.read_bytes().decode(), gz=True)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.duplicates > 0
    assert rows(tmp_path / "s", "SELECT count(*) FROM log_events")[0][0] == before
    assert rows(tmp_path / "s", "SELECT count(*) FROM intervals")[0][0] == 2
    with open(log, "a") as handle:
        handle.write(vllm_line("late warning", level="WARNING", stamp="04-21 11:00:00") + "\n")
    os.utime(log, (datetime(2026, 4, 22, 1, tzinfo=UTC).timestamp(),) * 2)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.rows["log_events"] == 1 and summary.duplicates == 0
    # the appended read still knows the engine from the first read
    assert rows(tmp_path / "s", "SELECT engine_id FROM log_events WHERE message = 'late warning'") == [
        (ENGINE_ID,)
    ]


def test_unparseable_recognised_line_is_a_reject(tmp_path):
    path = tmp_path / "in" / "a" / "vllm.log"
    path.parent.mkdir(parents=True)
    bad_metrics = vllm_line("KV Transfer metrics: Num successful transfers=lots", process="APIServer pid=1")
    path.write_bytes(bad_metrics.encode() + b"\n\xff\xfe bad bytes\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    rejects = rows(tmp_path / "s", "SELECT line_number, reason FROM rejects ORDER BY line_number")
    assert rejects == [(1, "KV Transfer metrics line whose fields do not parse"), (2, "invalid UTF-8")]


@pytest.mark.parametrize(
    ("message", "what"),
    [
        ("Setting attention block size to lots tokens to ensure that attention page size is >= mamba page "
         "size.", "attention block size"),
        ("Padding mamba page size by abc% to ensure that mamba page size and attention page size are exactly "
         "equal.", "Mamba page padding"),
        ("GPU KV cache size: many tokens", "KV cache size"),
        ("Hybrid SSM registration: layers=28, mamba_ssm_size=(a, b)", "Hybrid SSM registration"),
        ("Releasing expired KV blocks for request r1 which were retrieved by 0 decode worker(s) within many "
         "seconds.", "KV expiry"),
        ("NIXL transfer failure: transfer_failed | Context: {'request_id': 'r2', 'remote_engine_id'",
         "NIXL transfer failure"),
    ],
)  # fmt: skip
def test_every_recognised_line_that_does_not_parse_is_a_reject(tmp_path, message, what):
    path = tmp_path / "in" / "a" / "vllm.log"
    path.parent.mkdir(parents=True)
    path.write_text(vllm_line(message, process="EngineCore_DP0 pid=1", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT line_number, reason FROM rejects") == [
        (1, f"{what} line whose fields do not parse")
    ]
    assert rows(tmp_path / "s", "SELECT count(*) FROM log_events") == [(0,)]  # not a generic warning


def test_a_log_whose_every_line_a_collector_stamped_is_recognised(tmp_path):
    for name, wrap in (("k8s", "2026-04-21T10:05:21.123456789Z "), ("pipe", "2026-04-21 10:05:21.213 | ")):
        text = "\n".join(
            wrap + line
            for line in (
                vllm_line(
                    "Releasing expired KV blocks for request cmpl-a which were retrieved by 0 decode "
                    "worker(s) within 480 seconds.",
                    level="WARNING",
                    stamp="04-21 10:05:21",
                    process="Worker_TP1 pid=306",
                ),
                vllm_line("done", stamp="04-21 10:05:22", process="Worker_TP0 pid=305"),
            )
        )
        write(tmp_path / "in" / name / "vllm.log", text + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT count(*) FROM sources WHERE format = 'vllm_log'") == [(2,)]
    assert rows(tmp_path / "s", "SELECT engine_id, request_id FROM log_events ORDER BY engine_id") == [
        ("k8s", "cmpl-a"),
        ("pipe", "cmpl-a"),
    ]
    assert rows(tmp_path / "s", "SELECT tp_size FROM engines") == [(2,), (2,)]


def test_a_failure_whose_traceback_holds_braces_keeps_its_context(tmp_path):
    context = {"failure_type": "handshake_setup_failed", "request_id": None, "engine_id": ENGINE_ID,
               "remote_engine_id": REMOTE_ID}  # fmt: skip
    message = "\n".join(
        [
            f"NIXL transfer failure: handshake_setup_failed | Context: {context!r}",
            "Traceback (most recent call last):",
            '  File "base_worker.py", line 698, in done_callback',
            "RuntimeError: NIXL compatibility hash mismatch. Local: 3fc700da, Remote: 161228f0. Prefill and "
            "decode instances have incompatible configurations. Set "
            "'{\"kv_connector_extra_config\": {\"enforce_handshake_compat\": false}}' to skip it.",
        ]
    )
    line = vllm_line(message, level="ERROR", stamp="04-21 10:05:12")
    write(tmp_path / "in" / "d" / "vllm.log", line + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT kind, remote_engine_id, details FROM log_events ORDER BY kind")
    assert [e[:2] for e in events] == [("handshake_mismatch", REMOTE_ID), ("transfer_failed", REMOTE_ID)]
    assert json.loads(events[0][2]) == {"local_hash": "3fc700da", "remote_hash": "161228f0"}
    assert rows(tmp_path / "s", "SELECT count(*) FROM rejects") == [(0,)]


def test_a_failed_notification_is_not_a_failed_read(tmp_path):
    context = {"failure_type": "notification_failed", "request_id": "cmpl-n-0-1", "engine_id": ENGINE_ID,
               "dst_engine_id": REMOTE_ID, "remote_rank": 0}  # fmt: skip
    message = ("NIXL transfer failure: notification_failed. P worker blocks will be freed after timeout. "
               f"This may indicate network issues. | Context: {context!r}")  # fmt: skip
    write(tmp_path / "in" / "d" / "vllm.log", vllm_line(message, level="ERROR") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT kind, request_id FROM log_events")
    assert events == [("notification_failed", "cmpl-n-0-1")]


def test_processes_interleaved_across_new_year(tmp_path):
    warning = "Releasing expired KV blocks for request cmpl-{} which were retrieved by 0 decode worker(s) " \
              "within 480 seconds."  # fmt: skip
    lines = [
        vllm_line(warning.format(1), level="WARNING", stamp="12-31 23:59:59", process="Worker_TP0 pid=1"),
        vllm_line(warning.format(2), level="WARNING", stamp="01-01 00:00:00", process="Worker_TP1 pid=2"),
        vllm_line(warning.format(3), level="WARNING", stamp="12-31 23:59:59", process="Worker_TP0 pid=1"),
        vllm_line(warning.format(4), level="WARNING", stamp="01-01 00:00:05", process="Worker_TP1 pid=2"),
    ]
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n", mtime=datetime(2027, 1, 2, tzinfo=UTC))
    ingest([tmp_path / "in"], tmp_path / "s")
    stamps = [r[0] for r in rows(tmp_path / "s", "SELECT ts FROM log_events ORDER BY line_number")]
    late, early = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    assert stamps == [late.timestamp(), early.timestamp(), late.timestamp(), early.timestamp() + 5]


def test_a_log_written_through_a_tty_ends_every_line_in_cr(tmp_path):
    warning = "Releasing expired KV blocks for request cmpl-{} which were retrieved by 0 decode worker(s) " \
              "within 480 seconds."  # fmt: skip
    # a terminal turns \n into \r\n, so vLLM's \r\n between the lines of one message becomes \r\r\n
    lines = [
        vllm_line(warning.format("a"), level="WARNING", stamp="04-21 10:00:00").replace("\r\n", "\r\r\n"),
        vllm_line(warning.format("b"), level="WARNING", stamp="04-21 10:00:01"),
        vllm_line(
            "Worker failed\nTraceback (most recent call last):\nValueError: boom",
            level="ERROR",
            stamp="04-21 10:00:02",
        ).replace("\r\n", "\r\r\n"),
        kv_metrics(1, 3.056, 14.0, "04-21 10:00:03"),
    ]
    write(tmp_path / "in" / "d" / "vllm.log", "".join(line + "\r\n" for line in lines))
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT kind, request_id, message FROM log_events ORDER BY line_number")
    assert [e[:2] for e in events] == [("kv_expired", "cmpl-a"), ("kv_expired", "cmpl-b"), ("error", None)]
    assert events[2][2] == "Worker failed\nTraceback (most recent call last):\nValueError: boom"
    assert rows(tmp_path / "s", "SELECT transfers FROM intervals") == [(1,)]


def test_interval_lines_with_other_fields_than_the_first_keep_them(tmp_path):
    messages = [
        "KV Transfer metrics: Num successful transfers=0, Num failed transfers=2, Num KV expired reqs=0",
        "KV Transfer metrics: NixlConnector={'Num successful transfers': 4, 'Avg xfer time (ms)': "
        "np.float64(3.5), 'Avg MB per transfer': np.float64(14.0), 'Throughput (MB/s)': 4000.0}",
    ]
    lines = [
        vllm_line(message, stamp=f"04-21 10:0{5 + i}:51", where="metrics.py:103", process="APIServer pid=1")
        for i, message in enumerate(messages)
    ]
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    intervals = rows(tmp_path / "s", "SELECT transfers, failed_transfers, avg_xfer_s, avg_mib_per_transfer, "
                                     "throughput_mib_s FROM intervals ORDER BY end_ts")  # fmt: skip
    assert intervals == [(0, 2, None, None, None), (4, None, pytest.approx(0.0035), 14.0, 4000.0)]


def test_tp_size_from_the_transfer_plan_or_from_worker_names(tmp_path):
    plan = (
        "Transfer plan: TransferTopology(tp_ratio=1, num_kv_heads=8, local_tp=4, remote_tp=4, "
        "local_rank=0, remote_block_len=32768)"
    )
    write(tmp_path / "in" / "planned" / "vllm.log", vllm_line(plan) + "\n")
    # only rank 0 spoke, but vLLM names workers Worker_TP<r> only at TP 2 or more
    write(tmp_path / "in" / "named" / "vllm.log", vllm_line("Detected kv cache layout HND") + "\n")
    # ranks after the TP rank in the name (expert parallelism): Worker_TP<r>_EP<e>
    expert = [
        vllm_line("Detected kv cache layout HND", process=f"Worker_TP{r}_EP{r} pid={305 + r}") for r in (0, 2)
    ]
    write(tmp_path / "in" / "expert" / "vllm.log", "\n".join(expert) + "\n")
    # the engine core runs the NIXL worker itself only without TP
    write(tmp_path / "in" / "core" / "vllm.log",
          vllm_line("Initializing NIXL worker c-1", process="EngineCore_DP0 pid=212") + "\n")
    hetero = ("Created HeteroTPTransferConfig(tp_ratio=-2, K=8, d_tp=4, p_tp=8, d_rank=0, "
              "physical_fa_reads=2, mamba_reads=2, fa_targets=[0, 1], transfer_targets=[0, 1])")
    write(tmp_path / "in" / "hetero" / "vllm.log", vllm_line(hetero) + "\n")
    mamba_plan = "Transfer plan: TransferTopology.mamba(tp_ratio=1, local_tp=8, remote_tp=8, fa_reads=1)"
    write(tmp_path / "in" / "mamba" / "vllm.log", vllm_line(mamba_plan) + "\n")
    write(tmp_path / "in" / "old" / "vllm.log",
          vllm_line("Detected kv cache layout HND", process="VllmWorker rank=2 pid=4242") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    # worker names give a lower bound, a transfer plan the size: the engine's is the largest
    assert rows(tmp_path / "s", "SELECT engine_id, max(tp_size) FROM engines GROUP BY ALL ORDER BY 1") == [
        ("c-1", 1),
        ("expert", 3),
        ("hetero", 4),
        ("mamba", 8),
        ("named", 2),
        ("old", 3),
        ("planned", 4),
    ]


def test_a_multiconnector_line_takes_the_nixl_connectors_statistics(tmp_path):
    nixl = (
        "NixlConnector={'Num successful transfers': 24, 'Avg xfer time (ms)': 12.4, "
        "'P90 xfer time (ms)': 15.871, 'Avg post time (ms)': 0.942, 'P90 post time (ms)': 1.307, "
        "'Avg MB per transfer': 55.922, "
        "'Throughput (MB/s)': 4509.829, 'Avg number of descriptors': 2496.0}"
    )
    offload = "OffloadingConnector={'CPU_to_GPU_total_bytes': 1048576, 'CPU_to_GPU_total_time': 0.01}"
    bodies = [f"{nixl}, {offload}", f"{offload}, {nixl}", f"{offload}, {offload.replace('Off', 'Other')}"]
    lines = [
        vllm_line(f"KV Transfer metrics: {body}", stamp=f"04-21 10:0{5 + i}:51", where="metrics.py:103",
                  process="APIServer pid=1")
        for i, body in enumerate(bodies)
    ]  # fmt: skip
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT transfers, avg_descriptors FROM intervals ORDER BY end_ts") == [
        (24, 2496.0),
        (24, 2496.0),
    ]
    # no NIXL statistics in the line at all: a reject, not a silent skip
    assert rows(tmp_path / "s", "SELECT line_number FROM rejects") == [(3,)]


def test_two_engines_logged_in_one_second_keep_their_intervals(tmp_path):
    stats = (
        "Engine {:03d}: Avg prompt throughput: 5.0 tokens/s, Avg generation throughput: 80.0 tokens/s, "
        "Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%"
    )
    lines = []
    for stamp in ("04-21 10:00:10", "04-21 10:00:20"):
        for engine, n in ((0, 3), (1, 5)):
            lines.append(vllm_line(stats.format(engine), stamp=stamp, where="loggers.py:236",
                                   process="APIServer pid=1"))  # fmt: skip
            lines.append(kv_metrics(n, 3.0, 14.0, stamp))
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.duplicates == 0
    intervals = rows(tmp_path / "s", "SELECT engine_index, transfers, start_ts, end_ts FROM intervals "
                                     "ORDER BY end_ts, engine_index NULLS FIRST")  # fmt: skip
    assert [r[:2] for r in intervals] == [(None, 3), (1, 5), (None, 3), (1, 5)]
    # each engine's interval starts where that engine's previous one ended
    assert intervals[2][2] == intervals[0][3] and intervals[3][2] == intervals[1][3]


@pytest.mark.parametrize(
    "block",
    [
        b'plain\n\nquoted "x" and \'y\'\n   \n\xc3\xa9t\xc3\xa9 # not a comment\nlast',
        b"trailing blank line\n",
        b"\xef\xbb\xbfa byte-order mark\nnext",
        b"tty line\r\nnext\r",
        b"unit\x1fseparator\nnext",
        b"bad \xff byte\nfine",
        b"x\x00nul\nend",
    ],
)
def test_lines_split_the_same_on_every_path(block):
    # The block is split by polars' CSV reader when it can be; every shape it cannot take
    # goes the long way: both give each line as is, numbered alike.
    from hybridtrace.ingest.formats.vllm_log import decode_series
    from hybridtrace.ingest.stream import Lines, decode_lines

    series, bad = decode_series(Lines(block), 1)
    texts, bad_too = decode_lines(Lines(block), 1)
    assert series.to_list() == texts and bad == bad_too
    assert len(texts) == block.count(b"\n") + 1


def test_the_hour_repeated_when_clocks_go_back_is_read_twice(tmp_path):
    # New York, 2025-11-02: 01:00–01:59 happens twice. A metrics line every 20 minutes
    # from 00:50 to 02:10 local time is 7 intervals, none of them the same instant.
    stamps = ["00:50", "01:10", "01:30", "01:50", "01:10", "01:30", "01:50", "02:10"]
    lines = [vllm_line("Initializing NIXL worker decode-0", stamp="11-02 00:00:00")]
    lines += [kv_metrics(4, 3.0, 20.0, f"11-02 {hm}:00") for hm in stamps]
    log = tmp_path / "in" / "d" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025, tz="America/New_York")
    ends = [r[0] for r in Store(tmp_path / "s").connect().sql(
        "SELECT strftime(to_timestamp(end_ts) AT TIME ZONE 'UTC', '%H:%M') FROM intervals "
        "WHERE source_kind = 'log' ORDER BY end_ts"
    ).fetchall()]  # fmt: skip
    assert ends == ["04:50", "05:10", "05:30", "05:50", "06:10", "06:30", "06:50", "07:10"]


def test_zone_less_collector_stamps_in_the_repeated_hour_follow_the_lines_own_pass(tmp_path):
    # Berlin's clocks go back at 03:00 on 2026-10-25: 02:10 after 02:50 is the second pass
    walls = ["01:50:00", "02:30:00", "02:50:00", "02:10:00", "02:40:00", "03:10:00"]
    line = "Detected kv cache layout HND"
    lines = [f"2026-10-25 {w}.000 | " + vllm_line(line, level="WARNING", stamp=f"10-25 {w}") for w in walls]
    after = datetime(2026, 10, 26, tzinfo=UTC)
    write(tmp_path / "in" / "b" / "vllm.log", "\n".join(lines) + "\n", mtime=after)
    ingest([tmp_path / "in"], tmp_path / "s", tz="Europe/Berlin")
    got = [datetime.fromtimestamp(ts, UTC).strftime("%H:%M") for (ts,) in
           rows(tmp_path / "s", "SELECT ts FROM log_events ORDER BY line_number")]  # fmt: skip
    assert got == ["23:50", "00:30", "00:50", "01:10", "01:40", "02:10"]


def test_a_banner_before_the_first_vllm_line_is_looked_at_again(tmp_path):
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text("starting the server\nloading...\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a") as handle:
        handle.write(vllm_line("after the banner", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    rows = storeread.rows(tmp_path / "s", "SELECT line_number, message FROM log_events")
    assert rows == [(3, "after the banner")]


def test_a_chunk_starting_with_a_blank_line_counts_it(tmp_path):
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n" + vllm_line("second line", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert storeread.rows(tmp_path / "s", "SELECT line_number FROM log_events") == [(2,)]


def test_a_held_back_last_line_is_read_once_the_file_is_quiet(tmp_path, monkeypatch):
    import hybridtrace.ingest.run as run

    log = tmp_path / "in" / "vllm.log"
    log.parent.mkdir()
    stats = "Engine 000: Avg prompt throughput: {}.0 tokens/s, Avg generation throughput: 1.0 tokens/s"
    lines = [vllm_line(stats.format(i)) for i in range(3)]
    log.write_text("\n".join(lines))  # no newline after the last line: it may still be written
    monkeypatch.setattr(run, "QUIET_SECONDS", 3600.0)
    first = ingest([log], tmp_path / "s")
    events = "SELECT count(*) FROM log_events WHERE kind = 'engine_stats'"
    assert storeread.rows(tmp_path / "s", events)[0][0] == 2 and first.objects_read == 1
    monkeypatch.setattr(run, "QUIET_SECONDS", 0.0)  # time passed; the file did not change
    ingest([log], tmp_path / "s")
    assert storeread.rows(tmp_path / "s", events)[0][0] == 3


def test_a_tty_log_read_on_where_it_stopped_keeps_its_shape(tmp_path):
    # Every line of a log written through a TTY ends with a carriage return, and a line
    # that continues into the next ends with two. A later read of one appended line decides
    # the shape from the file's head, as the first read did: its message has no stray CR.
    def tty(text: str) -> str:
        return text.replace("\n", "\r\n") + "\r\n"

    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text(tty("\n".join(vllm_line(f"line {i}") for i in range(3))), newline="")
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a", newline="") as handle:
        handle.write(vllm_line("part one", level="WARNING") + "\r\r\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    rows = storeread.rows(tmp_path / "s", "SELECT line_number, message FROM log_events")
    assert rows == [(4, "part one")]


def test_a_log_read_on_after_new_year_counts_the_year_on(tmp_path):
    # --year names the year of the log's first lines. A later read of the lines appended
    # since goes on from the year the earlier read had reached, so 01-01 after 12-31 is the
    # next year whether it is read in one go or in two.
    log = tmp_path / "in" / "a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text(vllm_line("old year", level="WARNING", stamp="12-31 23:59:00") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    with open(log, "a") as handle:
        handle.write(vllm_line("new year", level="WARNING", stamp="01-01 00:01:00") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s", year=2025)
    rows = Store(tmp_path / "s").connect().sql(
        "SELECT message, strftime(to_timestamp(ts) AT TIME ZONE 'UTC', '%Y-%m-%d') AS day "
        "FROM log_events ORDER BY ts"
    ).fetchall()
    assert rows == [("old year", "2025-12-31"), ("new year", "2026-01-01")]


def test_a_log_read_before_its_engine_id_is_that_engines_once_known(tmp_path):
    # The first read of a fresh server's log sees its allocator lines and a warning, but not
    # yet `Initializing NIXL worker`: it files them under the folder's name. A later read
    # learns the id. Every row is then decode-0's, as one read of the whole log gives.
    log = tmp_path / "in" / "host-a" / "vllm.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        vllm_line("Setting attention block size to 1312 tokens to ensure that attention page size is "
                  ">= mamba page size.", process="APIServer pid=1") + "\n"
        + vllm_line("early warning", level="WARNING") + "\n"
    )  # fmt: skip
    ingest([tmp_path / "in"], tmp_path / "s")
    with open(log, "a") as handle:
        handle.write(vllm_line("Initializing NIXL worker decode-0") + "\n")
        handle.write(vllm_line("later warning", level="WARNING") + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    ingest([tmp_path / "in"], tmp_path / "fresh")
    query = "SELECT DISTINCT engine_id FROM (SELECT engine_id FROM engines UNION ALL " \
        "SELECT engine_id FROM log_events)"
    assert storeread.rows(tmp_path / "s", query) == [("decode-0",)]
    assert storeread.rows(tmp_path / "fresh", query) == [("decode-0",)]


def test_a_multi_line_event_cut_at_the_end_of_a_growing_log_is_read_once_whole(tmp_path):
    """The log ends inside an event (a failure's traceback still being written): that event
    is read once, whole, when the log has grown past it; everything else is read once."""
    log = tmp_path / "in" / "d" / "vllm.log"
    head = decode_log()
    failure = vllm_line("NIXL transfer failure: transfer_failed | Context: {'request_id': 'r-cut'}",
                        level="ERROR", stamp="04-21 11:00:00")  # fmt: skip
    traceback = ["Traceback (most recent call last):", '  File "nixl.py", line 10, in read',
                 "RuntimeError: x"]  # fmt: skip
    write(log, head + failure + "\n" + traceback[0] + "\n", mtime=datetime.now(UTC))  # being written
    first = ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT count(*) FROM log_events WHERE request_id = 'r-cut'") == [(0,)]
    assert first.rows["log_events"] > 0  # the events before it are read
    with open(log, "a") as handle:
        handle.write("\n".join(traceback[1:]) + "\n")
        handle.write(vllm_line("late warning", level="WARNING", stamp="04-21 11:00:05") + "\n")
    os.utime(log, (datetime(2026, 4, 22, 1, tzinfo=UTC).timestamp(),) * 2)
    ingest([tmp_path / "in"], tmp_path / "s")
    ingest([tmp_path / "in"], tmp_path / "whole-once")
    query = "SELECT kind, message, count(*) FROM log_events GROUP BY ALL ORDER BY ALL"
    assert rows(tmp_path / "s", query) == rows(tmp_path / "whole-once", query)
    cut = rows(tmp_path / "s", "SELECT count(*) FROM log_events WHERE request_id = 'r-cut'")
    assert cut == [(1,)]
