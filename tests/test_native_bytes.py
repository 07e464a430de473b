"""Padding from native metrics alone: decided when block rounding allows, said when not."""

from __future__ import annotations

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
    finding = analyze(con).summary["findings_by_kind"]
    assert finding["padding_leak"] >= 1
