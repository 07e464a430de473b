"""Prometheus scrapes: cumulative series become per-interval deltas, resets included."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import storeread
from loggen import ENGINE_ID, vllm_line
from promgen import scrape

from hybridtrace.ingest.prometheus import time_from_name
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

T0 = datetime(2026, 4, 21, 10, 0, 0, tzinfo=UTC).timestamp()


def put(path: Path, text: str, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def rows(store: Path, sql: str) -> list[tuple]:
    return storeread.rows(store, sql)


FIRST = [(0.004, 0.0008, 50_000_000, 120)] * 3
SECOND = [*FIRST, (0.02, 0.002, 60_000_000, 150), (0.03, 0.004, 70_000_000, 180)]


def test_deltas_between_scrapes_with_counter_reset(tmp_path):
    folder = tmp_path / "in" / "decode-a"
    put(folder / "vllm.log", vllm_line(f"Initializing NIXL worker {ENGINE_ID}") + "\n", T0)
    put(folder / "metrics-20260421T100010Z.prom", scrape(FIRST), T0 + 100)
    put(folder / "metrics-20260421T100020Z.prom", scrape(SECOND, failed=1), T0 + 100)
    # the process restarted: counters start again from zero
    put(folder / "metrics-20260421T100030Z.prom", scrape([(0.06, 0.001, 10_000_000, 40)]), T0 + 100)
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.by_format["prometheus"] == 3
    got = rows(
        tmp_path / "s",
        "SELECT start_ts, end_ts, engine_id, transfers, avg_xfer_s, p90_xfer_s, avg_post_s, "
        "transported_bytes, "
        "avg_mib_per_transfer, avg_descriptors, failed_transfers FROM intervals "
        "WHERE source_kind = 'prometheus' ORDER BY end_ts",
    )
    assert len(got) == 2  # the first scrape has nothing to subtract from
    second, third = got
    assert second[:4] == (T0 + 10, T0 + 20, ENGINE_ID, 2)
    assert second[4] == pytest.approx((0.02 + 0.03) / 2)
    assert second[5] == 0.05  # 90% of the interval's transfers fall at or below the 0.05 s bucket
    assert second[6] == pytest.approx(0.003)
    assert second[7] == 130_000_000
    assert second[8] == pytest.approx(130_000_000 / 2**20 / 2)
    assert second[9] == pytest.approx(165.0)
    assert second[10] == 1
    assert third[3] == 1 and third[7] == 10_000_000 and third[10] == 0  # reset: the new value is the delta


def test_snapshot_time_sources(tmp_path):
    assert time_from_name("metrics-20260421T100010Z.prom") == T0 + 10
    assert time_from_name("scrape.1776765610.txt") == 1776765610.0
    assert time_from_name("metrics.prom") is None
    folder = tmp_path / "in" / "x"
    stamp_ms = int((T0 + 5) * 1000)
    put(folder / "a.prom", scrape(FIRST, timestamp_ms=stamp_ms), T0 + 999)
    put(folder / "b.prom", scrape(FIRST), T0 + 777)  # no stamp anywhere: mtime
    ingest([tmp_path / "in"], tmp_path / "s")
    stamps = sorted({r[0] for r in rows(tmp_path / "s", "SELECT ts FROM prom_samples")})
    assert stamps == [T0 + 5, T0 + 777]


def test_bad_lines_are_rejects_and_rescrape_adds_nothing(tmp_path):
    folder = tmp_path / "in" / "x"
    body = scrape(FIRST) + 'vllm:nixl_num_failed_transfers_total{engine="0" 3\nthis is not a sample\n'
    put(folder / "metrics-20260421T100010Z.prom", body, T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    reasons = rows(tmp_path / "s", "SELECT reason FROM rejects")
    assert reasons == [("not a Prometheus sample line",)] * 2
    before = rows(tmp_path / "s", "SELECT count(*) FROM prom_samples")[0][0]
    assert before > 0
    put(tmp_path / "in" / "x" / "copy-20260421T100010Z.prom", scrape(FIRST), T0)  # same scrape, another name
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.duplicates == before


def test_nixl_agent_counters_become_deltas(tmp_path):
    folder = tmp_path / "in" / "p"
    labels = 'hostname="h1",agent_name="3f2a"'
    for n, (rx, reqs) in enumerate([(1000, 2), (5000, 6), (700, 1)]):  # the last one after a restart
        body = f"# TYPE agent_rx_bytes_total counter\nagent_rx_bytes_total{{{labels}}} {rx}\n"
        body += f"agent_rx_requests_num_total{{{labels}}} {reqs}\n"
        put(folder / f"nixl-20260421T10000{n}Z.prom", body, T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    got = rows(tmp_path / "s", "SELECT metric, ts, delta FROM prom_deltas ORDER BY metric, ts")
    assert got == [
        ("agent_rx_bytes_total", T0 + 1, 4000.0),
        ("agent_rx_bytes_total", T0 + 2, 700.0),
        ("agent_rx_requests_num_total", T0 + 1, 4.0),
        ("agent_rx_requests_num_total", T0 + 2, 1.0),
    ]


def test_sample_timestamps_in_either_unit_and_several_scrapes_in_one_file(tmp_path):
    assert time_from_name("metrics-1776765610000.prom") == 1776765610.0  # epoch milliseconds
    folder = tmp_path / "in" / "x"
    # one file holding three scrapes, each sample stamped in milliseconds
    dump = "".join(scrape(FIRST, timestamp_ms=int((T0 + k * 15) * 1000)) for k in range(3))
    put(folder / "dump.prom", dump, T0 + 999)
    # OpenMetrics stamps in seconds, whole or fractional
    om = (
        'vllm:nixl_num_failed_transfers_total{engine="0"} 2 1776765700\n'
        'vllm:nixl_num_kv_expired_reqs_total{engine="0"} 1 1776765700.5\n# EOF\n'
    )
    put(folder / "om.prom", om, T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    stamps = [r[0] for r in rows(tmp_path / "s", "SELECT DISTINCT ts FROM prom_samples ORDER BY ts")]
    assert stamps == [T0, T0 + 15, T0 + 30, 1776765700.0, 1776765700.5]
    assert rows(tmp_path / "s", "SELECT count(*) FROM rejects") == [(0,)]


def test_a_sample_stamped_in_nanoseconds_is_a_reject_and_the_rest_is_read(tmp_path):
    bad = (
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1.0 1776765610000000000\n'
        'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 1.0\n'
    )
    put(tmp_path / "in" / "p" / "metrics.prom", bad, T0)
    put(tmp_path / "in" / "q" / "metrics.prom", scrape(FIRST), T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT line_number, reason FROM rejects") == [
        (1, "sample timestamp out of range (epoch milliseconds expected)")
    ]
    folders = "SELECT count(DISTINCT regexp_extract(instance, '[^/]+$')) FROM prom_samples"
    assert rows(tmp_path / "s", folders) == [(2,)]


def test_label_values_keep_their_characters(tmp_path):
    line = 'vllm:nixl_num_failed_transfers_total{engine="0",model_name="caf\u00e9 \\"q\\" a\\\\b"} 1\n'
    text = "# TYPE vllm:nixl_num_failed_transfers counter\n" + line * 2
    put(tmp_path / "in" / "x" / "m-20260421T100010Z.prom", text, T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    assert rows(tmp_path / "s", "SELECT DISTINCT model_name FROM prom_samples") == [('caf\u00e9 "q" a\\b',)]


def test_a_scrape_rewritten_in_place_is_read_again_whole(tmp_path):
    path = tmp_path / "in" / "x" / "latest.prom"
    put(path, scrape(FIRST, timestamp_ms=int(T0 * 1000)), T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    put(path, scrape(SECOND, timestamp_ms=int((T0 + 10) * 1000)), T0 + 10)  # same preamble, longer
    summary = ingest([tmp_path / "in"], tmp_path / "s")
    assert summary.rejects == 0
    assert rows(tmp_path / "s", "SELECT count(DISTINCT ts) FROM prom_samples") == [(2,)]


def test_padding_layers_that_crossed_are_padding_not_a_mystery(tmp_path):
    folder = tmp_path / "in" / "decode-a"
    log = vllm_line(f"Initializing NIXL worker {ENGINE_ID}") + "\n"
    put(folder / "vllm.log", log + vllm_line("ready", process="Worker_TP1 pid=306") + "\n", T0)
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    block, padded, layers = rows(
        tmp_path / "s",
        "SELECT block_tokens * attention_bytes_per_token, mamba_padded_page_bytes * recurrent_layers, "
        "mamba_padded_page_bytes * padding_layers FROM engine_models",
    )[0]
    assert layers > 0  # Nemotron Nano at TP 2: 28 Mamba layers in groups of 6, so 2 padding layers
    read = (0.004, 0.0008, 3 * block + padded + layers, 120)  # every read sent whole state groups
    put(folder / "metrics-20260421T100010Z.prom", scrape([read] * 2), T0 + 100)
    put(folder / "metrics-20260421T100020Z.prom", scrape([read] * 12), T0 + 100)
    ingest([tmp_path / "in"], tmp_path / "s")
    verdicts = rows(tmp_path / "s", "SELECT verdict, padded_reads, with_padding_layers FROM interval_bytes")
    assert verdicts == [("padded", 10, True)]
    con = Store(tmp_path / "s").connect()
    from hybridtrace.analyze import analyze

    leaks = [f for f in analyze(con).findings if f["kind"] == "padding_leak"]
    assert len(leaks) == 1 and leaks[0]["message"].endswith("padding layers included")


def test_two_runs_folders_of_one_name_are_two_instances(tmp_path):
    for day, start in (("0421", T0), ("0422", T0 + 86_400)):
        folder = tmp_path / "in" / day / "decode-0"
        put(folder / "vllm.log", vllm_line(f"Initializing NIXL worker engine-{day}") + "\n", start)
        put(folder / "a.prom", scrape(FIRST, timestamp_ms=int(start * 1000)), start)
        put(folder / "b.prom", scrape(SECOND, timestamp_ms=int((start + 10) * 1000)), start + 10)
    ingest([tmp_path / "in"], tmp_path / "s")
    got = rows(tmp_path / "s", "SELECT engine_id, end_ts - start_ts, transfers FROM intervals "
                               "WHERE source_kind = 'prometheus' ORDER BY end_ts")  # fmt: skip
    # one interval per run, each on its own engine; nothing spans the day between them
    assert got == [("engine-0421", 10.0, 2), ("engine-0422", 10.0, 2)]


def test_a_restart_resets_every_series_of_the_process(tmp_path):
    folder = tmp_path / "in" / "decode-a"
    before = [(0.004, 0.0008, 10_000_000, 120)] * 10
    # after the restart fewer reads, but bigger ones: the bytes sum rose while the count fell
    after = [(0.004, 0.0008, 90_000_000, 120)] * 4
    put(folder / "metrics-20260421T100010Z.prom", scrape(before), T0)
    put(folder / "metrics-20260421T100020Z.prom", scrape(after), T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    got = rows(tmp_path / "s", "SELECT transfers, transported_bytes FROM intervals "
                               "WHERE source_kind = 'prometheus'")  # fmt: skip
    assert got == [(4, 4 * 90_000_000)]


def test_a_changed_created_time_is_a_restart_even_when_counts_grew(tmp_path):
    folder = tmp_path / "in" / "decode-a"
    created = 'vllm:nixl_xfer_time_seconds_created{engine="0",model_name="nemotron-nano"} {}\n'
    put(folder / "metrics-20260421T100010Z.prom", scrape(FIRST) + created.replace("{}", str(T0 - 50)), T0)
    # restarted at T0 + 5, and by the next scrape already past the old counts
    put(folder / "metrics-20260421T100020Z.prom", scrape(SECOND) + created.replace("{}", str(T0 + 5)), T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    got = rows(tmp_path / "s", "SELECT transfers FROM intervals WHERE source_kind = 'prometheus'")
    assert got == [(len(SECOND),)]


def test_a_federated_scrape_keeps_its_servers_apart(tmp_path):
    # one /federate file per time holding two pods; the prefill pod restarts in between
    def sample(pod: str, metric: str, value: float, t: int) -> str:
        labels = f'engine="0",instance="{pod}:8000",job="vllm",model_name="m",pod="{pod}"'
        return f"vllm:{metric}{{{labels}}} {value} {(1776765600 + t) * 1000}\n"

    for t, (count, expired) in ((10, (100, 10)), (20, (124, 1))):
        text = "# TYPE vllm:nixl_xfer_time_seconds histogram\n"
        text += sample("decode-0", "nixl_xfer_time_seconds_count", count, t)
        text += sample("decode-0", "nixl_num_kv_expired_reqs_total", 0, t)
        text += sample("prefill-0", "nixl_xfer_time_seconds_count", 0, t)
        text += sample("prefill-0", "nixl_num_kv_expired_reqs_total", expired, t)
        put(tmp_path / "in" / "fed" / f"federate-{t}.prom", text, T0)
    ingest([tmp_path / "in"], tmp_path / "s")
    got = rows(tmp_path / "s", "SELECT process, transfers, expired_requests FROM intervals ORDER BY process")
    assert got == [
        ("engine=0 pod=decode-0,instance=decode-0:8000,job=vllm", 24, 0),  # not reset by the other pod
        ("engine=0 pod=prefill-0,instance=prefill-0:8000,job=vllm", 0, 1),  # its own restart
    ]
