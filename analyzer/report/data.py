"""What the report shows, read from the store's views: no byte count is made here.

``collect`` runs the analysis and the ``report_*`` views of ``queries/report.sql`` (which
sample and aggregate), and returns plain rows for the charts and tables. Every section
says how many rows it drew from, so a sampled chart never passes for the whole store.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.analyze import (
    HELD_SOURCES,
    SHARED_VIEWS,
    Analysis,
    analyze,
    kind_rows,
    materialized,
    rows_at,
)
from hybridtrace.analyze.incremental import cut_to_requests
from hybridtrace.analyze.rules import report_kinds
from hybridtrace.analyze.view_swap import swapped_views

# How many findings the page lists; the rest are counted, and `analyze --format csv` has all.
FINDINGS_SHOWN = 500
# How many findings of each kind the grouped view above the table shows, most severe first.
KIND_EXAMPLES = 3
# How many verify runs, and prompts whose outputs parted, the page lists (newest first).
VERIFY_RUNS_SHOWN = 20
VERIFY_ROWS_SHOWN = 200


@dataclass
class ReportData:
    """Everything a report template or chart needs, as plain Python values."""

    store: str
    generated: str
    analysis: Analysis
    thresholds: dict[str, float]
    engines: list[dict]
    request_bytes: list[dict]
    reads: list[dict]
    model_lines: list[dict]
    ranks: list[dict]
    recompute: list[dict]
    intervals: list[dict]
    findings: list[dict]
    counts: dict[str, int] = field(default_factory=dict)
    # one entry per kind found: kind, count, by_severity, worst (its first findings)
    kind_groups: list[dict] = field(default_factory=list)
    kind_examples: int = KIND_EXAMPLES
    verification_runs: list[dict] = field(default_factory=list)
    verifications: list[dict] = field(default_factory=list)  # the prompts whose outputs parted
    # the link fitted per decode rank: sampled reads (bytes, time) and each fit's line
    link_fit_points: list[dict] = field(default_factory=list)
    link_fit_lines: list[dict] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        return self.analysis.summary

    @property
    def inputs(self) -> dict:
        return self.analysis.inputs


def _plain(value):
    """A value JSON and templates take as is (DuckDB hands back Decimals for some sums)."""
    if isinstance(value, Decimal):
        return float(value) if value % 1 else int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    relation = con.execute(sql, params or [])
    columns = [d[0] for d in relation.description]
    return [{c: _plain(v) for c, v in zip(columns, row, strict=True)} for row in relation.fetchall()]


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return con.execute(sql).fetchall()[0][0] or 0


# The report's own views that several of its sections read (the link fits' lines are drawn
# through their points), computed once.
REPORT_OWN_VIEWS = (
    "_report_request_sums",
    # the requests the bytes chart draws: its reads and the cut to the drawn requests both
    # read them, and each would rank every request again
    "_report_requests",
    "_report_share_reads",
    "report_link_fit_points",
)
# What the report reads of the views the analysis shares, after an incremental analysis: the
# rest (each request's byte sums, the handoffs' times) it reads from the analysis state, and
# it sizes the reads of the few requests it draws only (``_drawn_requests_only``), so that a
# scheduled run reads no view over every read of the store.
STATE_REPORT_VIEWS = ("intervals", "_handoff_times")
# The slow ranks report_ranks marks: those the analysis found, not the rule run again.
_SLOW_RANKS = "_report_slow_rank_findings"


def collect(
    con: duckdb.DuckDBPyConnection,
    *,
    store: str,
    config: str | None = None,
    scope: Callable | None = None,
    incremental: bool = False,
) -> ReportData:
    """Analyse the store behind ``con`` (from ``open_analysis``) and gather every section of the report.

    ``scope`` as ``analyze`` takes it: the request-scope rules computed on Spark.
    ``incremental`` analyses as ``hybridtrace analyze`` does, keeping its state in the store
    and recomputing only what new batches touch (the scheduled job's runs); the report's own
    sections then read each request's sums from that state, and compute only the shared views
    they read. The findings and every section are the same either way.
    """
    if incremental:
        from hybridtrace.analyze.incremental import REPORT_STATE_VIEWS, store_of

        analysis = analyze(con, config=config, scope=scope, incremental=True)
        with ExitStack() as stack:
            stateful = store_of(con) is not None  # else the analysis ran in full, keeping no state
            if stateful:
                stack.enter_context(swapped_views(con, REPORT_STATE_VIEWS))
            views = (STATE_REPORT_VIEWS if stateful else SHARED_VIEWS) + REPORT_OWN_VIEWS
            stack.enter_context(materialized(con, views, None if stateful else HELD_SOURCES))
            data = _gather(con, analysis, store, drawn_only=stateful)
    else:
        # the analysis and the report views share one computation of the views both read
        with materialized(con, SHARED_VIEWS + REPORT_OWN_VIEWS, HELD_SOURCES):
            analysis = analyze(con, config=config, scope=scope)
            data = _gather(con, analysis, store, drawn_only=False)
    data.kind_groups = kind_groups(analysis, KIND_EXAMPLES)
    for finding in [*data.findings, *(f for g in data.kind_groups for f in g["worst"])]:
        evidence = finding["evidence"].items()
        finding["evidence_text"] = ", ".join(f"{k} {_evidence_value(v)}" for k, v in evidence)
    return data


@contextmanager
def _drawn_requests_only(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """The reads and request records cut to the requests the two per-request sections draw.

    Both pick their requests from every request (by excess bytes and by hash) and then size
    their reads; a request's reads are sized from its own rows, and the requests each picks
    from all are among those it picks from the cut (none outranks them there), so the rows
    are the same, and only the reads of a few thousand requests are sized.
    """
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _report_drawn AS SELECT DISTINCT request_id FROM ("
        "SELECT request_id FROM _report_requests UNION ALL SELECT request_id FROM _report_read_sample)"
    )
    try:
        with cut_to_requests(con, "_report_drawn", ("transfers", "requests")):
            yield
    finally:
        con.execute("DROP TABLE IF EXISTS _report_drawn")


def _gather(
    con: duckdb.DuckDBPyConnection, analysis: Analysis, store: str, *, drawn_only: bool
) -> ReportData:
    """Every section of the report, on views as ``collect`` arranged them."""
    con.register(_SLOW_RANKS, analysis.of_kind("slow_rank", ["engine_id", "rank"]))
    with ExitStack() as stack:
        stack.callback(con.unregister, _SLOW_RANKS)
        stack.enter_context(
            swapped_views(con, {"_report_slow_ranks": f"SELECT DISTINCT engine_id, rank FROM {_SLOW_RANKS}"})
        )
        with ExitStack() as drawn:
            if drawn_only:
                drawn.enter_context(_drawn_requests_only(con))
            # requests of equal excess (and each request's rows) in one order, run after run
            request_bytes = rows(
                con,
                "SELECT * FROM report_request_cache_bytes "
                "ORDER BY excess_bytes DESC, engine_id, request_id, measure, cache",
            )
            reads = rows(con, "SELECT * FROM report_reads")
        return _sections(con, analysis, store, request_bytes, reads)


def _sections(
    con: duckdb.DuckDBPyConnection,
    analysis: Analysis,
    store: str,
    request_bytes: list[dict],
    reads: list[dict],
) -> ReportData:
    """The report's data: the two per-request sections given, every other one read here."""
    # the thresholds the rules just read (the analysis installs those of ``config``)
    thresholds = dict(con.execute("SELECT name, value FROM _thresholds").fetchall())
    return ReportData(
        store=store,
        generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        analysis=analysis,
        thresholds=thresholds,
        engines=rows(con, "SELECT * FROM report_engines"),
        request_bytes=request_bytes,
        reads=reads,
        model_lines=rows(con, "SELECT * FROM report_model_lines ORDER BY engine_id, tokens"),
        ranks=rows(con, "SELECT * FROM report_ranks"),
        recompute=rows(con, "SELECT * FROM report_recompute ORDER BY engine_id, bucket_order"),
        intervals=rows(con, "SELECT * FROM report_intervals"),
        link_fit_points=rows(con, "SELECT * FROM report_link_fit_points"),
        link_fit_lines=rows(con, "SELECT * FROM report_link_fit_lines"),
        findings=shown_findings(analysis, FINDINGS_SHOWN),
        counts={
            "requests_accounted": _scalar(
                con, "SELECT count(*) FROM _report_request_sums WHERE reads_ok > 0"
            ),
            "reads_ok": _scalar(con, "SELECT sum(reads_ok) FROM _report_request_sums"),
            "handoffs_compared": _scalar(con, "SELECT count(*) FROM _handoff_times"),
            "intervals": _scalar(con, "SELECT count(*) FROM intervals"),
            "link_fit_reads": _scalar(con, "SELECT sum(transfers_used) FROM link_fits WHERE scope = 'rank'"),
            "findings": len(analysis),
            "verifications": _scalar(con, "SELECT count(*) FROM verifications"),
            "verifications_parted": _scalar(
                con, "SELECT count(*) FROM verifications WHERE status <> 'match'"
            ),
        },
        verification_runs=rows(
            con, f"SELECT * FROM verification_runs ORDER BY started_ts DESC LIMIT {VERIFY_RUNS_SHOWN}"
        ),
        verifications=rows(
            con,
            "SELECT run_id, prompt_index, prompt_id, status, first_divergence, tokens_compared, "
            "control_top_gap, max_logprob_diff, pd_response_id, engine_id, request_id, error "
            "FROM verification_handoffs WHERE status IN ('mismatch', 'near_tie', 'error') "
            "ORDER BY CASE status WHEN 'mismatch' THEN 0 WHEN 'error' THEN 1 ELSE 2 END, ts DESC "
            f"LIMIT {VERIFY_ROWS_SHOWN}",
        ),
    )


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def kind_groups(analysis: Analysis, examples: int) -> list[dict]:
    """Every kind found: how many findings, how many of each severity, and its ``examples`` worst.

    The analysis sorts findings by severity first, so a kind's first rows are its most
    severe; every count is over all findings, not only the ones the page lists.
    """
    by_severity: dict[str, dict[str, int]] = {}
    for kind, severity, n in analysis.kind_counts():
        by_severity.setdefault(kind, {})[severity] = n
    if not by_severity:
        return []
    # each kind's first rows, in the analysis' order (not every finding sorted)
    head = analysis.head_of_each_kind(examples)
    indices = kind_rows(head)
    kinds = [kind for kind in report_kinds(dict.fromkeys(indices, 1)) if kind in indices]
    # every kind's worst rows in one take (a take from a table of many chunks costs per call)
    first = pa.concat_arrays([indices[k][0][:examples] for k in kinds])
    worst = Analysis(rows_at(head, first), analysis.inputs)
    rows = worst.rows()
    groups = []
    for kind in kinds:
        order = sorted(by_severity[kind].items(), key=lambda item: _SEVERITY_ORDER.get(item[0], 9))
        severity_counts = dict(order)
        count = sum(severity_counts.values())
        shown = min(examples, count)
        groups.append({
            "kind": kind,
            "count": count,
            "by_severity": severity_counts,
            "worst": rows[:shown],
        })  # fmt: skip
        rows = rows[shown:]
    # the most severe kinds first, then the most frequent
    groups.sort(key=lambda g: (_SEVERITY_ORDER.get(next(iter(g["by_severity"])), 9), -g["count"]))
    return groups


def _evidence_value(value: object) -> str:
    """One evidence value as a person reads it: JSON for lists, a dash for nothing."""
    if value is None:
        return "–"
    if isinstance(value, (list, dict, bool)):
        return json.dumps(value)
    return str(value)


def shown_findings(analysis: Analysis, limit: int) -> list[dict]:
    """At most ``limit`` findings, most severe first, with every kind found among them.

    The first ``limit`` rows alone would hold only the most frequent kinds of the highest
    severities; each kind gets an equal part instead (a kind with fewer findings leaves its
    part to the others), and the rows keep the analysis' order.
    """
    if len(analysis) <= limit:
        return analysis.rows()
    # each kind's first rows (as many as the page could show of it), in the analysis' order
    table = analysis.head_of_each_kind(limit)
    indices = kind_rows(table)
    totals: dict[str, int] = {}
    for kind, _, n in analysis.kind_counts():
        totals[kind] = totals.get(kind, 0) + n
    counts = {kind: totals[kind] for kind in indices}
    quota = dict.fromkeys(counts, 0)
    left = limit
    while left > 0:
        open_kinds = [k for k in counts if quota[k] < counts[k]]
        share = max(1, left // len(open_kinds))
        for kind in open_kinds:
            take = min(share, counts[kind] - quota[kind], left)
            quota[kind] += take
            left -= take
            if not left:
                break
    # each kind's first rows, back in the analysis' order
    chosen = pa.concat_arrays([indices[kind][0][:n] for kind, n in quota.items()])
    return Analysis(rows_at(table, pc.take(chosen, pc.array_sort_indices(chosen))), analysis.inputs).rows()
