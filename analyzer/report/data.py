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

from hybridtrace.analyze import SHARED_VIEWS, Analysis, analyze, materialized
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


# What the report's own views read of the views the analysis shares (queries/report.sql, the
# slow-rank rule it lists and transfer_vs_recompute): computed once for all of them. Every
# read's byte counts (transfer_bytes) are not among them: after an incremental analysis the
# report reads each request's sums from its state, and sizes the reads of the few requests
# it draws only (``_drawn_requests_only``).
REPORT_VIEWS = ("_request_reads", "handoffs", "intervals", "_rank_windows")
# The report's own views that several of its sections read (the link fits' lines are drawn
# through their points).
REPORT_OWN_VIEWS = ("_report_request_sums", "_report_share_reads", "report_link_fit_points")


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
            stack.enter_context(materialized(con, REPORT_VIEWS + REPORT_OWN_VIEWS))
            data = _gather(con, analysis, store, drawn_only=stateful)
    else:
        # the analysis and the report views share one computation of the views both read
        with materialized(con, SHARED_VIEWS + REPORT_OWN_VIEWS):
            analysis = analyze(con, config=config, scope=scope)
            data = _gather(con, analysis, store, drawn_only=False)
    data.kind_groups = kind_groups(analysis, KIND_EXAMPLES)
    for finding in [*data.findings, *(f for g in data.kind_groups for f in g["worst"])]:
        evidence = finding["evidence"].items()
        finding["evidence_text"] = ", ".join(f"{k} {_evidence_value(v)}" for k, v in evidence)
    return data


# The reads report_reads draws (as it picks them): their requests are the only ones it sizes.
_DRAWN_READS = (
    "SELECT request_id FROM transfers WHERE status = 'ok' "
    "ORDER BY hash(engine_id, request_id, rank, remote_rank), request_id LIMIT 4000"
)


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
        f"SELECT request_id FROM _report_requests UNION ALL ({_DRAWN_READS}))"
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
    with ExitStack() as stack:
        if drawn_only:
            stack.enter_context(_drawn_requests_only(con))
        # requests of equal excess (and each request's rows) in one order, run after run
        request_bytes = rows(
            con,
            "SELECT * FROM report_request_cache_bytes "
            "ORDER BY excess_bytes DESC, engine_id, request_id, measure, cache",
        )
        reads = rows(con, "SELECT * FROM report_reads")
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
            "handoffs_compared": _scalar(
                con,
                "SELECT count(*) FROM handoffs WHERE critical_path_s IS NOT NULL AND prefill_s IS NOT NULL",
            ),
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
    table = analysis.table
    if not table.num_rows:
        return []
    kinds = table["kind"].to_pylist()
    severities = table["severity"].to_pylist()
    first: dict[str, list[int]] = {}
    by_severity: dict[str, dict[str, int]] = {}
    for index, (kind, severity) in enumerate(zip(kinds, severities, strict=True)):
        if len(first.setdefault(kind, [])) < examples:
            first[kind].append(index)
        counts = by_severity.setdefault(kind, {})
        counts[severity] = counts.get(severity, 0) + 1
    groups = []
    for kind in report_kinds(dict.fromkeys(first, 1)):
        if kind not in first:
            continue
        order = sorted(by_severity[kind].items(), key=lambda item: _SEVERITY_ORDER.get(item[0], 9))
        severity_counts = dict(order)
        groups.append({
            "kind": kind,
            "count": sum(severity_counts.values()),
            "by_severity": severity_counts,
            "worst": Analysis(table.take(first[kind]), analysis.inputs).rows(),
        })  # fmt: skip
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
    table = analysis.table
    if table.num_rows <= limit:
        return analysis.rows()
    kinds = table["kind"].to_pylist()
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
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
    taken = dict.fromkeys(counts, 0)
    keep = []
    for index, kind in enumerate(kinds):
        if taken[kind] < quota[kind]:
            taken[kind] += 1
            keep.append(index)
    return Analysis(table.take(keep), analysis.inputs).rows()
