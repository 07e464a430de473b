"""The fitted link model recovers a known link from simulated reads, also with a slow
tail, and says when descriptors cannot be told apart from bytes; the analysis' fits table
holds one fit per decode rank, pair, named link and the fleet, from the trace's reads or
else NIXL's rings."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from hybridtrace.analyze.link_fit import fit_link

FIXED, BANDWIDTH, PER_DESC = 80e-6, 20e9, 0.4e-6  # the seed's 80 µs and 20 GB/s; 0.4 µs a descriptor


def reads(n: int = 2000, *, slow_share: float = 0.0, seed: int = 3) -> pl.DataFrame:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        nbytes = rng.choice([1, 4, 16, 64, 256]) * (1 << 20) * rng.uniform(0.5, 1.5)
        # descriptor count varies at fixed bytes (block sizes differ), or the two are one
        descriptors = rng.randint(16, 20000)
        time = FIXED + nbytes / BANDWIDTH + descriptors * PER_DESC
        time *= 1 + rng.gauss(0, 0.01)  # 1% noise
        if rng.random() < slow_share:
            time *= rng.uniform(3, 20)  # a congested read, a late poll
        rows.append({"xfer_s": time, "bytes": nbytes, "descriptors": descriptors})
    return pl.DataFrame(rows)


@pytest.mark.parametrize("slow_share", [0.0, 0.02])
def test_a_known_link_is_recovered_within_five_percent(slow_share):
    fit = fit_link(reads(slow_share=slow_share))
    assert fit is not None and fit.transfers == 2000
    assert fit.fixed_s == pytest.approx(FIXED, rel=0.05)
    assert fit.bandwidth_bytes_per_s == pytest.approx(BANDWIDTH, rel=0.05)
    assert fit.per_descriptor_s == pytest.approx(PER_DESC, rel=0.05)
    assert fit.median_abs_error_pct < 2


def test_a_least_squares_line_would_be_moved_by_the_tail():
    # the contrast that makes the robust fit necessary: the mean time rises by far more than 5%
    clean, tail = reads(), reads(slow_share=0.02)
    assert tail["xfer_s"].mean() > 1.1 * clean["xfer_s"].mean()


def test_descriptors_that_grow_with_bytes_are_left_out_and_said():
    frame = reads().with_columns((pl.col("bytes") / 4096).round().alias("descriptors"))
    frame = frame.with_columns(
        (FIXED + pl.col("bytes") / BANDWIDTH + pl.col("descriptors") * PER_DESC).alias("xfer_s"))
    fit = fit_link(frame)
    assert fit.per_descriptor_s is None and "descriptors grow with bytes" in fit.note
    # one 4 KiB descriptor per 4096 bytes: the two costs add up to one effective bandwidth
    effective = 1 / (1 / BANDWIDTH + PER_DESC / 4096)
    assert fit.bandwidth_bytes_per_s == pytest.approx(effective, rel=0.01)
    assert fit.fixed_s == pytest.approx(FIXED, rel=0.05)


def test_too_few_reads_give_no_fit():
    assert fit_link(reads(5)) is None
    assert fit_link(reads(50).with_columns(pl.lit(float("nan")).alias("xfer_s"))) is None


def test_model_link_from_a_store_uses_the_fitted_link(tmp_path):
    import json
    import subprocess
    import sys

    from tracegen import engine_record, write_jsonl

    from hybridtrace.ingest.run import ingest

    records = [engine_record("decode-0", "decode", 1)]
    for i, row in enumerate(reads(200).iter_rows(named=True)):
        records.append({"type": "transfer", "v": 1, "ts": 1764400100.0 + i, "request_id": f"r{i}",
                        "engine_id": "decode-0", "remote_engine_id": "prefill-0", "rank": 0, "tp_size": 1,
                        "remote_rank": 0, "remote_tp_size": 1, "status": "ok", "xfer_s": row["xfer_s"],
                        "bytes": int(row["bytes"]), "descriptors": row["descriptors"]})
    write_jsonl(tmp_path / "in" / "trace.jsonl", records)
    ingest([tmp_path / "in"], tmp_path / "store")

    def model(*extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "hybridtrace", "model", "--attention-bytes-per-token", "4KiB",
                   "--state-bytes", "2.57MiB", "--format", "json", *extra]
        return subprocess.run(command, capture_output=True, text=True)

    out = json.loads(model("--link-from", str(tmp_path / "store"), "--pair", "prefill-0,decode-0").stdout)
    fit = out["link_fit"]
    assert fit["transfers"] == 200 and fit["from"] == "200 trace reads"
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(BANDWIDTH, rel=0.05)
    rate, fixed = fit["bandwidth_bytes_per_s"], fit["fixed_s"]
    assert (out["bandwidth_bytes_per_s"], out["fixed_cost_s"]) == (rate, fixed)
    row = out["worksheet"][0]
    assert row["link_seconds"] == pytest.approx(fixed + row["logical_bytes"] / rate)
    # a pair with no reads cannot be fitted: exit 2, one line
    missing = model("--link-from", str(tmp_path / "store"), "--pair", "prefill-9,decode-0")
    assert missing.returncode == 2 and "cannot fit a link" in missing.stderr


def _fits_connection(transfers: pl.DataFrame, rings: pl.DataFrame | None = None):
    """A connection holding just what link_fits_frame reads: transfers and nixl_transfer_ranks."""
    import duckdb

    con = duckdb.connect()
    con.register("_t", transfers.to_arrow())
    con.execute("CREATE TABLE transfers AS SELECT * FROM _t")
    rings = rings if rings is not None else pl.DataFrame(
        schema={"engine_id": pl.String, "rank": pl.Int32, "xfer_us": pl.Int64, "transported_bytes": pl.Int64})
    con.register("_r", rings.to_arrow())
    con.execute("CREATE TABLE nixl_transfer_ranks AS SELECT * FROM _r")
    return con


def _trace_rows(frame: pl.DataFrame, **columns) -> pl.DataFrame:
    return frame.rename({"bytes": "transported_bytes"}).with_columns(
        pl.lit("ok").alias("status"), *(pl.lit(v).alias(k) for k, v in columns.items()))


def test_the_fits_table_has_a_fit_per_rank_pair_link_and_fleet():
    from hybridtrace.analyze.link_fit import link_fits_frame

    fast, slow = reads(400, seed=1), reads(400, seed=2)
    slow = slow.with_columns((pl.col("xfer_s") + pl.col("bytes") * 3 / BANDWIDTH).alias("xfer_s"))  # 5 GB/s
    frame = pl.concat([
        _trace_rows(fast, engine_id="d", remote_engine_id="p", rank=0, link="rdma:mlx5_0"),
        _trace_rows(slow, engine_id="d", remote_engine_id="p", rank=1, link="rdma:mlx5_1"),
        # five reads on a rank of their own: too few to fit
        _trace_rows(reads(5, seed=4), engine_id="d", remote_engine_id="p", rank=2, link="rdma:mlx5_0"),
        _trace_rows(reads(20, seed=5), engine_id="d", remote_engine_id="p", rank=0, link="rdma:mlx5_0")
        .with_columns(pl.lit("failed").alias("status")),  # failed reads are not fitted
    ], how="vertical_relaxed")  # fmt: skip
    fits = link_fits_frame(_fits_connection(frame))
    by = {(r["scope"], r["rank"], r["link"]): r for r in fits.iter_rows(named=True)}
    assert set(by) == {("rank", 0, "rdma:mlx5_0"), ("rank", 1, "rdma:mlx5_1"), ("pair", None, None),
                       ("link", None, "rdma:mlx5_0"), ("link", None, "rdma:mlx5_1"), ("fleet", None, None)}
    assert {r["source"] for r in by.values()} == {"trace"}
    rank0, rank1 = by[("rank", 0, "rdma:mlx5_0")], by[("rank", 1, "rdma:mlx5_1")]
    assert (rank0["engine_id"], rank0["remote_engine_id"], rank0["transfers_used"]) == ("d", "p", 400)
    assert rank0["bandwidth_bytes_per_s"] == pytest.approx(BANDWIDTH, rel=0.05)
    assert rank1["bandwidth_bytes_per_s"] == pytest.approx(BANDWIDTH / 4, rel=0.05)
    assert rank0["per_descriptor_s"] == pytest.approx(PER_DESC, rel=0.05)
    assert rank0["bytes_per_descriptor"] == pytest.approx(fast["bytes"].sum() / fast["descriptors"].sum())
    # rank 2's five reads count in the pair's and the fleet's fits
    assert by[("pair", None, None)]["transfers_used"] == by[("fleet", None, None)]["transfers_used"] == 805
    assert by[("link", None, "rdma:mlx5_0")]["transfers_used"] == 405


def test_a_large_group_is_fitted_on_a_sample_and_says_so(monkeypatch):
    from hybridtrace.analyze import link_fit

    monkeypatch.setattr(link_fit, "MAX_FIT_READS", 100)
    frame = _trace_rows(reads(400, seed=1), engine_id="d", remote_engine_id="p", rank=0, link=None)
    fits = link_fit.link_fits_frame(_fits_connection(frame))
    rank = fits.filter(pl.col("scope") == "rank").row(0, named=True)
    assert (rank["reads"], rank["transfers_used"]) == (400, 100)
    assert rank["bandwidth_bytes_per_s"] == pytest.approx(BANDWIDTH, rel=0.05)


def test_without_trace_reads_the_rings_are_fitted_per_agent_engine_and_rank():
    from hybridtrace.analyze.link_fit import link_fits_frame

    empty = _trace_rows(reads(1).clear(), engine_id="", remote_engine_id="", rank=0, link="")
    ring = reads(100, seed=6).select(
        pl.lit("d").alias("engine_id"), pl.lit(1, pl.Int32).alias("rank"),
        (pl.col("bytes") / BANDWIDTH * 1e6 + 80).round().cast(pl.Int64).alias("xfer_us"),
        pl.col("bytes").round().cast(pl.Int64).alias("transported_bytes"))  # fmt: skip
    unmapped = ring.head(30).with_columns(pl.lit(None, pl.String).alias("engine_id"),
                                          pl.lit(None, pl.Int32).alias("rank"))  # fmt: skip
    fits = link_fits_frame(_fits_connection(empty, pl.concat([ring, unmapped])))
    by = {r["scope"]: r for r in fits.iter_rows(named=True)}
    assert set(by) == {"rank", "pair", "fleet"}  # a ring names no route: no link fits
    assert {r["source"] for r in by.values()} == {"nixl"}
    assert (by["rank"]["engine_id"], by["rank"]["rank"], by["rank"]["remote_engine_id"]) == ("d", 1, None)
    # the unmapped agent's transfers count in the fleet's fit only
    assert by["rank"]["transfers_used"] == 100 and by["fleet"]["transfers_used"] == 130
    assert by["rank"]["per_descriptor_s"] is None and by["rank"]["bytes_per_descriptor"] is None
    assert by["rank"]["bandwidth_bytes_per_s"] == pytest.approx(BANDWIDTH, rel=0.01)
    assert by["rank"]["fixed_s"] == pytest.approx(80e-6, rel=0.05)


def test_a_handoff_only_the_rings_measured_is_judged_by_their_fit(tmp_path):
    """No connector read at all: the decode engine's NIXL ring gives the link, the byte
    model the read's bytes, and recompute_cheaper says it used the fit."""
    import json

    from test_nixl_ring import read as ring_read
    from test_nixl_ring import ring_bytes

    from hybridtrace.analyze import analyze
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    agent = "9a1c3e5f-0b2d-4f6a-8c7e-1d3f5a7b9c0e"
    (tmp_path / "in" / "rings").mkdir(parents=True)
    # ten reads of k × 2 MB at 10 ms + bytes / 200 MB/s (bytes / 200 µs)
    events = [e for k in range(1, 11) for e in ring_read(50, 10_000 + k * 2_000_000 // 200, k * 2_000_000)]
    (tmp_path / "in" / "rings" / agent).write_bytes(ring_bytes(events, capacity=64))
    case = Path(__file__).parent / "cases" / "finding_recompute_cheaper" / "tcp_fallback" / "inputs"
    engines = [json.loads(line) for line in (case / "connector.jsonl").read_text().splitlines()
               if json.loads(line)["type"] == "engine"]  # fmt: skip
    records = [{**e, "engine_id": e["role"] + "-ring", **({"rank": 0, "agent_name": agent}
                                                            if e["role"] == "decode" else {})}
               for e in engines]  # fmt: skip
    records.append({"type": "request", "v": 1, "ts": 1764400110.0, "request_id": "r-ring",
                    "engine_id": "decode-ring", "remote_engine_id": "prefill-ring", "prompt_tokens": 1001,
                    "cached_tokens": 0, "missing_tokens": 1000, "transferred_tokens": 1000,
                    "reused_tokens": 1000, "recomputed_tokens": 1, "state_blocks": 1, "boundary_tokens": 1000,
                    "prefill_s": 0.1, "status": "ok"})  # fmt: skip
    (tmp_path / "in" / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    ingest([tmp_path / "in"], tmp_path / "store", model="nemotron-nano-12b-v2")
    con = Store(tmp_path / "store").connect()
    fit = con.sql("SELECT source, transfers_used, fixed_s, bandwidth_bytes_per_s FROM link_fits "
                  "WHERE scope = 'pair' AND engine_id = 'decode-ring'").fetchall()  # fmt: skip
    assert len(fit) == 1 and fit[0][:2] == ("nixl", 10)
    assert fit[0][2] == pytest.approx(0.01) and fit[0][3] == pytest.approx(2e8)
    (finding,) = [f for f in analyze(con).findings if f["kind"] == "recompute_cheaper"]
    evidence = finding["evidence"]
    # the ring's agent is rank 0 of the decode engine: its rank fit, from NIXL's transfers
    assert (evidence["handoff_time_source"], evidence["fit_scope"], evidence["fit_rank"],
            evidence["fit_source"], evidence["fit_transfers_used"]) == ("fit", "rank", 0, "nixl", 10)
    # one read at TP 4 on both sides is 27,123,712 bytes (tests/cases/README.md): 0.01 + that / 2e8
    assert evidence["read_bytes"] == 27_123_712
    assert evidence["critical_path_s"] == pytest.approx(0.01 + 27_123_712 / 2e8)
    assert "by the link fitted from 10 reads" in finding["message"]


def test_a_sample_is_the_same_in_any_scan_order_and_with_any_oversampling(monkeypatch):
    """The sample is a group's reads of lowest hash: shuffling the reads changes nothing, and
    a threshold that keeps fewer than a sample (the fallback reads the whole group) neither."""
    from hybridtrace.analyze import link_fit

    monkeypatch.setattr(link_fit, "MAX_FIT_READS", 60)
    frame = pl.concat([
        _trace_rows(reads(300, seed=1), engine_id="d", remote_engine_id="p", rank=0, link="rdma:mlx5_0"),
        _trace_rows(reads(200, seed=2), engine_id="d", remote_engine_id="p", rank=1, link=None),
    ], how="vertical_relaxed")  # fmt: skip
    first = link_fit.link_fits_frame(_fits_connection(frame))
    shuffled = link_fit.link_fits_frame(_fits_connection(frame.sample(fraction=1.0, shuffle=True, seed=9)))
    monkeypatch.setattr(link_fit, "_OVERSAMPLE", 0.2)  # below one: every large group falls back
    fallback = link_fit.link_fits_frame(_fits_connection(frame))
    assert first.height == 5 and set(first["transfers_used"]) == {60}
    assert first.equals(shuffled) and first.equals(fallback)


def test_sets_fitted_together_get_each_the_fit_it_gets_alone():
    """One IRLS loop for many sets of reads: each set leaves it at its own convergence, a set
    too small or singular gives None, and the others' fits are the same to the last bit."""
    from hybridtrace.analyze.link_fit import _fit_links

    grown = reads(300, seed=8).with_columns((pl.col("bytes") / 4096).round().alias("descriptors"))
    one_size = [pl.lit(float(1 << 20)).alias("bytes"), pl.lit(16).alias("descriptors")]
    flat = reads(50, seed=9).with_columns(one_size)
    sets = [
        (reads(300, seed=1), "descriptors"),
        (reads(5), "descriptors"),  # too few
        (reads(400, slow_share=0.02, seed=7), "descriptors"),
        (grown, "descriptors"),  # descriptors left out
        (flat, "descriptors"),  # one size: fixed cost and bandwidth cannot be told apart
        (reads(200, seed=2), None),
    ]
    together = _fit_links(sets)
    alone = [fit_link(frame, descriptors=descriptors) for frame, descriptors in sets]
    assert together == alone
    assert [fit is None for fit in together] == [False, True, False, False, True, False]
    assert together[3].per_descriptor_s is None and together[5].per_descriptor_s is None


def test_reads_in_several_chunks_fit_as_in_one():
    # a whole store's reads come from Arrow in chunks: the sums follow them, the line does not move
    frame = reads(600, seed=4)
    chunked = pl.concat([frame.head(250), frame.slice(250, 200), frame.tail(150)], rechunk=False)
    assert chunked.n_chunks() == 3
    one, several = fit_link(frame), fit_link(chunked)
    assert several.transfers == one.transfers == 600
    for field in ("fixed_s", "bandwidth_bytes_per_s", "per_descriptor_s"):
        assert getattr(several, field) == pytest.approx(getattr(one, field), rel=1e-6)
