"""Handoff views: critical path, prefill time (measured or estimated), X vs R per bucket."""

from __future__ import annotations

import json

import pytest

from hybridtrace.analyze import analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = tmp_path_factory.mktemp("handoffs")
    simulate(SimOptions(seed=41, duration_s=60, bandwidth_gb_s=5.0), root / "b")
    ingest([root / "b"], root / "s")
    return Store(root / "s").connect()


def test_critical_path_is_the_slowest_read(con):
    rows = con.sql(
        """
        WITH t AS (SELECT engine_id, request_id, max(xfer_s) AS x, arg_max(rank, xfer_s) AS slowest,
                          sum(transported_bytes) AS total
                   FROM transfers WHERE status = 'ok' GROUP BY ALL)
        SELECT h.critical_path_s = t.x, h.slowest_rank = t.slowest,
               h.aggregate_bytes = t.total, h.prefill_source
        FROM handoffs h JOIN t USING (engine_id, request_id)
        """
    ).fetchall()
    assert rows and all(r[0] and r[1] and r[2] and r[3] == "measured" for r in rows)


def test_transfer_vs_recompute_matches_the_recompute_findings(con):
    # X > R per request is exactly the recompute_cheaper rule (margin 1), bucket by bucket.
    buckets = con.sql("SELECT bucket, requests, transfer_slower_share FROM transfer_vs_recompute").fetchall()
    assert sum(r[1] for r in buckets) == con.sql("SELECT count(*) FROM handoffs").fetchall()[0][0]
    slower = sum(round(r[1] * r[2]) for r in buckets)
    assert slower == con.sql("SELECT count(*) FROM finding_recompute_cheaper").fetchall()[0][0]
    assert slower > 0  # a 5 GB/s link makes some short prefixes cheaper to recompute


def test_prefill_is_estimated_from_the_peak_logged_rate_without_a_measurement(tmp_path):
    bundle = tmp_path / "b"
    simulate(SimOptions(seed=42, duration_s=30), bundle)
    trace = bundle / "decode-0" / "trace.jsonl"
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    for record in records:
        record.pop("prefill_s", None)
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    ingest([bundle], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    peak = con.sql("SELECT tokens_per_s FROM _peak_prefill_rate WHERE engine_id = 'decode-0'").fetchall()[0][
        0
    ]
    row = con.sql(
        "SELECT bool_and(prefill_source = 'estimated'), bool_and(abs(prefill_s - missing_tokens / ?) < 1e-9) "
        "FROM handoffs",
        params=[peak],
    ).fetchall()[0]
    assert row == (True, True)
    # A configured rate takes over from the estimate, and the analysis reads it from the file.
    (tmp_path / "hybridtrace.toml").write_text("[thresholds]\nprefill_tokens_per_s = 20000\n")
    analysis = analyze(con, config=str(tmp_path / "hybridtrace.toml"))
    row = con.sql(
        "SELECT bool_and(prefill_source = 'configured'), "
        "bool_and(abs(prefill_s - missing_tokens / 20000) < 1e-9) FROM handoffs"
    ).fetchall()[0]
    assert row == (True, True)
    assert analysis.summary["rules"]["recompute_cheaper"]["inputs"] > 0


def test_route_bandwidth(con):
    rows = con.sql(
        "SELECT engine_id, remote_engine_id, link, reads, effective_gb_s FROM route_bandwidth"
    ).fetchall()
    assert rows == [("decode-0", "prefill-0", "rdma:mlx5_0", rows[0][3], rows[0][4])]
    assert 1 < rows[0][4] < 5  # below the 5 GB/s link: fixed costs, posting and polling count
