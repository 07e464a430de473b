"""Incremental analysis: after every step of ingest, analyze, ingest more, compact, a killed
run, other thresholds, the incremental result equals a full analysis of the same store."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridtrace.analyze import analyze
from hybridtrace.analyze.incremental import STORED_RULES
from hybridtrace.cli import app
from hybridtrace.ingest.run import ingest
from hybridtrace.schema import table_schema
from hybridtrace.simulate import SimOptions, parse_inject, simulate
from hybridtrace.store import Store


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    simulate(SimOptions(seed=5, requests=600, inject=parse_inject("all")), str(out))
    return out


class Growing:
    """An input folder that receives a simulated bundle piece by piece, as a job's bucket does."""

    def __init__(self, bundle: Path, root: Path) -> None:
        self.bundle, self.input, self.store = bundle, root / "in", root / "store"
        (self.input / "decode-0").mkdir(parents=True)
        shutil.copytree(bundle / "prefill-0", self.input / "prefill-0")
        self.trace = (bundle / "decode-0" / "trace.jsonl").read_text().splitlines(keepends=True)
        self.log = (bundle / "decode-0" / "vllm.log").read_text().splitlines(keepends=True)

    def grow(self, trace_share: float, log_share: float) -> None:
        """The decode trace and log as far as ``share`` of their lines (whole lines: both only grow)."""
        self.grow_trace(trace_share)
        (self.input / "decode-0" / "vllm.log").write_text("".join(self.log[: int(len(self.log) * log_share)]))

    def grow_trace(self, share: float) -> None:
        """The decode trace alone as far as ``share`` of its lines; the log left as it is (a
        log written again, even with the same lines, is a new read of it)."""
        lines = self.trace[: int(len(self.trace) * share)]
        (self.input / "decode-0" / "trace.jsonl").write_text("".join(lines))

    def add(self, *names: str) -> None:
        for name in names:
            for path in self.bundle.glob(name):
                target = self.input / path.relative_to(self.bundle)
                if path.is_dir():
                    shutil.copytree(path, target)
                else:
                    shutil.copy(path, target)

    def ingest(self) -> None:
        ingest([str(self.input)], str(self.store), progress=False)


def _as_text(result) -> str:
    return json.dumps(result.as_dict(), sort_keys=True, default=str)


def _check(store: Path, *, config: str | None = None, full: bool = False) -> dict:
    """Analyze incrementally, then in full on a fresh connection: the two must be equal. Returns
    the run the incremental analysis recorded."""
    incremental = analyze(Store(store).connect(), config=config, incremental=True, full=full)
    whole = analyze(Store(store).connect(), config=config)
    assert _as_text(incremental) == _as_text(whole)
    assert len(whole) > 0
    return _last_run(store)


def _last_run(store: Path) -> dict:
    con = Store(store).connect(with_queries=False)
    rows = con.sql("SELECT * FROM analysis_runs ORDER BY seq DESC LIMIT 1").fetchall()
    names = [c[0] for c in con.sql("SELECT * FROM analysis_runs").description]
    return dict(zip(names, rows[0], strict=True)) if rows else {}


def _findings_of(store: Path, kind: str) -> int:
    return analyze(Store(store).connect()).summary["findings_by_kind"][kind]


def _requests(store: Path) -> int:
    return (
        Store(store)
        .connect(with_queries=False)
        .sql("SELECT count(DISTINCT request_id) FROM requests")
        .fetchall()[0][0]
    )


def _state_of_half_then_the_rest(job: Growing) -> None:
    """The model config and half the trace and log, analysed (the state); then the rest ingested."""
    job.add("models")
    job.grow(0.5, 0.5)
    job.ingest()
    analyze(Store(job.store).connect(), incremental=True)
    job.grow(1.0, 1.0)
    job.ingest()


@pytest.mark.slow  # many ingest-and-analyze steps, each against a full analysis: the slow tier runs it
def test_incremental_equals_full_after_every_step(bundle, tmp_path, monkeypatch):
    job = Growing(bundle, tmp_path)
    # 1. part of the trace, no model config yet: the decode engine is not sized
    job.grow(0.3, 0.4)
    job.ingest()
    first = _check(job.store)
    assert first["full_run"] and first["seq"] == 1  # no state yet: everything
    # 2. nothing new: nothing recomputed, nothing written
    assert _check(job.store)["seq"] == 1
    # 3. the model config arrives: the engines it sizes change, and their requests are redone
    job.add("models")
    job.grow(0.35, 0.4)
    job.ingest()
    sized = _check(job.store)
    assert not sized["full_run"] and sized["seq"] == 2
    # 4. a few more lines of the trace: only the requests they name are recomputed
    job.grow(0.4, 0.4)
    job.ingest()
    small = _check(job.store)
    assert not small["full_run"] and 0 < small["requests"] < _requests(job.store) / 2
    assert small["windows"] > 0
    # 4b. the decode engine turns out to stage through host memory (a log line says so): every
    # request it served becomes a staging_copy, those of earlier batches too
    before = _findings_of(job.store, "staging_copy")
    (job.input / "decode-0" / "host.log").write_text(
        "(Worker_TP0 pid=300) INFO 04-21 10:05:00 [worker.py:640] Registering KV_Caches. use_mla: False, "
        "kv_buffer_device: cpu, use_host_buffer: True\n"
    )
    job.ingest()
    staged = _check(job.store)
    assert _findings_of(job.store, "staging_copy") > before + 100
    assert staged["requests"] >= _requests(job.store)
    # 5. an ingest killed before its commit: invisible, and the next analysis equals a full one
    original = Store.write_batch

    def killed(self, batch_id, tables, sources):
        for name, table in tables.items():
            if table.num_rows:
                self._write_table(batch_id, table_schema(name), table)
        raise KeyboardInterrupt("killed before the commit")

    job.grow(0.7, 1.0)
    monkeypatch.setattr(Store, "write_batch", killed)
    with pytest.raises(KeyboardInterrupt):
        job.ingest()
    monkeypatch.setattr(Store, "write_batch", original)
    assert _check(job.store)["seq"] == 4  # what the killed ingest wrote is not there: nothing new
    # 6. an analysis killed before its state committed leaves the state as it was
    job.ingest()
    monkeypatch.setattr(Store, "write_batch", killed)
    with pytest.raises(KeyboardInterrupt):
        analyze(Store(job.store).connect(), incremental=True)
    monkeypatch.setattr(Store, "write_batch", original)
    assert _last_run(job.store)["seq"] == 4
    assert _check(job.store)["seq"] == 5
    # 7. the rest, metrics and the rotated logs; then a compaction merges data and state files
    job.add("decode-0/metrics-*", "decode-0/vllm.log.1.gz", "prefill-0/*")
    job.grow(1.0, 1.0)
    job.ingest()
    assert _check(job.store)["seq"] == 6
    assert Store(job.store).compact(min_batches=2) >= 2
    assert _check(job.store)["seq"] == 6  # the state came through the compaction: nothing to redo
    # 8. other thresholds: everything again
    config = tmp_path / "hybridtrace.toml"
    config.write_text("[thresholds]\nslow_rank_ratio = 0.9\nwindow_s = 5\n")
    changed = _check(job.store, config=str(config))
    assert changed["full_run"] and changed["seq"] == 7
    back = _check(job.store)
    assert back["full_run"] and back["seq"] == 8


def test_every_request_rule_is_stored_and_the_others_recomputed():
    from hybridtrace.analyze.incremental import RECOMPUTED_RULES
    from hybridtrace.analyze.rules import RULES

    stored = {r.name for r in STORED_RULES}
    assert stored | set(RECOMPUTED_RULES) == {r.name for r in RULES}
    assert not stored & set(RECOMPUTED_RULES)
    assert all(r.scope.startswith("request") and not r.after_others for r in STORED_RULES)
    # (reported_bytes_excess reads other engines' send rows, not decode handoffs: few, recomputed)
    assert set(RECOMPUTED_RULES) == {
        "slow_rank", "config_mismatch", "native_padding", "native_unexplained", "native_counters",
        "output_mismatch", "reported_bytes_excess",
    }  # fmt: skip


def test_the_sums_kept_as_changes_equal_the_views_they_stand_for(bundle, tmp_path):
    """The views the merged state answers from its counts (byte totals, critical-path leads,
    handoffs with a prefill time, engine pairs, the failures and expiries the trace names, the
    stored findings) give the rows the views over every read give, after a run that replaced
    stored rollups and findings."""
    from hybridtrace.analyze.incremental import incremental_views

    job = Growing(bundle, tmp_path)
    _state_of_half_then_the_rest(job)
    views = (
        "_accounting_totals", "_critical_path_leads", "_critical_path_requests", "_timed_prefill_handoffs",
        "_config_pairs", "_named_trace_events", "_named_events", "_input_counts", "_untraced_interval_bytes",
    )  # fmt: skip

    def rows(con) -> dict[str, list]:
        return {v: sorted(map(repr, con.sql(f"SELECT * FROM {v}").fetchall())) for v in views}

    whole = rows(Store(job.store).connect())
    assert whole["_named_trace_events"] and whole["_accounting_totals"]
    ranked = Store(job.store).connect().sql("SELECT * FROM _rank_windows")
    whole_windows = sorted(map(repr, ranked.fetchall()))
    assert any("None" not in row for row in whole_windows)  # windows whose ranks have peers
    # every input counted (rows naming a request and rows naming none: the log's stats lines)
    counted = Store(job.store).connect().sql("SELECT * EXCLUDE (trace_records_dropped) FROM _input_counts")
    assert 0 not in counted.fetchall()[0]
    con = Store(job.store).connect()
    with incremental_views(con, Store(job.store), full=False, write=False) as run:
        assert not run.full and run.counts["requests"] > 0
        assert rows(con) == whole
        # the slow-rank windows, each rank's peers' median kept with it: those of every read
        windows = run.merged_sources.get("_rank_windows", "_rank_windows")
        merged = sorted(map(repr, con.sql(f"SELECT * FROM {windows}").fetchall()))
        assert merged == whole_windows
        # the engines the trace covers, as the native rules' intervals leave them out
        traced = "SELECT list(DISTINCT engine_id ORDER BY engine_id) FROM "
        assert con.sql(traced + "_transfer_pairs").fetchall() == Store(job.store).connect().sql(
            traced + "transfers"
        ).fetchall() != [([],)]
        # the stored findings' counts, kept as changes, are those of the findings listed
        kept = con.sql("SELECT rule, kind, severity, n FROM _current_finding_counts ORDER BY ALL").fetchall()
        listed = con.sql(
            "SELECT rule, kind, severity, count(*) FROM _current_findings GROUP BY ALL ORDER BY ALL"
        )
        assert kept and kept == listed.fetchall()


def test_a_run_with_nothing_new_reuses_the_last_runs_rows_instead_of_running_the_rules(bundle, tmp_path):
    """With nothing new, the scope tables come from the last committed run: the rows the rules
    would give again (those that name no request, recomputed every run), without running them."""
    from hybridtrace.analyze.incremental import IncrementalRun

    job = Growing(bundle, tmp_path)
    job.add("models", "decode-0/metrics-*")
    job.grow(0.5, 1.0)
    job.ingest()
    analyze(Store(job.store).connect(), incremental=True)
    job.grow(0.6, 1.0)
    job.ingest()
    analyze(Store(job.store).connect(), incremental=True)  # the last committed run: seq 2
    con = Store(job.store).connect()
    from hybridtrace.analyze.thresholds import install, load

    install(con, load(None))
    run = IncrementalRun(con, Store(job.store), full=False)
    run.plan()
    assert run.unchanged() and run.seq == 3
    tables = ("_scope_findings", "_scope_rollups", "_scope_inputs", "_scope_days", "_scope_window_rows")

    def rows() -> dict[str, list]:
        return {t: sorted(map(repr, con.sql(f"SELECT * FROM {t}").fetchall())) for t in tables}

    def columns() -> dict[str, list]:
        return {t: [(d[0], str(d[1])) for d in con.sql(f"SELECT * FROM {t}").description] for t in tables}

    run.compute_scope()
    computed, computed_columns = rows(), columns()
    run.reuse_scope()
    assert rows() == computed and columns() == computed_columns
    # and the analysis' own run takes that path, with the result of a full analysis
    original = IncrementalRun.compute_scope

    def refused(self, **kwargs):
        raise AssertionError("the rules ran with nothing new")

    IncrementalRun.compute_scope = refused
    try:
        assert _check(job.store)["seq"] == 2
    finally:
        IncrementalRun.compute_scope = original


def test_what_the_report_reads_of_the_state_equals_what_it_reads_of_every_read(bundle, tmp_path):
    """The report's views that the scheduled job reads from the merged rollups (each request's
    byte sums, the reads per share, the handoffs' times) give the rows they give over every
    read, after a run that merged new rows with stored ones, with some requests whose reads
    make two shares (a read of a prefill rank of another TP size)."""
    from hybridtrace.analyze.incremental import REPORT_STATE_VIEWS
    from hybridtrace.analyze.view_swap import swapped_views
    from hybridtrace.store.analysis import open_analysis

    job = Growing(bundle, tmp_path)
    mixed = 0
    for i, line in enumerate(job.trace):
        record = json.loads(line)
        if record.get("type") == "transfer" and record.get("rank") == 0 and i % 7 == 0:
            record["remote_tp_size"] = 2 * record["tp_size"]
            job.trace[i] = json.dumps(record) + "\n"
            mixed += 1
    assert mixed > 10
    job.add("decode-0/metrics-*")  # the scrapes' intervals are read from the state too
    _state_of_half_then_the_rest(job)
    con = open_analysis(job.store)
    analyze(con, incremental=True)
    assert _last_run(job.store)["seq"] == 2

    def rows() -> dict[str, list]:
        return {v: sorted(map(repr, con.sql(f"SELECT * FROM {v}").fetchall())) for v in REPORT_STATE_VIEWS}

    whole = rows()
    assert all(whole.values())
    shares = con.sql("SELECT count(DISTINCT share) FROM _report_share_reads").fetchall()[0][0]
    assert shares == 2
    with swapped_views(con, REPORT_STATE_VIEWS):
        assert rows() == whole
        kept = con.sql("SELECT count(*) FROM _merged_requests WHERE shares IS NOT NULL").fetchall()[0][0]
    assert kept > 0  # requests whose reads make two shares, as the state lists them


def test_state_tables_are_partitioned_like_the_data():
    for name in ("analysis_findings", "analysis_requests", "analysis_rank_windows", "analysis_counts"):
        assert table_schema(name).partition == ("day", "engine_id")


def test_cli_full_flag_recomputes_everything(bundle, tmp_path):
    job = Growing(bundle, tmp_path)
    job.add("models")
    job.grow(0.5, 0.5)
    job.ingest()
    runner = CliRunner()
    first = runner.invoke(app, ["analyze", "--store", str(job.store), "--format", "json"])
    assert first.exit_code in (0, 1), first.output
    again = runner.invoke(app, ["analyze", "--store", str(job.store), "--format", "json", "--full"])
    assert again.exit_code == first.exit_code
    assert json.loads(again.output) == json.loads(first.output)
    runs = (
        Store(job.store)
        .connect(with_queries=False)
        .sql("SELECT seq, full_run FROM analysis_runs ORDER BY seq")
        .fetchall()
    )
    assert runs == [(1, True), (2, True)]
    # the state rows sit in (day, engine) partitions, like the tables they summarise
    folders = {p.parent.relative_to(job.store).as_posix().split("/")[0:3][1:] == [] for p in
               (job.store / "analysis_findings").rglob("*.parquet")}  # fmt: skip
    assert folders == {False}
    assert all(p.parent.name.startswith("engine_id=") and p.parent.parent.name.startswith("day=")
               for p in (job.store / "analysis_requests").rglob("*.parquet"))  # fmt: skip


def test_state_of_another_layout_is_recomputed_in_full(bundle, tmp_path, monkeypatch):
    from hybridtrace.analyze import incremental

    job = Growing(bundle, tmp_path)
    job.grow(0.2, 0.2)
    job.ingest()
    assert _check(job.store)["full_run"]
    job.grow(0.25, 0.2)
    job.ingest()
    monkeypatch.setattr(incremental, "STATE_VERSION", incremental.STATE_VERSION + 1)
    later = _check(job.store)
    assert later["full_run"] and later["state_version"] == incremental.STATE_VERSION


def test_a_handoff_judged_by_the_fitted_link_follows_the_fit_when_new_reads_change_it(tmp_path):
    """A request with no read of its own is judged by the link fitted from other reads: new
    reads that change the fit change its finding, though they name no request of it."""
    from test_link_fit import test_a_handoff_only_the_rings_measured_is_judged_by_their_fit as ring_store
    from test_nixl_ring import read as ring_read
    from test_nixl_ring import ring_bytes

    ring_store(tmp_path)  # the store: a decode engine's ring (the fit) and one request without reads
    store = tmp_path / "store"
    first = analyze(Store(store).connect(), incremental=True)
    (fitted,) = [f for f in first.findings if f["kind"] == "recompute_cheaper"]
    # a later snapshot of the same agent's ring: ten more reads, each 20 ms slower than the first ten
    agent = "9a1c3e5f-0b2d-4f6a-8c7e-1d3f5a7b9c0e"
    (tmp_path / "late" / "rings").mkdir(parents=True)
    events = [e for k in range(1, 11) for e in ring_read(50, 30_000 + k * 2_000_000 // 200, k * 2_000_000)]
    (tmp_path / "late" / "rings" / agent).write_bytes(ring_bytes(events, capacity=64))
    ingest([tmp_path / "late"], store, model="nemotron-nano-12b-v2")
    later = _check(store)
    assert not later["full_run"]
    (refitted,) = [f for f in analyze(Store(store).connect()).findings if f["kind"] == "recompute_cheaper"]
    assert refitted["evidence"]["fit_transfers_used"] == 20
    assert refitted["evidence"]["critical_path_s"] > fitted["evidence"]["critical_path_s"]


def test_input_counts_follow_rows_naming_no_request_and_dropped_records_across_runs(tmp_path):
    """The inputs an incremental analysis counts from its state (the rows naming no request as
    the last run found them, changed by what each run adds) equal a full count, run after run:
    a trace writer's dropped records (log events naming no request) arriving in later objects."""
    from tracegen import dropped_record, engine_record, transfer_records, write_jsonl

    t0 = 1764400100.0
    items = [engine_record("decode-0", "decode", 2), *transfer_records(2)]
    write_jsonl(tmp_path / "in" / "a.jsonl", [*items, dropped_record("decode-0", 5, t0 + 60, rank=0)])
    store = tmp_path / "s"
    ingest([str(tmp_path / "in")], str(store), progress=False)
    expected = [5, 12, 12, 20]
    for step, more in enumerate([None, 7, None, 8]):
        if more is not None:
            dropped = dropped_record("decode-0", more, t0 + 61 + step, rank=1)
            write_jsonl(tmp_path / "in" / f"b{step}.jsonl", [dropped])
            ingest([str(tmp_path / "in")], str(store), progress=False)
        incremental = analyze(Store(store).connect(), incremental=True)
        whole = analyze(Store(store).connect())
        assert incremental.inputs == whole.inputs
        assert incremental.inputs["trace_records_dropped"] == expected[step]
        assert incremental.inputs["log_events"] == whole.inputs["log_events"] > 0


def test_a_run_with_nothing_new_answers_with_the_last_runs_result(bundle, tmp_path, monkeypatch):
    """With nothing new since the last run that wrote state, the analysis answers with that run's
    result (its counts, its summary, the findings it recomputed and the stored ones) and runs no
    rule; a run of other code does not, and then stores its own result for the next."""
    import hybridtrace.analyze as analysis
    from hybridtrace.analyze import incremental

    job = Growing(bundle, tmp_path)
    job.add("models", "decode-0/metrics-*")
    job.grow(0.5, 1.0)
    job.ingest()
    first = analyze(Store(job.store).connect(), incremental=True)
    assert len(first) > 0 and _last_run(job.store)["result"] is not None
    with_rules = analysis._analyze

    def refused(*args, **kwargs):
        raise AssertionError("the rules ran with nothing new")

    monkeypatch.setattr(analysis, "_analyze", refused)
    answered = analyze(Store(job.store).connect(), incremental=True)
    monkeypatch.setattr(analysis, "_analyze", with_rules)
    assert _as_text(answered) == _as_text(analyze(Store(job.store).connect()))
    assert _last_run(job.store)["seq"] == 1
    # the report reads the merged rollups the answer leaves
    con = Store(job.store).connect()
    analyze(con, incremental=True)
    assert con.sql("SELECT count(*) FROM _merged_requests").fetchall()[0][0] > 0
    # other code: the rules run, and their result is stored (one run more) for the next run
    monkeypatch.setattr(incremental, "_code", lambda: "another version")
    assert _check(job.store)["seq"] == 2
    monkeypatch.setattr(analysis, "_analyze", refused)
    assert _as_text(analyze(Store(job.store).connect(), incremental=True)) == _as_text(answered)
    # new data: the rules run again
    monkeypatch.setattr(analysis, "_analyze", with_rules)
    job.grow(0.7, 1.0)
    job.ingest()
    monkeypatch.setattr(analysis, "_analyze", refused)
    with pytest.raises(AssertionError, match="the rules ran"):
        analyze(Store(job.store).connect(), incremental=True)


def test_the_native_rules_leave_out_an_engine_once_its_trace_arrives(bundle, tmp_path):
    """An engine known first by its logs and metrics only is judged by the native rules; once
    its trace arrives they leave it out. The merged state tells the traced engines from its
    counts, not from every read: each run equals a full analysis."""

    def untraced(store: Path) -> int:
        return analyze(Store(store).connect()).summary["rules"]["native_padding"]["inputs"]

    job = Growing(bundle, tmp_path)
    job.add("models", "decode-0/metrics-*")
    job.grow(0.0, 1.0)  # the log, no trace
    job.ingest()
    _check(job.store)
    assert untraced(job.store) > 0
    job.grow(0.5, 1.0)
    job.ingest()
    assert not _check(job.store)["full_run"]
    assert untraced(job.store) == 0


def _engine_pairs_before_and_after(bundle: Path, root: Path, lines: list[dict]) -> tuple[int, int]:
    """config_mismatch's inputs (the engine pairs compared) on the whole bundle, then after
    ``lines`` arrive as a trace part of their own; each step's incremental run equals a full
    analysis, and the second is incremental."""

    def pairs(store: Path) -> int:
        return analyze(Store(store).connect()).summary["rules"]["config_mismatch"]["inputs"]

    job = Growing(bundle, root)
    job.add("models")
    job.grow(1.0, 1.0)
    job.ingest()
    _check(job.store)
    before = pairs(job.store)
    (job.input / "decode-0" / "trace.part-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    job.ingest()
    assert not _check(job.store)["full_run"]
    return before, pairs(job.store)


def _failed_record(bundle: Path, request_id: str, remote_engine_id: str) -> dict:
    """A request record naming ``remote_engine_id`` that failed, after the bundle's last line."""
    last = (bundle / "decode-0" / "trace.jsonl").read_text().splitlines()[-1]
    return {
        "type": "request", "v": 1, "ts": json.loads(last)["ts"] + 3.0, "request_id": request_id,
        "remote_request_id": f"{request_id}-p", "engine_id": "decode-0", "remote_engine_id": remote_engine_id,
        "prompt_tokens": 100, "cached_tokens": 0, "missing_tokens": 100, "status": "failed",
    }  # fmt: skip


def test_an_engine_pair_only_a_request_record_names_counts_as_in_a_full_analysis(bundle, tmp_path):
    """A failed handshake leaves a request record naming the prefill engine and no read: the
    pair is compared (config_mismatch's inputs) though no read names it. The merged state
    knows the pairs the records name from its counts, without reading every record: a run
    after such a record equals a full analysis, and counts the pair."""
    before, after = _engine_pairs_before_and_after(
        bundle, tmp_path, [_failed_record(bundle, "cmpl-record-only-0", "prefill-7")]
    )
    assert after == before + 1


def test_a_request_read_from_several_prefill_engines_counts_each_pair_as_a_full_analysis(bundle, tmp_path):
    """A request whose reads name two prefill engines, and whose record names a third, is
    listed with each (the few such requests are listed apart from the others): a run after it
    equals a full analysis, and counts each new pair."""
    trace = (bundle / "decode-0" / "trace.jsonl").read_text().splitlines()
    read = next(json.loads(line) for line in trace if json.loads(line).get("type") == "transfer")
    ts = json.loads(trace[-1])["ts"] + 1.0
    lines = [
        {**read, "ts": ts + n, "request_id": "cmpl-several-0", "rank": rank, "remote_engine_id": remote,
         "status": "ok"}
        for n, (rank, remote) in enumerate([(0, "prefill-7"), (1, "prefill-8")])
    ]  # fmt: skip
    before, after = _engine_pairs_before_and_after(
        bundle, tmp_path, [*lines, _failed_record(bundle, "cmpl-several-0", "prefill-9")]
    )
    assert after == before + 3


def _incremental_after_a_part(bundle: Path, root: Path, lines: list[dict]):
    """The whole bundle analysed in full (the state), then ``lines`` as a trace part of their
    own: the connection of the incremental run after it, which equals a full analysis."""
    job = Growing(bundle, root)
    job.add("models")
    job.grow(1.0, 1.0)
    job.ingest()
    analyze(Store(job.store).connect(), incremental=True, full=True)
    (job.input / "decode-0" / "trace.part-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    job.ingest()
    con = Store(job.store).connect()
    assert _as_text(analyze(con, incremental=True)) == _as_text(analyze(Store(job.store).connect()))
    assert not _last_run(job.store)["full_run"]
    return con


def _ids(con, table: str) -> set[str]:
    return {i for (i,) in con.sql(f"SELECT request_id FROM {table}").fetchall()}


def test_ids_no_earlier_run_saw_are_read_from_the_new_rows_alone(bundle, tmp_path):
    """A new trace part with a request the store never held and one more read of a request it
    holds: the new request's rows are taken from the new batch alone (``_scope_fresh``), the
    old one's from every batch (``_scope_markers``): the run equals a full analysis, which it
    would not if the old request's earlier reads were left out."""
    trace = (bundle / "decode-0" / "trace.jsonl").read_text().splitlines()
    read = next(json.loads(line) for line in trace if json.loads(line).get("type") == "transfer")
    ts = json.loads(trace[-1])["ts"] + 1.0
    con = _incremental_after_a_part(bundle, tmp_path, [
        {**read, "ts": ts, "rank": 7, "status": "ok"},  # the old request's reads grow by one
        {**read, "ts": ts + 1.0, "request_id": "cmpl-fresh-0", "status": "ok"},
        _failed_record(bundle, "cmpl-fresh-1", "prefill-0"),
    ])  # fmt: skip
    fresh, known = _ids(con, "_scope_fresh"), _ids(con, "_scope_markers")
    assert {"cmpl-fresh-0", "cmpl-fresh-1", "cmpl-fresh-1-p"} <= fresh
    assert read["request_id"] in known and not fresh & known


def test_a_record_sharing_a_prefill_id_with_one_a_full_run_analysed_brings_that_one(bundle, tmp_path):
    """A full run's scope holds the request ids of the store, not the prefill ids its records
    name: a new request record naming the prefill id of one the full run analysed finds that
    one's record (``kv_expired`` matches them) although no earlier run had the prefill id in
    scope. Its records' prefill ids are looked up in every file, not only among the new rows,
    where a fresh id's own records are."""
    trace = (bundle / "decode-0" / "trace.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in trace if json.loads(x).get("type") == "request"]
    record = next(r for r in records if r.get("remote_request_id"))
    ts = json.loads(trace[-1])["ts"] + 1.0
    shared = {**record, "ts": ts, "request_id": "cmpl-shares-prefill-0", "status": "expired"}
    con = _incremental_after_a_part(bundle, tmp_path, [shared])
    assert record["request_id"] in _ids(con, "_scope_ids")
    assert record["remote_request_id"] in _ids(con, "_scope_fresh")


def test_only_the_peak_prefill_rate_reads_the_stats_lines_an_incremental_cut_leaves_out():
    """An incremental run's cut keeps the log events naming no request except the engine stats
    lines (a month of them would be copied each run), and reads the peak prefill rate the run
    computed over the whole store: that holds while no other view reads those lines."""
    queries = Path(__file__).resolve().parent.parent / "queries"
    readers, callers = set(), set()
    for sql in sorted(queries.glob("*.sql")):
        for statement in re.split(r"CREATE OR REPLACE (?:VIEW|MACRO) ", sql.read_text())[1:]:
            if "engine_stats" in statement:
                readers.add(statement.split()[0])
            if "_peak_prefill_rate_of(" in statement.split("AS", 1)[1]:
                callers.add(statement.split()[0])
    # the lines' peak is spelled once (the macro); the view is it over every line
    assert readers == {"_peak_prefill_rate_of(lines)"}
    assert callers == {"_peak_prefill_rate"}


def test_the_peak_prefill_rates_kept_in_the_state_are_those_of_every_line(bundle, tmp_path, monkeypatch):
    """A run keeps each engine's peak prefill rate: the next adds the new reads' stats lines to
    it instead of reading every line again. A new vLLM log may rename an engine and move older
    lines: then every line is read (here the log renames nothing, so the kept peaks, forced,
    must also give what every line gives)."""
    from hybridtrace.analyze import incremental

    def peaks_of_every_line() -> dict:
        con = Store(job.store).connect()
        return dict(con.sql("SELECT engine_id, tokens_per_s FROM _peak_prefill_rate").fetchall())

    job = Growing(bundle, tmp_path)
    job.add("models")
    job.grow(0.5, 0.5)
    job.ingest()
    assert _check(job.store)["full_run"]
    assert json.loads(_last_run(job.store)["peak_prefill_rates"]) == peaks_of_every_line() != {}
    # the trace alone grows: the kept peaks, no stats line read
    job.grow_trace(0.6)
    job.ingest()
    kept = _check(job.store)
    assert not kept["full_run"] and json.loads(kept["peak_prefill_rates"]) == peaks_of_every_line()
    # the log grows and one new line beats every peak: read from the new lines beside the kept
    # peaks (the vLLM log's possible renames set aside), and every line gives the same
    monkeypatch.setattr(incremental, "_NEW_LOG_READS", "SELECT 0")
    job.grow(0.6, 1.0)
    with (job.input / "decode-0" / "vllm.log").open("a") as log:
        log.write("(APIServer pid=1) INFO 04-21 11:00:10 [loggers.py:236] Engine 000: Avg prompt throughput: "
                  "98765.5 tokens/s, Avg generation throughput: 120.0 tokens/s, Running: 30 reqs, Waiting: 0 "
                  "reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%\n")  # fmt: skip
    job.ingest()
    added = _check(job.store)
    peaks = json.loads(added["peak_prefill_rates"])
    assert not added["full_run"] and peaks == peaks_of_every_line() and 98765.5 in peaks.values()


def test_a_run_whose_new_object_is_trace_only_reads_no_stats_line(bundle, tmp_path):
    """The peaks the state keeps stand in for every stats line wherever an incremental run
    reads a peak prefill rate: in its scope and in the analysis of the merged state (the
    handoffs judged by the fitted link estimate their prefill from it). A week of lines would
    otherwise be parsed again each run. Here reading the view over every line fails the run."""
    job = Growing(bundle, tmp_path)
    job.add("models")
    job.grow(0.5, 1.0)
    job.ingest()
    assert _check(job.store)["full_run"]
    job.grow_trace(0.6)
    job.ingest()
    con = Store(job.store).connect()
    con.execute(
        "CREATE OR REPLACE VIEW _peak_prefill_rate AS SELECT engine_id, "
        "CAST(error('every stats line read again: ' || details) AS DOUBLE) AS tokens_per_s "
        "FROM log_events WHERE kind = 'engine_stats'"
    )
    incremental = analyze(con, incremental=True)
    assert not _last_run(job.store)["full_run"]
    assert _as_text(incremental) == _as_text(analyze(Store(job.store).connect()))
    assert incremental.summary["rules"]["recompute_cheaper"]["inputs"] > 0


def test_a_log_that_names_its_engine_later_moves_its_peak_to_that_engine(bundle, tmp_path):
    """A log read before its `Initializing NIXL worker` line files its stats lines under its
    folder's name; once a later read names the engine, those lines are that engine's. The
    peaks kept in the state are keyed by the old name then: a new vLLM log makes the run read
    every line again, and the engine's peak is the moved line's."""

    def peaks_of_every_line() -> dict:
        con = Store(job.store).connect()
        return dict(con.sql("SELECT engine_id, tokens_per_s FROM _peak_prefill_rate").fetchall())

    stats = ("(APIServer pid=1) INFO 04-21 10:00:10 [loggers.py:236] Engine 000: Avg prompt throughput: "
             "99999.5 tokens/s, Avg generation throughput: 120.0 tokens/s, Running: 30 reqs, Waiting: 0 "
             "reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%\n")  # fmt: skip
    job = Growing(bundle, tmp_path)
    job.add("models")
    job.grow(0.5, 1.0)
    log = job.input / "host-a" / "vllm.log"
    log.parent.mkdir()
    log.write_text(stats)
    job.ingest()
    assert _check(job.store)["full_run"]
    assert peaks_of_every_line()["host-a"] == 99999.5
    with log.open("a") as handle:
        handle.write("(Worker_TP0 pid=305) INFO 04-21 10:00:20 [worker.py:100] "
                     "Initializing NIXL worker decode-0\n")
    job.ingest()
    moved = _check(job.store)
    assert not moved["full_run"]
    peaks = json.loads(moved["peak_prefill_rates"])
    assert peaks == peaks_of_every_line() and peaks["decode-0"] == 99999.5 and "host-a" not in peaks
