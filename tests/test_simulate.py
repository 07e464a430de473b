"""The simulator: round trips through ingest, determinism, injections and confounders."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import INJECTABLE, SimOptions, parse_inject, simulate
from hybridtrace.store import Store


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def round_trip(tmp_path: Path, options: SimOptions) -> tuple[dict, object]:
    truth = simulate(options, tmp_path / "bundle")
    ingest([tmp_path / "bundle"], tmp_path / "store")
    return truth, Store(tmp_path / "store").connect()


def one(con, sql: str):
    return con.sql(sql).fetchall()[0][0]


@pytest.mark.parametrize(
    "options",
    [
        SimOptions(seed=1),
        # confounders: heterogeneous TP both ways, fp8 KV, a busy stretch, long prompts
        SimOptions(seed=2, prefill_engines=2, decode_engines=2, prefill_tp=(2, 4), decode_tp=(4, 1),
                   kv_dtype="fp8", request_rate=40, duration_s=20, median_prompt_tokens=12000, colour=True),
    ],
    ids=["clean", "confounders"],
)  # fmt: skip
def test_round_trip_counts_and_interval_sums(tmp_path, options):
    truth, con = round_trip(tmp_path, options)
    counts = truth["inputs"]
    assert one(con, "SELECT count(*) FROM transfers") == counts["transfers"]
    assert one(con, "SELECT count(*) FROM requests") == counts["requests"]
    assert one(con, "SELECT count(*) FROM engines WHERE source_kind = 'trace'") == counts["engines"]
    assert one(con, "SELECT count(*) FROM intervals WHERE source_kind = 'log'") == counts["log_intervals"]
    assert one(con, "SELECT count(DISTINCT (instance, ts)) FROM prom_samples") == counts["prom_scrapes"]
    assert one(con, "SELECT count(*) FROM rejects") == 0
    assert truth["summary"]["injected"] == {}  # nothing injected: only what is naturally true
    # Every KV Transfer metrics line equals, to its printed precision, what the transfers
    # that completed in its interval give.
    start = options.start_ts
    mismatches = con.sql(
        f"""
        WITH lines AS (SELECT engine_id, coalesce(start_ts, {start}) AS t0, end_ts AS t1, transfers,
                              avg_xfer_s, avg_mib_per_transfer, throughput_mib_s, avg_descriptors
                       FROM intervals WHERE source_kind = 'log'),
             sums AS (SELECT l.engine_id, l.t1, count(x.ts) AS n,
                             round(avg(x.xfer_s) * 1e3, 3) AS avg_ms,
                             round(sum(x.transported_bytes) / 1048576.0 / count(x.ts), 3) AS mib,
                             round(sum(x.transported_bytes) / 1048576.0 / sum(x.xfer_s), 3) AS tput,
                             round(avg(x.descriptors), 1) AS descs
                      FROM lines l JOIN transfers x
                        ON x.engine_id = l.engine_id AND x.status = 'ok'
                       AND x.ts + x.xfer_s > l.t0 AND x.ts + x.xfer_s <= l.t1
                      GROUP BY ALL)
        SELECT l.*, s.* FROM lines l JOIN sums s USING (engine_id, t1)
        WHERE s.n <> l.transfers OR abs(s.avg_ms - l.avg_xfer_s * 1e3) > 5e-4
           OR abs(s.mib - l.avg_mib_per_transfer) > 5e-4 OR abs(s.tput - l.throughput_mib_s) > 5e-4
           OR abs(s.descs - l.avg_descriptors) > 0.05
        """
    ).fetchall()
    assert mismatches == []
    assert one(con, "SELECT sum(transfers) FROM intervals WHERE source_kind = 'log'") == one(
        con, "SELECT count(*) FROM transfers WHERE status = 'ok'"
    )


def test_bytes_follow_the_byte_model(tmp_path):
    _, con = round_trip(tmp_path, SimOptions(seed=3, prefill_tp=(4,), decode_tp=(2,)))
    # decode TP 2 reads from prefill TP 4: two reads per decode rank, each half the shard
    rows = con.sql(
        """
        SELECT t.request_id, t.rank, count(*) AS reads, sum(t.transported_bytes) AS bytes,
               any_value(ceil(r.transferred_tokens / m.block_tokens) * m.block_tokens
                         * m.attention_bytes_per_token + m.state_bytes) AS expected
        FROM transfers t JOIN requests r USING (engine_id, request_id)
        JOIN engine_models m ON m.engine_id = t.engine_id
        GROUP BY ALL
        """
    ).fetchall()
    assert rows and all(r[2] == 2 for r in rows)
    assert all(abs(r[3] - r[4]) <= 2 for r in rows)  # integer halves of an odd byte count


def test_same_seed_same_bytes(tmp_path):
    options = SimOptions(seed=5, inject=parse_inject("all"), duration_s=30)
    simulate(options, tmp_path / "a")
    simulate(options, tmp_path / "b")
    simulate(SimOptions(seed=6, inject=parse_inject("all"), duration_s=30), tmp_path / "c")
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(tmp_path / "c")


@pytest.mark.slow
def test_same_seed_same_bytes_at_scale(tmp_path):
    # Large enough that polars splits aggregations between threads: every sum that reaches
    # a file must not depend on how the rows were split (the scrapes' float sums did).
    options = SimOptions(requests=100_000, inject=parse_inject("all"))
    runs = []
    for name in ("a", "b", "c"):
        simulate(options, tmp_path / name)
        runs.append(digest(tmp_path / name))
    assert runs[0] == runs[1] == runs[2]
    assert any(name.endswith(".prom") for name in runs[0])


def test_every_kind_injected(tmp_path):
    options = SimOptions(
        seed=7, inject={k: 1.0 if k in ("slow_rank", "config_mismatch") else 0.2 for k in INJECTABLE}
    )
    truth, con = round_trip(tmp_path, options)
    assert set(truth["summary"]["injected"]) == set(INJECTABLE)
    assert one(con, "SELECT count(*) FROM rejects") == 0
    # the injections show in the telemetry, and nothing else marks them
    assert one(con, "SELECT count(*) FROM log_events WHERE kind = 'transfer_failed'") > 0
    assert one(con, "SELECT count(*) FROM log_events WHERE kind = 'kv_expired'") > 0
    assert one(con, "SELECT count(*) FROM log_events WHERE kind = 'handshake_mismatch'") == 1
    assert one(con, "SELECT count(*) FROM transfers WHERE staging_bytes > 0") > 0
    for path in (tmp_path / "bundle").rglob("*"):
        if path.is_file() and path.name != "truth.json" and not path.name.endswith(".gz"):
            assert b"inject" not in path.read_bytes()
    findings = json.loads((tmp_path / "bundle" / "truth.json").read_text())["findings"]
    assert {f["kind"] for f in findings} >= set(INJECTABLE)


def test_exact_request_count_and_bad_inject(tmp_path):
    from hybridtrace.errors import UsageError

    truth = simulate(SimOptions(requests=37), tmp_path / "b")
    assert truth["inputs"]["requests"] == 37
    with pytest.raises(UsageError):
        parse_inject("padding_leek")
    with pytest.raises(UsageError):
        parse_inject("slow_rank=2")


def test_truth_is_one_json_document_with_or_without_findings(tmp_path):
    # a fast link, cheap posting and long prompts: nothing is naturally worth a finding
    quiet = SimOptions(requests=20, median_prompt_tokens=20000, prompt_sigma=0.1, post_s_per_descriptor=0.0,
                       bandwidth_gb_s=1000.0)  # fmt: skip
    for name, options in (("quiet", quiet), ("busy", SimOptions(requests=2000, inject=parse_inject("all")))):
        returned = simulate(options, tmp_path / name)
        truth = json.loads((tmp_path / name / "truth.json").read_text())
        assert truth["inputs"] == returned["inputs"]
        counted = sum(returned["summary"]["injected"].values()) + sum(returned["summary"]["natural"].values())
        assert len(truth["findings"]) == counted
        assert bool(counted) == (name == "busy")


def test_a_failed_run_leaves_no_truth(tmp_path, monkeypatch):
    from hybridtrace.simulate import writers

    seen = []
    consume = writers.BundleWriter.consume

    def watched(self, block, watermark):
        # truth.json appears only when whole: a run killed at this point would leave none
        seen.append((tmp_path / "b" / "truth.json").exists())
        if len(seen) == 2:
            raise OSError("disk full")
        consume(self, block, watermark)

    monkeypatch.setattr(writers.BundleWriter, "consume", watched)
    with pytest.raises(OSError, match="disk full"):
        simulate(SimOptions(requests=300_000), tmp_path / "b", block_size=100_000)
    assert seen == [False, False]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["decode-0", "models", "prefill-0"]
