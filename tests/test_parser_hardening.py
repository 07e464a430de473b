"""Parser hardening: impossible stamps, non-finite numbers, oversized lines, malformed labels,
and distinct log lines of one second, each format read through ``ingest()``."""

from __future__ import annotations

import gzip
import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import storeread
from loggen import ENGINE_ID, kv_metrics, vllm_line
from tracegen import dropped_record, engine_record, release_record, transfer_records

from hybridtrace import trace_v1
from hybridtrace.ingest.run import ingest

T0 = datetime(2026, 4, 21, 10, 0, 0, tzinfo=UTC).timestamp()


def write(path: Path, text: str | bytes, mtime: float = T0 + 86400) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.utime(path, (mtime, mtime))
    return path


def rows(store: Path, sql: str) -> list[tuple]:
    return storeread.rows(store, sql)


# --- impossible log stamps --------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["02-30 10:05:31", "13-01 10:05:31", "00-10 10:05:31", "04-21 25:61:61",
                                   "04-31 10:05:31", "04-21 23:60:00", "04-21 23:59:60"])  # fmt: skip
def test_an_impossible_log_stamp_is_a_reject_and_the_lines_around_it_are_read(tmp_path, stamp):
    lines = [
        vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp="04-21 10:00:00"),
        kv_metrics(24, 12.4, 55.922, "04-21 10:05:21"),
        kv_metrics(25, 12.4, 55.922, stamp),
        kv_metrics(26, 12.4, 55.922, "04-21 10:05:41"),
        vllm_line("something odd", level="WARNING", stamp=stamp),
        vllm_line("something odd", level="WARNING", stamp="04-21 10:06:00"),
        kv_metrics(27, 12.4, 55.922, stamp.replace("10:05:31", "10:09:00")),
    ]
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    summary = ingest([tmp_path / "in"], tmp_path / "s", year=2026)
    assert summary.duplicates == 0
    got = rows(tmp_path / "s", "SELECT transfers, end_ts, day FROM intervals ORDER BY line_number")
    day = datetime(2026, 4, 21).date()
    assert got == [
        (24, datetime(2026, 4, 21, 10, 5, 21, tzinfo=UTC).timestamp(), day),
        (26, datetime(2026, 4, 21, 10, 5, 41, tzinfo=UTC).timestamp(), day),
    ]
    # the year is not thrown off by a month that does not exist
    assert rows(tmp_path / "s", "SELECT line_number, ts, day FROM log_events") == [
        (6, datetime(2026, 4, 21, 10, 6, tzinfo=UTC).timestamp(), day)
    ]
    rejects = rows(tmp_path / "s", "SELECT line_number, reason, raw FROM rejects ORDER BY line_number")
    assert [r[:2] for r in rejects] == [
        (n, f"time stamp is not a date and time: {stamp.split()[0]} {t}")
        for n, t in (
            (3, stamp.split()[1]),
            (5, stamp.split()[1]),
            (7, stamp.replace("10:05:31", "10:09:00").split()[1]),
        )
    ]
    assert all(r[2].startswith("(") for r in rejects)
    assert rows(tmp_path / "s", "SELECT lines, rejects, duplicates FROM sources") == [(7, 3, 0)]


def test_february_29_is_a_date_only_in_a_leap_year(tmp_path):
    line = vllm_line("something odd", level="WARNING", stamp="02-29 10:00:00")
    write(tmp_path / "in" / "a" / "vllm.log", line + "\n")
    write(tmp_path / "in" / "b" / "vllm.log", line + "\n")
    ingest([tmp_path / "in" / "a"], tmp_path / "leap", year=2028)
    assert rows(tmp_path / "leap", "SELECT ts FROM log_events") == [
        (datetime(2028, 2, 29, 10, tzinfo=UTC).timestamp(),)
    ]
    ingest([tmp_path / "in" / "b"], tmp_path / "plain", year=2027)
    assert rows(tmp_path / "plain", "SELECT count(*) FROM log_events") == [(0,)]
    assert rows(tmp_path / "plain", "SELECT reason FROM rejects") == [
        ("time stamp is not a date and time: 02-29 10:00:00 in 2027",)
    ]


def test_an_impossible_collector_stamp_is_a_reject(tmp_path):
    good = vllm_line("odd", level="WARNING", stamp="05-01 22:45:49")
    lines = ["2026-02-30T22:45:49.213Z " + good, "2026-05-01T22:45:49.213Z " + good.replace("odd", "fine")]
    write(tmp_path / "in" / "x" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT message FROM log_events") == [("fine",)]
    assert rows(tmp_path / "s", "SELECT line_number, reason FROM rejects") == [
        (1, "time stamp is not a date and time: 2026-02-30T22:45:49.213Z")
    ]


# --- distinct KV Transfer metrics lines of one second -------------------------------------


def _kv_033(n: int, failed: int, stamp: str) -> str:
    """A `KV Transfer metrics` line as vLLM 0.33's stats logger writes it."""
    message = (
        f"KV Transfer metrics: Num successful transfers={n}, Avg xfer time (ms)=9.862, "
        "P90 xfer time (ms)=9.862, Avg post time (ms)=5.693, P90 post time (ms)=5.693, "
        "Avg MB per transfer=70.0, "
        f"Throughput (MB/s)=7097.952, Avg number of descriptors=56.0, Num failed transfers={failed}, "
        "Num KV expired reqs=0, Num notifs after expiry=0"
    )
    return vllm_line(message, stamp=stamp, where="metrics.py:108", process="MainProcess pid=17951")


def test_distinct_kv_lines_of_one_second_are_all_intervals_and_a_reread_adds_none(tmp_path):
    lines = [vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp="12-01 19:02:00")]
    lines += [_kv_033(n, failed, "12-01 19:03:00") for n, failed in ((3, 0), (5, 1), (0, 2), (7, 0))]
    lines.append(_kv_033(2, 0, "12-01 19:03:10"))
    log = write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    summary = ingest([tmp_path / "in"], tmp_path / "s", year=2026)
    assert summary.duplicates == 0 and summary.rows["intervals"] == 5
    store = tmp_path / "s"
    got = rows(
        store, "SELECT transfers, failed_transfers, start_ts, end_ts FROM intervals ORDER BY line_number"
    )
    t = datetime(2026, 12, 1, 19, 3, tzinfo=UTC).timestamp()
    assert [r[:2] for r in got] == [(3, 0), (5, 1), (0, 2), (7, 0), (2, 0)]
    assert [r[3] for r in got] == [t] * 4 + [t + 10]
    # each interval starts where the one logged before it ended, the first where nothing says
    assert [r[2] for r in got] == [None, t, t, t, t]
    # the views add up over every line: the counters and the report's timeline
    assert rows(store, "SELECT failed_counted FROM _counted_events") == [(3,)]
    assert rows(store, "SELECT transfers, failed_transfers FROM report_intervals ORDER BY end_ts") == [
        (15, 3),
        (2, 0),
    ]
    # a rotated copy and a re-read of the same lines add nothing
    write(tmp_path / "in" / "d" / "vllm.log.1.gz", gzip.compress(log.read_bytes()))
    summary = ingest([tmp_path / "in"], tmp_path / "s", year=2026)
    assert summary.duplicates == 6 and summary.rows.get("intervals", 0) == 0  # and the engine's row
    assert rows(store, "SELECT count(*) FROM intervals") == [(5,)]
    assert rows(store, "SELECT sum(duplicates) FROM sources WHERE uri LIKE '%.gz'") == [(6,)]


# --- non-finite numbers -------------------------------------------------------------------

_FLOAT_FIELDS = sorted(
    {(r.name, f.name) for r in trace_v1.RECORD_TYPES.values() for f in r.fields if f.type == "float64"}
)
_NON_FINITE = [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e999", "inf"), ("-1e999", "-inf"),
]  # fmt: skip


def _base_records() -> dict[str, dict]:
    return {
        "engine": engine_record("decode-0", "decode", 2),
        "transfer": transfer_records(1)[0],
        "request": transfer_records(1)[-1],
        "release": release_record("prefill-0", "p-1", T0 + 30),
        "dropped": dropped_record("decode-0", 3, T0 + 40),
    }


def test_non_finite_numbers_in_a_trace_are_rejects_on_every_path(tmp_path):
    import duckdb

    from hybridtrace.ingest.trace import fast_parse, parse_trace

    bases = _base_records()
    good = [json.dumps(r) for r in bases.values()]
    bad, expected = [], []
    for rtype, name in _FLOAT_FIELDS:
        for literal, shown in _NON_FINITE:
            item = {**bases[rtype], name: 0.5}
            bad.append(json.dumps(item).replace(f'"{name}": 0.5', f'"{name}": {literal}'))
            expected.append(f"{name} is not a finite number: {shown}")
    lines = [line.encode() for line in [*good, *bad]]
    tables, rejects = parse_trace(duckdb.connect(), lines, 1, "src")
    reasons = dict(zip(rejects["line_number"].to_pylist(), rejects["reason"].to_pylist(), strict=True))
    assert sum(t.num_rows for t in tables.values()) == len(good)
    assert [reasons.get(n) for n in range(len(good) + 1, len(lines) + 1)] == expected
    # the standard library's reader takes NaN and Infinity too: validate names the same problem
    for line, reason in zip(bad, expected, strict=True):
        assert trace_v1.validate(json.loads(line))[:1] == [reason], line
    for item in bases.values():
        assert trace_v1.validate(item) == []
        assert trace_v1.validate({**item, "ts": float("nan")})[0] == "ts is not a finite number: nan"
    # the fast path takes none of them
    for line in bad:
        assert fast_parse(b"\n".join([*lines[: len(good)], line.encode()]), 1, len(good) + 1, "src") is None
    # and through ingest: every bad line a reject, every good one read
    write(tmp_path / "in" / "d" / "trace.jsonl", "\n".join([*good, *bad]) + "\n")
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.rejects == len(bad)
    assert rows(tmp_path / "s", "SELECT count(*) FROM transfers WHERE NOT isfinite(xfer_s)") == [(0,)]


def _kv(**values: str) -> str:
    fields = {"Num successful transfers": "24", "Avg xfer time (ms)": "12.4", "P90 xfer time (ms)": "15.871",
              "Avg post time (ms)": "0.942", "P90 post time (ms)": "1.307", "Avg MB per transfer": "55.922",
              "Throughput (MB/s)": "4509.829", "Avg number of descriptors": "2496.0"}  # fmt: skip
    fields.update(values)
    return "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in fields.items())


def test_non_finite_numbers_in_a_kv_line_are_rejects_but_vllms_own_inf_throughput_is_read(tmp_path):
    messages = [
        _kv(**{"Avg xfer time (ms)": "1e999999"}),
        _kv(**{"Avg MB per transfer": "nan"}),
        _kv(**{"P90 post time (ms)": "-inf"}),
        _kv(**{"Throughput (MB/s)": "1e999"}),
        # numpy's sum of transfer times can be 0 (NIXL counts whole microseconds): vLLM then
        # prints the throughput as inf, or nan with no bytes; the line is real, the ratio unknown
        _kv(**{"Avg xfer time (ms)": "0.0", "Throughput (MB/s)": "inf"}),
        _kv(**{"Avg xfer time (ms)": "0.0", "Avg MB per transfer": "0.0", "Throughput (MB/s)": "nan"}),
        # the MultiConnector form prints the dict's repr, where inf and nan are bare words
        "KV Transfer metrics: NixlConnector={'Num successful transfers': 2, 'Avg xfer time (ms)': 0.0, "
        "'Avg MB per transfer': 14.0, 'Throughput (MB/s)': inf, 'Avg number of descriptors': 56.0}",
        "KV Transfer metrics: NixlConnector={'Num successful transfers': 2, 'Avg xfer time (ms)': nan}",
    ]
    lines = [
        vllm_line(m, stamp=f"04-21 10:{10 + i}:00", where="metrics.py:103", process="APIServer pid=1")
        for i, m in enumerate(messages)
    ]
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    got = rows(tmp_path / "s", "SELECT line_number, transfers, avg_xfer_s, throughput_mib_s FROM intervals "
                               "ORDER BY line_number")  # fmt: skip
    assert got == [(5, 24, 0.0, None), (6, 24, 0.0, None), (7, 2, 0.0, None)]
    rejects = rows(tmp_path / "s", "SELECT line_number, reason FROM rejects ORDER BY line_number")
    assert rejects == [(n, "KV Transfer metrics line whose fields do not parse") for n in (1, 2, 3, 4, 8)]


def test_prometheus_non_finite_values_are_read_where_the_format_allows_them(tmp_path):
    lines = [
        "# TYPE vllm:nixl_xfer_time_seconds histogram",
        'vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.5"} 2',
        'vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf"} 3',  # the last bucket's bound
        'vllm:nixl_xfer_time_seconds_count{engine="0"} 3',
        'vllm:nixl_xfer_time_seconds_sum{engine="0"} 0.7',
        'agent_xfer_time{hostname="h",agent_name="a"} NaN',  # a gauge may say NaN
        'agent_rx_last_bytes{hostname="h",agent_name="a"} +Inf',
        'agent_xfer_post_time{hostname="h",agent_name="a"} Nan',  # prometheus-cpp spells it so
        # counters become deltas and sums: they must be finite
        'vllm:nixl_num_failed_transfers_total{engine="0"} NaN',
        'vllm:nixl_num_kv_expired_reqs_total{engine="0"} +Inf',
        'vllm:nixl_xfer_time_seconds_sum{engine="1"} -Inf',
        'vllm:nixl_xfer_time_seconds_count{engine="1"} NaN',
        'vllm:nixl_xfer_time_seconds_bucket{engine="1",le="1"} +Inf',
        'vllm:nixl_num_failed_transfers_created{engine="0"} NaN',
        # a bucket bound is a number or +Inf
        'vllm:nixl_xfer_time_seconds_bucket{engine="2",le="NaN"} 1',
        'vllm:nixl_xfer_time_seconds_bucket{engine="2",le="-Inf"} 1',
        'vllm:nixl_xfer_time_seconds_bucket{engine="2",le="fast"} 1',
        # a number too large for a double is no number, in any field
        'vllm:nixl_num_failed_transfers_total{engine="3"} 1e999',
        'agent_xfer_time{hostname="h",agent_name="b"} -1e999',
        'vllm:nixl_xfer_time_seconds_bucket{engine="3",le="1e999"} 1',
    ]
    write(tmp_path / "in" / "x" / "m-20260421T100010Z.prom", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    kept = rows(tmp_path / "s", "SELECT line_number, le, value FROM prom_samples ORDER BY line_number")
    assert [k[0] for k in kept] == [2, 3, 4, 5, 6, 7, 8]
    assert kept[1][1] == math.inf and math.isnan(kept[4][2]) and kept[5][2] == math.inf
    rejects = rows(tmp_path / "s", "SELECT line_number, reason FROM rejects ORDER BY line_number")
    assert rejects == [
        (9, "counter value is not a finite number: NaN"),
        (10, "counter value is not a finite number: +Inf"),
        (11, "counter value is not a finite number: -Inf"),
        (12, "counter value is not a finite number: NaN"),
        (13, "counter value is not a finite number: +Inf"),
        (14, "counter value is not a finite number: NaN"),
        (15, "bucket bound is not a number or +Inf: NaN"),
        (16, "bucket bound is not a number or +Inf: -Inf"),
        (17, "bucket bound is not a number or +Inf: fast"),
        (18, "value too large for a double: 1e999"),
        (19, "value too large for a double: -1e999"),
        (20, "bucket bound is not a number or +Inf: 1e999"),
    ]


# --- malformed Prometheus labels ----------------------------------------------------------


def test_prometheus_lines_the_exposition_format_calls_malformed_are_rejects(tmp_path):
    lines = [
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="1"model_name="m"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="2" model_name="m"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="3",model_name="a\\qb"} 1',
        # the three escapes the format has
        'vllm:nixl_num_failed_transfers_total{engine="4",model_name="a\\\\qb\\n\\""} 1',
        'vllm:nixl_num_failed_transfers_total{engine="5",engine="6"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="7",} 1',  # a trailing comma is allowed
        'vllm:nixl_num_failed_transfers_total{engine="8",,model_name="m"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="9"} 1_000',
        'vllm:nixl_num_failed_transfers_total{engine="10"} 0x10',
        'vllm:nixl_num_failed_transfers_total{engine="11"} \u0661',  # another script's digit
        'other_metric{a="1"b="2"} 1',  # malformed even where hybridtrace keeps nothing
    ]
    write(tmp_path / "in" / "x" / "m-20260421T100010Z.prom", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    kept = rows(tmp_path / "s", "SELECT line_number, engine_label, model_name FROM prom_samples ORDER BY 1")
    assert kept == [(1, "0", "m"), (5, "4", 'a\\qb\n"'), (7, "7", None)]
    assert rows(tmp_path / "s", "SELECT line_number, reason FROM rejects ORDER BY line_number") == [
        (2, "missing comma between labels"),
        (3, "missing comma between labels"),
        (4, "invalid escape \\q in the value of label model_name"),
        (6, "label engine given twice"),
        (8, "not a Prometheus sample line"),
        (9, "not a Prometheus sample line"),
        (10, "not a Prometheus sample line"),
        (11, "not a Prometheus sample line"),
        (12, "missing comma between labels"),
    ]


# --- numbers of recognised log lines that their columns cannot hold ---------------------------


@pytest.mark.parametrize(
    ("message", "what"),
    [
        (_kv(**{"Num successful transfers": "99999999999999999999"}), "KV Transfer metrics"),
        (_kv(**{"Num successful transfers": "1e300"}), "KV Transfer metrics"),
        (_kv(**{"Num successful transfers": "2.5"}), "KV Transfer metrics"),
        (_kv(**{"Avg xfer time (ms)": "1.2.3"}), "KV Transfer metrics"),
        (_kv(**{"Avg xfer time (ms)": "1" * 400}), "KV Transfer metrics"),
        (_kv(**{"Num successful transfers": "\u0663"}), "KV Transfer metrics"),
        ("Setting attention block size to 99999999999999999999999 tokens to ensure that attention page size "
         "is >= mamba page size.", "attention block size"),
        ("Padding mamba page size by 1.2.3% to ensure that mamba page size and attention page size are "
         "exactly equal.", "Mamba page padding"),
        ("GPU KV cache size: ,,, tokens", "KV cache size"),
        ("Maximum concurrency for 8,192 tokens per request: 1.2.3x", "maximum concurrency"),
        ("Hybrid SSM registration: mamba_ssm_size=(99999999999999999999, 1)", "Hybrid SSM registration"),
        ("Releasing expired KV blocks for request r1 which were retrieved by 99999999999999999999 decode "
         "worker(s) within 480 seconds.", "KV expiry"),
        ("Failing 99999999999999999999 request(s) due to KV load failure (failure_policy=fail, 1 tokens "
         "affected). Request IDs: {'a'}", "KV load failure"),
        ("Recovered from KV load failure: 99999999999999999999 request(s) rescheduled (1 tokens affected).",
         "KV load recovery"),
        ("Transfer plan: TransferTopology(tp_ratio=1, local_tp=0, remote_tp=2)", "transfer plan"),
        ("Transfer plan: TransferTopology(tp_ratio=1, local_tp=99999999999, remote_tp=2)", "transfer plan"),
        ("Engine 000: Avg prompt throughput: 1.2.3 tokens/s, Avg generation throughput: 1.0 tokens/s",
         "Engine throughput"),
    ],
)  # fmt: skip
def test_a_number_a_column_cannot_hold_is_a_reject_not_a_crash(tmp_path, message, what):
    lines = [
        vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp="04-21 10:00:00"),
        vllm_line(message, level="WARNING", process="Worker_TP1 pid=306", stamp="04-21 10:00:01"),
        kv_metrics(24, 12.4, 55.922, "04-21 10:00:02"),
    ]
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    reason = "Engine throughput line whose fields do not parse" if what == "Engine throughput" else (
        f"{what} line whose fields do not parse"
    )
    assert rows(tmp_path / "s", "SELECT line_number, reason FROM rejects") == [(2, reason)]
    assert rows(tmp_path / "s", "SELECT transfers FROM intervals") == [(24,)]
    assert rows(tmp_path / "s", "SELECT count(*) FROM log_events WHERE line_number = 2") == [(0,)]


def test_odd_process_ranks_and_failure_contexts_are_read_without_a_crash(tmp_path):
    context = "{'request_id': ['a', 1], 'remote_engine_id': 7, (1, 2): {3, 4}, 'x': float('nan')}"
    lines = [
        vllm_line("odd", level="WARNING", process="Worker_TP99999999999 pid=1"),
        vllm_line("odd", level="WARNING", process="VllmWorker rank=99999999999999999999 pid=1"),
        vllm_line("NIXL transfer failure: transfer_failed | Context: {'request_id': ['a', 1], "
                  "'remote_engine_id': 7, (1, 2): {3, 4}, 'y': 1e999}", level="ERROR"),
        vllm_line(f"NIXL transfer failure: transfer_failed | Context: {context}", level="ERROR"),
    ]  # fmt: skip
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    sql = "SELECT line_number, kind, rank, request_id, remote_engine_id, details FROM log_events ORDER BY 1"
    events = rows(tmp_path / "s", sql)
    assert [e[:5] for e in events] == [(1, "warning", None, None, None), (2, "warning", None, None, None),
                                       (3, "transfer_failed", 0, None, "7")]  # fmt: skip
    assert json.loads(events[2][5])["y"] == "inf"  # JSON holds no infinity: said as text
    # a context with a call in it is no literal: a reject, never evaluated
    assert rows(tmp_path / "s", "SELECT line_number, reason FROM rejects") == [
        (4, "NIXL transfer failure whose context does not parse")
    ]
    assert rows(tmp_path / "s", "SELECT tp_size FROM engines") == [(2,)]


# --- lines beyond the documented size -------------------------------------------------------


def test_a_trace_line_longer_than_the_limit_is_a_reject_on_both_paths(tmp_path):
    import duckdb

    from hybridtrace.ingest.limits import LINE_LIMIT
    from hybridtrace.ingest.trace import fast_parse, parse_trace

    records = [r for r in transfer_records(2) if r["type"] == "transfer"][:3]
    lines = [json.dumps(r) for r in records]
    lines[1] = json.dumps({**records[1], "link": "x" * LINE_LIMIT})  # over the limit
    pad = LINE_LIMIT - len(json.dumps({**records[2], "link": ""}))
    lines[2] = json.dumps({**records[2], "link": "y" * pad})  # exactly at it: read
    assert len(lines[1]) > LINE_LIMIT and len(lines[2]) == LINE_LIMIT
    block = "\n".join(lines).encode()
    assert fast_parse(block, 1, len(lines), "src") is None
    assert fast_parse("\n".join([lines[0], lines[2]]).encode(), 1, 2, "src") is not None
    tables, rejects = parse_trace(duckdb.connect(), [line.encode() for line in lines], 1, "src")
    assert rejects.to_pylist() == [
        {"line_number": 2, "reason": f"line longer than {LINE_LIMIT} bytes", "raw": lines[1][:512]}
    ]
    assert tables["transfers"]["line_number"].to_pylist() == [1, 3]
    write(tmp_path / "in" / "d" / "trace.jsonl", block + b"\n")
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.rejects == 1 and summary.rows["transfers"] == 2


def test_a_log_line_longer_than_the_limit_is_read_by_its_start(tmp_path):
    from hybridtrace.ingest.limits import LINE_LIMIT

    huge = "z" * (LINE_LIMIT + 10)
    lines = [
        vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp="04-21 10:00:00"),
        vllm_line("Received request cmpl-1: prompt: '" + huge + "'", stamp="04-21 10:00:01"),  # counted only
        vllm_line("a long warning " + huge, level="WARNING", stamp="04-21 10:00:02"),  # still a warning
        # a line hybridtrace reads, read only in part, could say what it does not: a reject
        vllm_line(_kv() + ", Other=" + huge, stamp="04-21 10:00:03", process="APIServer pid=1"),
        vllm_line("Failing 2 request(s) due to KV load failure (failure_policy=fail, 9 tokens affected). "
                  "Request IDs: {'" + huge + "', 'b'}", level="ERROR", stamp="04-21 10:00:04"),
        kv_metrics(24, 12.4, 55.922, "04-21 10:00:05"),
    ]  # fmt: skip
    write(tmp_path / "in" / "d" / "vllm.log", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    events = rows(tmp_path / "s", "SELECT line_number, kind, length(message) FROM log_events ORDER BY 1")
    assert events == [(3, "warning", 4096)]
    assert rows(tmp_path / "s", "SELECT line_number, transfers FROM intervals") == [(6, 24)]
    rejects = rows(tmp_path / "s", "SELECT line_number, reason, length(raw) FROM rejects ORDER BY 1")
    assert rejects == [(n, f"line longer than {LINE_LIMIT} characters", 512) for n in (4, 5)]
    assert rows(tmp_path / "s", "SELECT engine_id, lines FROM sources") == [(ENGINE_ID, 6)]


def test_a_prometheus_line_longer_than_the_limit_is_a_reject(tmp_path):
    from hybridtrace.ingest.limits import LINE_LIMIT

    lines = [
        "# TYPE vllm:nixl_num_failed_transfers_total counter",
        'vllm:nixl_num_failed_transfers_total{engine="1",model_name="m"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="' + "\\\\" * LINE_LIMIT + '"} 1',
        'vllm:nixl_num_kv_expired_reqs_total{engine="1",model_name="m"} 1',
    ]
    write(tmp_path / "in" / "x" / "m-20260421T100010Z.prom", "\n".join(lines) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT line_number FROM prom_samples ORDER BY 1") == [(2,), (4,)]
    assert rows(tmp_path / "s", "SELECT line_number, reason, length(raw) FROM rejects") == [
        (3, f"line longer than {LINE_LIMIT} characters", 512)
    ]


def test_a_blank_line_of_a_crlf_trace_is_no_reject(tmp_path):
    records = [json.dumps(r) for r in transfer_records(2)]
    text = "\r\n".join([records[0], "", records[1], " \t", *records[2:]]) + "\r\n"
    write(tmp_path / "in" / "d" / "trace.jsonl", text)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.rejects == 0 and summary.rows["transfers"] == 4 and summary.rows["requests"] == 2
    assert rows(tmp_path / "s", "SELECT line_number FROM transfers ORDER BY 1") == [(1,), (3,), (6,), (7,)]


def test_a_log_holding_only_its_init_line_files_its_tp_size_under_its_engine(tmp_path):
    # the line is the last event of the first chunk, carried to the next: its worker's rank
    # counts where the engine is known, not under the folder's name as a second engine
    line = vllm_line(f"Initializing NIXL worker {ENGINE_ID}", process="Worker_TP1 pid=306")
    write(tmp_path / "in" / "decode-0" / "vllm.log", line + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT engine_id, tp_size FROM engines") == [(ENGINE_ID, 2)]


@pytest.mark.parametrize(
    ("line", "is_trace"),
    [
        (b'{"v": 1, "type": "transfer", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", True),
        (b'{"v": 2, "type": "transfer", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),
        (b"[" * 100_000 + b"]" * 100_000, False),
        (b'{"v": 1, "type": "transfer", "x": ' + b"[" * 100_000, False),  # cut short: no JSON at all
    ],
)
def test_a_trace_line_deeper_than_the_parser_goes_is_judged_by_its_top_level(line, is_trace):
    # looks_like_trace itself never raises on nesting, whoever calls it
    from hybridtrace.ingest.trace import looks_like_trace

    assert looks_like_trace(b"banner\n" + line + b"\n") is is_trace
