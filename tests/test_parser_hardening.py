"""Parser hardening: impossible stamps, non-finite numbers, oversized lines, malformed labels,
and distinct log lines of one second, each format read through ``ingest()``."""

from __future__ import annotations

import gzip
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from loggen import ENGINE_ID, kv_metrics, vllm_line

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

T0 = datetime(2026, 4, 21, 10, 0, 0, tzinfo=UTC).timestamp()


def write(path: Path, text: str | bytes, mtime: float = T0 + 86400) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.utime(path, (mtime, mtime))
    return path


def rows(store: Path, sql: str) -> list[tuple]:
    return Store(store).connect().sql(sql).fetchall()


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
