"""The analyzer against the simulator's truth: every injected fault found, nothing invented."""

from __future__ import annotations

import json

import pytest

from hybridtrace.analyze import KINDS, analyze
from hybridtrace.ingest.run import ingest
from hybridtrace.model.catalog import builtin_names
from hybridtrace.simulate import SimOptions, parse_inject, simulate
from hybridtrace.store import Store

RANKED = {"slow_rank", "unsharded_state", "transfer_failed"}


def key(finding: dict) -> tuple:
    rank = finding["rank"] if finding["kind"] in RANKED else None
    return (finding["kind"], finding["engine_id"], finding["request_id"], rank)


def run(tmp_path, options: SimOptions) -> tuple[set, set, dict]:
    simulate(options, tmp_path / "bundle")
    ingest([tmp_path / "bundle"], tmp_path / "store")
    result = analyze(Store(tmp_path / "store").connect())
    truth = json.loads((tmp_path / "bundle" / "truth.json").read_text())
    return {key(f) for f in truth["findings"]}, {key(f) for f in result.findings}, result.as_dict()


def test_every_kind_injected_is_found_and_nothing_else(tmp_path):
    rates = {k: 1.0 if k in ("slow_rank", "config_mismatch") else 0.15 for k in KINDS}
    expected, found, result = run(tmp_path, SimOptions(seed=21, inject=rates, duration_s=60))
    assert {k[0] for k in expected} == set(KINDS)
    assert found - expected == set(), "findings the truth does not have"
    assert expected - found == set(), "truth the analyzer missed"
    assert (
        result["inputs"]["transfers"] > 0
        and result["inputs"]["transfers_accounted"] == result["inputs"]["transfers"]
    )


@pytest.mark.parametrize("seed", [101, 202, 303])  # seeds no detector was tuned on
def test_precision_and_recall_per_kind_at_a_few_percent(tmp_path, seed):
    rates = {k: 1.0 if k in ("slow_rank", "config_mismatch") else 0.03 for k in KINDS}
    expected, found, _ = run(tmp_path, SimOptions(seed=seed, requests=3000, inject=rates))
    for kind in KINDS:
        truth = {k for k in expected if k[0] == kind}
        seen = {k for k in found if k[0] == kind}
        assert truth, f"{kind}: nothing injected"
        hits = len(truth & seen)
        precision, recall = hits / len(seen) if seen else 0.0, hits / len(truth)
        assert precision >= 0.95 and recall >= 0.95, (kind, precision, recall)


@pytest.mark.parametrize(
    "options",
    [
        SimOptions(seed=22, requests=10_000),
        # confounders: long prompts (long transfers that are simply long), a busy stretch,
        # heterogeneous TP both ways, an fp8 KV cache everywhere
        SimOptions(seed=23, duration_s=20, request_rate=40, median_prompt_tokens=16000, prefill_engines=2,
                   decode_engines=2, prefill_tp=(2, 4), decode_tp=(4, 1), kv_dtype="fp8"),
    ],
    ids=["clean", "confounders"],
)  # fmt: skip
def test_clean_bundles_give_only_what_is_naturally_true(tmp_path, options):
    expected, found, result = run(tmp_path, options)
    assert {k[0] for k in expected} <= {"recompute_cheaper"}
    assert found == expected
    assert result["summary"]["transported_over_expected"] == pytest.approx(1.0)


def test_thresholds_from_a_config_file(tmp_path):
    options = SimOptions(seed=24, duration_s=30, inject={"descriptor_bound": 0.3})
    simulate(options, tmp_path / "bundle")
    ingest([tmp_path / "bundle"], tmp_path / "store")
    con = Store(tmp_path / "store").connect()
    assert analyze(con).summary["findings_by_kind"]["descriptor_bound"] > 0
    config = tmp_path / "hybridtrace.toml"
    config.write_text("[thresholds]\ndescriptor_post_share = 0.9999\n")
    assert analyze(con, config=str(config)).summary["findings_by_kind"]["descriptor_bound"] == 0
    # the rules read the thresholds as literals (thresholds.install): each analysis installs its own
    assert analyze(con).summary["findings_by_kind"]["descriptor_bound"] > 0
    assert con.sql("SELECT _t('descriptor_post_share')").fetchall() == [(0.5,)]


def test_cli_exit_codes(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    simulate(SimOptions(seed=25, duration_s=20, inject={"transfer_failed": 0.5}), tmp_path / "bundle")
    ingest([tmp_path / "bundle"], tmp_path / "store")
    script = Path(sys.executable).with_name("hybridtrace")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "hybridtrace"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, "analyze", "--store", str(tmp_path / "store"), *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    assert run().returncode == 0
    assert run("--fail-on", "transfer_failed").returncode == 1
    assert run("--fail-on", "padding_leak").returncode == 0
    bad = run("--fail-on", "nonsense")
    assert bad.returncode == 2 and "unknown kinds" in bad.stderr
    data = json.loads(run("--format", "json").stdout)
    assert set(data) == {"findings", "inputs", "summary"}
    assert any(f["kind"] == "transfer_failed" and f["severity"] == "error" for f in data["findings"])
    empty = tmp_path / "empty"
    (empty / "x").mkdir(parents=True)
    (empty / "x" / "notes.txt").write_text("nothing\n")
    ingest([empty], tmp_path / "empty-store")
    strict = subprocess.run([*base, "analyze", "--store", str(tmp_path / "empty-store"), "--strict"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert strict.returncode == 2 and "nothing to analyze" in strict.stderr


@pytest.mark.parametrize("model", builtin_names())
def test_every_builtin_model_gives_exactly_its_truth(tmp_path, model):
    """What the simulator injects shows in the telemetry on every model, small or large,
    hybrid or pure: the analyzer finds exactly the truth (the small state of a pure Mamba
    model crosses within one engine step, and its pages need no padding)."""
    options = SimOptions(seed=11, requests=300, model=model, inject=parse_inject("all"))
    expected, found, _ = run(tmp_path, options)
    assert expected, "nothing injected"
    assert found - expected == set(), "findings the truth does not have"
    assert expected - found == set(), "truth the analyzer missed"


def test_pure_mamba_models_are_accounted(tmp_path):
    simulate(
        SimOptions(model="mamba-codestral-7b", requests=60, inject={"unsharded_state": 0.5}), tmp_path / "b"
    )
    ingest([tmp_path / "b"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    assert con.sql("SELECT count(*) FROM transfer_bytes WHERE expected_bytes IS NULL").fetchall()[0][0] == 0
    truth = json.loads((tmp_path / "b" / "truth.json").read_text())
    found = analyze(con).summary
    assert found["findings_by_kind"]["unsharded_state"] == truth["summary"]["injected"]["unsharded_state"]
    assert found["transported_over_expected"] is not None


def test_a_nested_materialization_of_a_view_swapped_in_between_leaves_the_outer_copy(tmp_path):
    from hybridtrace.analyze import materialized
    from hybridtrace.analyze.view_swap import swapped_views

    store = Store(tmp_path / "s")
    store.init()
    con = store.connect()
    con.execute("CREATE TEMP VIEW _v AS SELECT 1 AS a")
    with materialized(con, ("_v",)):
        with swapped_views(con, {"_v": "SELECT 2 AS a"}), materialized(con, ("_v",)):
            assert con.sql("SELECT a FROM _v").fetchall() == [(2,)]
        assert con.sql("SELECT a FROM _v").fetchall() == [(1,)]
    assert con.sql("SELECT a FROM _v").fetchall() == [(1,)]


def test_what_an_analysis_computes_from_the_rows_it_holds_equals_the_views(tmp_path):
    """The failed and expired request records and the input counts, which an analysis computes
    from each request's reads and records once it holds them (HELD_SOURCES), are the rows the
    views give over the store: failures, expiries and requests without tokens included."""
    from hybridtrace.analyze import ANALYSIS_VIEWS, HELD_SOURCES, materialized

    rates = {k: 0.2 for k in KINDS}
    simulate(SimOptions(seed=5, inject=rates, duration_s=30), tmp_path / "bundle")
    ingest([tmp_path / "bundle"], tmp_path / "store")
    con = Store(tmp_path / "store").connect()
    wanted = {name: sorted(con.execute(f"SELECT * FROM {name}").fetchall()) for name in HELD_SOURCES}
    assert wanted["_unsuccessful_requests"], "the bundle holds failed and expired records"
    held = ANALYSIS_VIEWS[: ANALYSIS_VIEWS.index("_request_rows") + 1]
    with materialized(con, held):
        for name, source in HELD_SOURCES.items():
            assert sorted(con.execute(f"SELECT * FROM {source}").fetchall()) == wanted[name], name


def test_each_kinds_first_findings_and_counts_come_out_alike_unsorted_and_sorted(demo_store):
    # A report lists each kind's first findings: taken as the findings stream by, they are
    # the first rows of each kind of the sorted table, the counts those of every finding.
    result = analyze(Store(demo_store).connect())
    assert result.source_name is not None  # not sorted yet
    head, counts = result.head_of_each_kind(3), sorted(result.kind_counts())
    smaller = result.head_of_each_kind(2).to_pylist()  # from the kept heads
    padding = sorted(result.of_kind("padding_leak", ["request_id", "rank"]).to_pylist(), key=repr)
    rows = result.table.to_pylist()  # every finding, sorted
    seen: dict[str, int] = {}
    expected = []
    for row in rows:
        seen[row["kind"]] = seen.get(row["kind"], 0) + 1
        if seen[row["kind"]] <= 3:
            expected.append(row)
    assert max(seen.values()) > 3 and len(seen) > 3
    assert head.to_pylist() == expected
    assert smaller == [row for i, row in enumerate(expected)
                       if sum(r["kind"] == row["kind"] for r in expected[:i]) < 2]  # fmt: skip
    assert result.head_of_each_kind(3).to_pylist() == expected  # from the sorted table now
    pairs: dict[tuple, int] = {}
    for row in rows:
        pairs[(row["kind"], row["severity"])] = pairs.get((row["kind"], row["severity"]), 0) + 1
    assert counts == sorted((k, s, n) for (k, s), n in pairs.items()) == sorted(result.kind_counts())
    leaks = [{"request_id": r["request_id"], "rank": r["rank"]} for r in rows if r["kind"] == "padding_leak"]
    assert padding == sorted(leaks, key=repr) and padding


def test_the_first_findings_are_those_of_the_sort_when_they_tie_on_all_but_their_text():
    # The first rows are found by the order's terms before the text, and only those that tie
    # with the last of them are put in order by message and evidence: findings of one engine
    # (no request, no rank) that differ only in their text, a null message among them.
    import duckdb

    from hybridtrace.analyze import Analysis

    con = duckdb.connect()
    rows = [  # kind, severity, engine, rank, request, message, evidence
        ("native_unexplained", "warning", "decode-0", None, None, "e", "{}"),
        ("native_unexplained", "warning", "decode-0", None, None, None, "{}"),
        ("native_unexplained", "warning", "decode-0", None, None, "b", '{"x":2}'),
        ("native_unexplained", "warning", "decode-0", None, None, "b", '{"x":1}'),
        ("native_unexplained", "warning", "decode-0", None, None, "d", "{}"),
        ("native_unexplained", "warning", "decode-1", None, None, "a", "{}"),
        ("native_unexplained", "warning", "decode-0", 1, None, "a", "{}"),
        ("padding_undecidable", "info", "decode-0", None, None, "z", "{}"),
        ("padding_undecidable", "info", "decode-0", None, None, "y", "{}"),
        ("transfer_failed", "error", "decode-0", 0, "r2", "m", "{}"),
        ("transfer_failed", "error", "decode-0", 0, "r1", "n", "{}"),
    ]
    con.execute("CREATE TABLE every (rule VARCHAR, kind VARCHAR, severity VARCHAR, engine_id VARCHAR, "
                "rank INTEGER, request_id VARCHAR, remote_engine_id VARCHAR, start_ts DOUBLE, end_ts DOUBLE, "
                "message VARCHAR, evidence VARCHAR)")  # fmt: skip
    con.executemany("INSERT INTO every VALUES ('r', ?, ?, ?, ?, ?, NULL, NULL, NULL, ?, ?)", rows)

    def unread(n: int = 0) -> Analysis:
        name = f"_unread_{n}"
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM every")
        return Analysis(None, {}, {"findings": len(rows)}, source=(con, name))

    ordered = unread().table.to_pylist()
    assert [r["message"] for r in ordered][:4] == ["n", "m", "b", "b"]  # errors first; text breaks a tie
    for limit in range(1, len(rows) + 2):
        assert unread(limit).rows(limit) == unread(limit).rows()[:limit], limit
        got = unread(limit).head_of_each_kind(limit).to_pylist()
        assert got == [r for i, r in enumerate(ordered)
                       if sum(o["kind"] == r["kind"] for o in ordered[:i]) < limit], limit  # fmt: skip
