"""The fitted link model recovers a known link from simulated reads, also with a slow
tail, and says when descriptors cannot be told apart from bytes."""

from __future__ import annotations

import random

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
