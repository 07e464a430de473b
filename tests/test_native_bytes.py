"""Padding from native metrics alone: decided when block rounding allows, said when not."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hybridtrace.analyze import analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store


def native_only(tmp_path: Path, options: SimOptions):
    simulate(options, tmp_path / "b")
    for trace in (tmp_path / "b").rglob("trace.jsonl"):
        trace.unlink()  # logs, scrapes and the config only
    ingest([tmp_path / "b"], tmp_path / "s", model="nemotron-nano-12b-v2")
    return Store(tmp_path / "s").connect()


@pytest.mark.parametrize(("leak", "verdict"), [(0.0, "unpadded"), (1.0, "padded")])
def test_every_interval_is_decided(tmp_path, leak, verdict):
    con = native_only(
        tmp_path, SimOptions(seed=51, duration_s=60, inject={"padding_leak": leak} if leak else {})
    )
    rows = dict(con.sql("SELECT verdict, count(*) FROM interval_bytes GROUP BY verdict").fetchall())
    assert set(rows) == {verdict}
    kinds = analyze(con).summary["findings_by_kind"]
    assert kinds["padding_leak"] == (2 if leak else 0)  # one per engine and source (logs, scrapes)


def test_undecidable_when_the_padding_is_a_whole_number_of_blocks(tmp_path):
    con = native_only(tmp_path, SimOptions(seed=52, duration_s=30))
    # Pretend each layer's padded page is one attention block bigger than its state: the
    # padding is then a whole number of blocks, every total fits both readings, and the
    # analysis must say it cannot tell.
    before = dict(con.sql("SELECT verdict, count(*) FROM interval_bytes GROUP BY ALL").fetchall())
    assert set(before) == {"unpadded"}
    con.execute("CREATE OR REPLACE TABLE _em AS SELECT * FROM engine_models")
    con.execute(
        "UPDATE _em SET mamba_padded_page_bytes = state_bytes // recurrent_layers"
        " + block_tokens * attention_bytes_per_token"
    )
    con.execute("CREATE OR REPLACE VIEW engine_models AS SELECT * FROM _em")
    verdicts = dict(con.sql("SELECT verdict, count(*) FROM interval_bytes GROUP BY ALL").fetchall())
    assert set(verdicts) == {"undecidable"}
    found = con.sql("SELECT kind, severity, message FROM finding_native_padding").fetchall()
    assert found and all(
        k == "padding_undecidable" and s == "info" and "cannot tell" in m for k, s, m in found
    )
    # One log interval no reading explains (0.7 MiB more per read) decides nothing: the
    # others still cannot be judged, and both findings say so.
    con.execute("CREATE OR REPLACE TABLE _iv AS SELECT * FROM intervals")
    con.execute(
        "UPDATE _iv SET avg_mib_per_transfer = avg_mib_per_transfer + 0.7 "
        "WHERE (source_id, line_number) = (SELECT (source_id, line_number) FROM _iv "
        "WHERE source_kind = 'log' ORDER BY transfers DESC LIMIT 1)"
    )
    con.execute("CREATE OR REPLACE VIEW intervals AS SELECT * FROM _iv")
    verdicts = dict(con.sql("SELECT verdict, count(*) FROM interval_bytes GROUP BY ALL").fetchall())
    assert verdicts["unexplained"] == 1 and verdicts["undecidable"] > 1
    kinds = analyze(con).summary["findings_by_kind"]
    assert kinds["padding_undecidable"] == len(found) and kinds["native_unexplained"] == 1


def test_partly_padded_intervals_count_the_padded_reads(tmp_path):
    options = SimOptions(seed=53, duration_s=60, inject={"padding_leak": 0.3})
    full = tmp_path / "full"
    simulate(options, full / "b")
    ingest([full / "b"], full / "s")
    traced = Store(full / "s").connect()
    con = native_only(tmp_path / "native", options)
    scrapes = con.sql(
        "SELECT start_ts, end_ts, verdict, padded_reads FROM interval_bytes WHERE source_kind = 'prometheus'"
    ).fetchall()
    assert scrapes
    for start, end, verdict, padded in scrapes:
        # Prometheus totals are exact: each scrape says how many reads sent padded state.
        leaked = traced.sql(
            "SELECT count(*) FROM transfer_bytes b JOIN transfers t USING (engine_id, request_id, rank, ts) "
            "WHERE b.status = 'ok' AND b.excess_bytes > 0 AND t.ts + t.xfer_s > ? AND t.ts + t.xfer_s <= ?",
            params=[start, end],
        ).fetchall()[0][0]
        assert verdict in ("partly padded", "padded", "unpadded") and padded == leaked
    # Every log interval is explained too, the first one (which has no start) included.
    logs = dict(con.sql(
        "SELECT start_ts IS NULL, count(*) FROM interval_bytes WHERE source_kind = 'log' "
        "AND verdict IN ('partly padded', 'padded', 'unpadded', 'undecidable') GROUP BY ALL"
    ).fetchall())  # fmt: skip
    assert logs.get(True) == 1
    all_logs = con.sql("SELECT count(*) FROM interval_bytes WHERE source_kind = 'log'").fetchall()[0][0]
    assert sum(logs.values()) == all_logs
    finding = analyze(con).summary["findings_by_kind"]
    assert finding["padding_leak"] >= 1


def test_a_wrong_byte_model_leaves_intervals_unexplained(tmp_path):
    simulate(SimOptions(seed=55, duration_s=30), tmp_path / "b")
    for trace in (tmp_path / "b").rglob("trace.jsonl"):
        trace.unlink()
    # The bundle comes from Nemotron Nano 12B v2; attaching Nemotron-H 8B sizes every read
    # wrongly, so no interval can be explained and the analysis must say so.
    ingest([tmp_path / "b"], tmp_path / "s", model="nemotron-h-8b-base-8k")
    con = Store(tmp_path / "s").connect()
    verdicts = dict(con.sql("SELECT verdict, count(*) FROM interval_bytes GROUP BY ALL").fetchall())
    assert verdicts.get("unexplained", 0) > 0
    found = [f for f in analyze(con).findings if f["kind"] == "native_unexplained"]
    assert {f["evidence"]["source"] for f in found} == {"log", "prometheus"}
    assert sum(f["evidence"]["unexplained"] for f in found) == verdicts["unexplained"]


def _drop_lines(folder: Path, needle: str) -> int:
    """Remove every log line containing ``needle`` (plain and rotated .gz logs)."""
    dropped = 0
    for log in folder.rglob("vllm.log*"):
        opener = gzip.open if log.suffix == ".gz" else open
        with opener(log, "rt", newline="") as fh:
            lines = fh.read().splitlines(keepends=True)
        kept = [line for line in lines if needle not in line]
        dropped += len(lines) - len(kept)
        with opener(log, "wt", newline="") as fh:
            fh.write("".join(kept))
    return dropped


@pytest.mark.parametrize("lines_kept", [True, False])
def test_failures_only_the_counters_saw_are_reported(tmp_path, lines_kept):
    simulate(SimOptions(seed=56, duration_s=60, inject={"transfer_failed": 0.1}), tmp_path / "b")
    for trace in (tmp_path / "b").rglob("trace.jsonl"):
        trace.unlink()
    if not lines_kept:
        assert _drop_lines(tmp_path / "b", "NIXL transfer failure") > 0
    ingest([tmp_path / "b"], tmp_path / "s", model="nemotron-nano-12b-v2")
    con = Store(tmp_path / "s").connect()
    # What the scrapes saw fail: growth of the counter from the first scrape to the last.
    counted = con.sql(
        "SELECT max(value) - min(value) FROM prom_samples "
        "WHERE metric = 'vllm:nixl_num_failed_transfers_total'"
    ).fetchall()[0][0]
    assert counted > 0
    named = con.sql("SELECT count(*) FROM log_events WHERE kind = 'transfer_failed'").fetchall()[0][0]
    engine_scope = [
        f for f in analyze(con).findings if f["kind"] == "transfer_failed" and f["request_id"] is None
    ]
    if lines_kept:
        assert named >= counted and engine_scope == []
    else:
        assert named == 0
        assert len(engine_scope) == 1
        assert engine_scope[0]["evidence"] == {"source": "prometheus", "counted": counted, "named": 0}
