"""TensorRT-LLM's and SGLang's figures in the accounting: SGLang's per-rank transfer histograms as
intervals beside vLLM's pooled ones, vLLM's allocator counts left null for other engines, and an
engine the byte model cannot size left unjudged with the reason said.

The scrapes follow SGLang's metrics collector (``python/sglang/srt/metrics/collector.py``): the
``sglang:kv_transfer_latency_ms``, ``…_total_mb``, ``…_speed_gb_s``, ``…_bootstrap_ms`` and
``…_alloc_ms`` histograms (latency buckets 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000 ms)
and the ``sglang:num_transfer_failed_reqs_total`` counter, labelled per scheduler with
``tp_rank``, ``pp_rank`` (and ``dp_rank``), as prometheus_client prints them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from promgen import scrape as vllm_scrape
from test_sglang import prefill_stats_newest, req_line

from hybridtrace.analyze import analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

CASES = Path(__file__).resolve().parent / "cases"
LATENCY_BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000]
MB_BUCKETS = [1, 4, 16, 64, 256, 1024]
SPEED_BUCKETS = [0.1, 0.5, 1, 5, 10, 50, 100]


def _histogram(name: str, bounds: list[float], values: list[float], labels: str, ms: int) -> list[str]:
    lines = [f"# HELP {name} histogram", f"# TYPE {name} histogram"]
    for bound in bounds:
        count = sum(1 for v in values if v <= bound)
        lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(count)} {ms}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(len(values))} {ms}')
    lines.append(f"{name}_count{{{labels}}} {float(len(values))} {ms}")
    lines.append(f"{name}_sum{{{labels}}} {float(sum(values))} {ms}")
    return lines


def sglang_scrape(ranks: dict[int, dict[str, list[float]]], ms: int, filler: int = 0) -> str:
    """A cumulative SGLang /metrics scrape: per TP rank, every transfer observed so far
    (latency_ms, total_mb, speed, bootstrap_ms, alloc_ms lists) and its failed count;
    ``filler`` other gauges first, as a server with many metrics prints them."""
    lines = ["# HELP sglang:num_running_reqs The number of running requests.",
             "# TYPE sglang:num_running_reqs gauge"]  # fmt: skip
    lines += [f'sglang:num_running_reqs{{engine_type="prefill",model_name="m",slot="{i}"}} 0.0'
              for i in range(filler)]  # fmt: skip
    for rank, seen in ranks.items():
        labels = f'engine_type="prefill",model_name="nemotron",pp_rank="0",tp_rank="{rank}",dp_rank="0"'
        lines += _histogram("sglang:kv_transfer_latency_ms", LATENCY_BUCKETS, seen["latency"], labels, ms)
        lines += _histogram("sglang:kv_transfer_total_mb", MB_BUCKETS, seen["mb"], labels, ms)
        lines += _histogram("sglang:kv_transfer_speed_gb_s", SPEED_BUCKETS, seen["speed"], labels, ms)
        lines += _histogram("sglang:kv_transfer_bootstrap_ms", LATENCY_BUCKETS, seen["bootstrap"], labels, ms)
        lines += _histogram("sglang:kv_transfer_alloc_ms", LATENCY_BUCKETS, seen["alloc"], labels, ms)
        lines.append(f"sglang:num_transfer_failed_reqs_total{{{labels}}} {float(seen['failed'])} {ms}")
    return "\n".join(lines) + "\n"


T0_MS = 1776765600000
FIRST = {
    0: {"latency": [4, 30], "mb": [10.0, 20.0], "speed": [2.44, 0.65], "bootstrap": [2, 2],
        "alloc": [0.5, 0.5], "failed": 0},
    1: {"latency": [6], "mb": [15.0], "speed": [2.44], "bootstrap": [2], "alloc": [0.5], "failed": 0},
}  # fmt: skip
# ten seconds on: rank 0 finished two more transfers and failed one; rank 1 did nothing
SECOND = {
    0: {"latency": [4, 30, 8, 400], "mb": [10.0, 20.0, 40.0, 5.0], "speed": [2.44, 0.65, 4.88, 0.01],
        "bootstrap": [2, 2, 3, 5], "alloc": [0.5, 0.5, 1, 1], "failed": 1},
    1: FIRST[1],
}  # fmt: skip

COLUMNS = (
    "engine_id, tp_rank, pp_rank, dp_rank, start_ts, end_ts, transfers, avg_latency_s, p90_latency_s, "
    "transported_bytes, avg_mib_per_transfer, throughput_mib_s, avg_reported_gib_s, avg_bootstrap_s, "
    "avg_alloc_s, failed_transfers, failed_bootstraps"
)


def _rank_rows(store: Path) -> list[tuple]:
    con = Store(store).connect()
    sql = f"SELECT {COLUMNS} FROM sglang_rank_intervals ORDER BY engine_id, tp_rank, end_ts"
    return con.sql(sql).fetchall()


# By hand, rank 0 between the scrapes: the two new transfers (8 ms and 400 ms):
#   transfers 2; latency (8 + 400) / 2 = 204 ms; bucket growth le=10: 1 … le=250: 1, le=500: 2, so
#   the 90th percentile (1.8 of 2) is in the 500 ms bucket; 40.0 + 5.0 = 45 MiB = 47,185,920 B,
#   22.5 MiB each, 45 / 0.408 s = 110.294… MiB/s; speeds (4.88 + 0.01) / 2 = 2.445 GiB/s;
#   bootstrap (3 + 5) / 2 = 4 ms, alloc (1 + 1) / 2 = 1 ms; one failed transfer.
# Rank 1 grew by nothing: an interval with 0 transfers and no means.
RANK_0 = ("sglang-p0", 0, 0, 0, 1776765600.0, 1776765610.0, 2, 0.204, 0.5, 47185920, 22.5,
          45 / 0.408, 2.445, 0.004, 0.001, 1, None)  # fmt: skip
RANK_1 = ("sglang-p0", 1, 0, 0, 1776765600.0, 1776765610.0, 0, None, None, 0, None, None, None, None,
          None, 0, None)  # fmt: skip


def _same(got: list[tuple], want: list[tuple]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w), (g, w)
        for a, b in zip(g, w, strict=True):
            numbers = isinstance(b, float) and isinstance(a, int | float)
            assert (a == pytest.approx(b, rel=1e-12)) if numbers else a == b, (g, w)


def test_sglang_histograms_give_per_rank_intervals_beside_vllms_pooled_ones(tmp_path):
    inputs = tmp_path / "in"
    (inputs / "sglang-p0").mkdir(parents=True)
    (inputs / "sglang-p0" / "0001.prom").write_text(sglang_scrape(FIRST, T0_MS))
    (inputs / "sglang-p0" / "0002.prom").write_text(sglang_scrape(SECOND, T0_MS + 10_000))
    # a vLLM decoder's scrapes in a folder of their own: pooled, one row per scrape delta
    (inputs / "vllm-d0").mkdir()
    (inputs / "vllm-d0" / "0001.prom").write_text(vllm_scrape([(0.01, 0.001, 1000, 4)], timestamp_ms=T0_MS))
    (inputs / "vllm-d0" / "0002.prom").write_text(
        vllm_scrape([(0.01, 0.001, 1000, 4), (0.02, 0.001, 3000, 4)], timestamp_ms=T0_MS + 10_000)
    )
    store = tmp_path / "store"
    summary = ingest([inputs], store)
    assert summary.by_format == {"sglang": 2, "prometheus": 2}
    _same(_rank_rows(store), [RANK_0, RANK_1])
    con = Store(store).connect()
    assert con.sql("SELECT count(*) FROM rejects").fetchall() == [(0,)]
    # vLLM's scrape is one pooled interval; SGLang's samples are not vLLM's and add none there
    assert con.sql("SELECT engine_id, transfers, transported_bytes FROM intervals").fetchall() == [
        ("vllm-d0", 1, 3000)
    ]


def test_a_scrape_read_as_prometheus_keeps_sglangs_transfer_families(tmp_path):
    # 70 KB of other metrics before the transfer families: the format is told from the first 64 KB,
    # which name no SGLang transfer metric, so the Prometheus reader reads it; it keeps them too
    filler = 1200
    first = sglang_scrape(FIRST, T0_MS, filler=filler)
    assert first.index("sglang:kv_transfer_") > 65536
    (tmp_path / "in" / "sglang-p0").mkdir(parents=True)
    (tmp_path / "in" / "sglang-p0" / "0001.prom").write_text(first)
    (tmp_path / "in" / "sglang-p0" / "0002.prom").write_text(sglang_scrape(SECOND, T0_MS + 10_000, filler))
    store = tmp_path / "store"
    summary = ingest([tmp_path / "in"], store)
    assert summary.by_format == {"prometheus": 2}
    _same(_rank_rows(store), [RANK_0, RANK_1])


def test_vllm_allocator_counts_stay_null_for_sglang_rows(tmp_path):
    case = CASES / "finding_reported_bytes_excess" / "sglang_mamba_state_overcount"
    store = tmp_path / "store"
    ingest([case / "inputs"], store, model="nemotron-nano-12b-v2")
    con = Store(store).connect()
    # the row is in the accounting with its reported bytes, but no count sized as vLLM's allocator
    assert con.sql(
        "SELECT engine_id, transported_bytes, logical_bytes, expected_bytes, reserved_bytes, excess_bytes, "
        "padding_gap_bytes FROM transfer_bytes"
    ).fetchall() == [("sglang-mamba_dp1", 322332262, None, None, None, None, None)]
    assert con.sql("SELECT expected_bytes, reserved_bytes FROM request_bytes").fetchall() == [(None, None)]
    # the byte model's own reading of the same row
    assert con.sql("SELECT logical_bytes, expected_bytes, excess_bytes FROM reported_bytes").fetchall() == [
        (173465600, 181108736, 141223526)
    ]


def test_an_sglang_engine_of_unknown_tp_size_is_not_judged(tmp_path):
    # "TP1" in the prefix: TP rank 1 of a TP size above one that the log does not say
    (tmp_path / "in" / "sglang-tp").mkdir(parents=True)
    line = req_line("2026-04-21 10:00:01", " TP1", "r1", 7, 1001, 1, "prefill",
                    prefill_stats_newest(400 * 1024 * 1024, 0.01))  # fmt: skip
    (tmp_path / "in" / "sglang-tp" / "server.log").write_text(line + "\n")
    store = tmp_path / "store"
    ingest([tmp_path / "in"], store, model="nemotron-nano-12b-v2")
    con = Store(store).connect()
    sql = "SELECT rank, transported_bytes, logical_bytes, unsized FROM reported_bytes"
    assert con.sql(sql).fetchall() == [
        (1, 400 * 1024 * 1024, None,
         "byte model: TP size unknown (no trace engine record or worker names in the log)")
    ]  # fmt: skip
    result = analyze(con)
    assert [f for f in result.findings if f["kind"] == "reported_bytes_excess"] == []
    assert result.summary["rules"]["reported_bytes_excess"]["inputs"] == 0
