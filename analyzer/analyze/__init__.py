"""The analyzer: findings from the store's views, with the inputs they rest on.

Every rule is a ``finding_<name>`` view in ``queries/``, declared in the registry
(``rules.py``); this module runs them, counts the inputs each could see, and shapes the
result as ``analyze --format json`` prints it. It computes nothing itself: byte counts and
verdicts live in SQL.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from itertools import count as _counter
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from hybridtrace.analyze.rules import CONTRACT_KINDS as KINDS
from hybridtrace.analyze.rules import FINDING_COLUMN_NAMES, RULES, RULES_BY_NAME, VERIFY_KINDS
from hybridtrace.analyze.thresholds import install as install_thresholds
from hybridtrace.analyze.thresholds import load as load_thresholds
from hybridtrace.analyze.view_swap import catalog_objects, swapped_views

if TYPE_CHECKING:
    from hybridtrace.analyze.incremental import IncrementalRun

__all__ = ["HELD_SOURCES", "KINDS", "Analysis", "analyze", "kind_rows", "materialized", "rows_at"]

# The rules run together, and those that read the others' findings once those are in.
_FIRST_RULES = tuple(r for r in RULES if not r.after_others)
_LATER_RULES = tuple(r for r in RULES if r.after_others)
# Kinds counted in findings_by_kind even when nothing raised them.
_COUNTED_KINDS = KINDS + VERIFY_KINDS
# The input tables counted; those of them that grow with the requests are read from
# ``_input_counts`` (an incremental analysis keeps them as counters), the others counted.
_INPUT_TABLES = (
    "transfers",
    "requests",
    "engines",
    "intervals",
    "log_events",
    "prom_samples",
    "engine_models",
    "verifications",
)
_COUNTED_INPUTS = ("transfers", "requests", "log_events")


# Views several rules read: computed once per analysis instead of once per rule, in this
# order (each reads the ones before it). Every read's byte counts (transfer_bytes) are not
# among them: materialising 25 columns of every read costs more than the one pass over it
# that the analysis makes (the reads of the requests that can hold excess bytes; the totals
# are summed from each request's reads grouped once). The report, which reads them more
# often, adds them. Nor are handoffs and the sized requests: each is a projection of the
# request rows (a request record beside its reads), and a copy of a million of them costs
# more than the two or three scans the rules make of the rows.
ANALYSIS_VIEWS = (
    "_unusual_reads",
    "_request_reads",
    "_request_rows",
    "_unsuccessful_requests",
    "_accounting_totals",
    "_input_counts",
    "_excess_request_model",
    "_excess_reads",
    "_untimed_handoffs",
    "_prom_deltas",
    "intervals",
    "_untraced_interval_bytes",
    "_rank_windows",
    "_config_pairs",
)
SHARED_VIEWS = ("transfer_bytes", *ANALYSIS_VIEWS, "handoffs")  # the report reads handoffs often
# What an analysis computes two of them from, once it holds each request's reads grouped and
# its records beside them: a filter and three sums over those rows instead of a scan of every
# read's and every record's status (a tenth of the analysis of a store of a million requests).
HELD_SOURCES = {
    "_unsuccessful_requests": "_unsuccessful_request_rows",
    "_input_counts": "_input_counts_of_rows",
}
# What the rules read of ``intervals`` (native_bytes.sql): an analysis materializes these
# columns only. The log lines' hashes, processes, sources and percentiles are for the report
# (which materializes the whole view, SHARED_VIEWS), and copying them cost more than the
# window that gives each log interval its start (a week of one engine's intervals: 180 ms,
# against 80 for these). A rule that reads another column fails to bind in every test.
_RULE_INTERVALS = (
    "(SELECT engine_id, source_kind, start_ts, end_ts, transfers, transported_bytes, avg_mib_per_transfer, "
    "failed_transfers, expired_requests FROM intervals)"
)
ANALYSIS_SOURCES = {**HELD_SOURCES, "intervals": _RULE_INTERVALS}
# The same for an incremental analysis, whose rules run on the merged state: what they read
# is small there, and what costs is planning each rule with every view it reads expanded in
# it (a few milliseconds a view, many times over); a table is planned as one.
MERGED_VIEWS = (
    "_accounting_totals",
    "_input_counts",
    "intervals",
    "_untraced_interval_bytes",
    "_counted_events",
    "_named_events",
    "_engine_settings",
    "_handshake_mismatches",
    "_rank_windows",
    "_rank_fit_verdicts",
    "_other_engines",
    "_config_pairs",
)

_ORDER_TERMS = (
    "CASE severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 WHEN 'info' THEN 2 ELSE 9 END",
    "kind", "coalesce(engine_id, '')", "coalesce(request_id, '')", "coalesce(rank, -1)",
    # findings equal on all of the above (one request's failures from two prefill engines)
    # keep one order, so that two analyses of one store list them alike
    "coalesce(remote_engine_id, '')", "message", "evidence",
)  # fmt: skip
_ORDER_BY = ", ".join(_ORDER_TERMS)
# The same order as one value, for the aggregates that keep a kind's first rows
# (``Analysis.head_of_each_kind``): a null term after every value, as ORDER BY puts it.
_ORDER_KEY = "{" + ", ".join(f"'n{i}': ({t}) IS NULL, 'v{i}': {t}" for i, t in enumerate(_ORDER_TERMS)) + "}"
_COLUMNS = ", ".join(FINDING_COLUMN_NAMES)
_RESULTS = _counter(1)  # names the findings tables of the analyses of one process
_SNAPSHOTS = _counter(1)  # names the tables materialized() computes views into
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
# Per connection, the analyses whose findings are not read yet (``_settle``).
_UNREAD: dict[int, weakref.WeakSet] = {}


@contextmanager
def materialized(
    con: duckdb.DuckDBPyConnection,
    names: tuple[str, ...] = SHARED_VIEWS,
    sources: dict[str, str] | None = None,
) -> Iterator[None]:
    """Compute each named view once, let every view that reads it read the result, then undo.

    ``sources`` names, for some of them, another relation that gives the same rows and is
    computed instead (``HELD_SOURCES``).

    The result is a temporary table of the view's own name: DuckDB looks a name up in the
    temporary schema first when a query runs, so every rule that reads ``transfer_bytes``
    reads the table, and dropping it brings the view back (``view_swap``). A name that is
    temporary already is either a table an enclosing call computed (kept as it is) or a view
    something swapped in (the incremental analysis' merged state): that one is moved aside for
    the duration, and the table computed from it.
    """
    sources = sources or {}
    with ExitStack() as stack:  # undone last to first
        known: tuple[set[str], dict[str, str]] | None = None  # looked up once one create fails
        for name in names:
            if known is None:
                try:
                    # bound before the table exists: the view it shadows from now on
                    con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {sources.get(name, name)}")
                    stack.callback(con.execute, f"DROP TABLE temp.main.{name}")
                    continue
                except duckdb.CatalogException:
                    known = catalog_objects(con, list(names))
                    if name in known[0] and name not in known[1]:
                        raise  # the view itself failed
            views, temporary = known
            if name not in views or temporary.get(name) == "TABLE":
                continue  # no such view, or an enclosing call holds it already
            source = sources.get(name, name)
            if name in temporary:
                source = f"_snapshot_{name}_{next(_SNAPSHOTS)}"
                con.execute(f"ALTER VIEW temp.main.{name} RENAME TO {source}")
                stack.callback(con.execute, f"ALTER VIEW temp.main.{source} RENAME TO {name}")
            con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {source}")
            stack.callback(con.execute, f"DROP TABLE temp.main.{name}")
        yield


def kind_rows(table: pa.Table) -> dict[str, tuple[pa.Array, int]]:
    """Each kind of a findings table in the order its first finding comes: the row indices of
    its findings (in table order) and how many there are. Vectorized, on dictionary codes: a
    page lists a few rows of hundreds of thousands."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(table["kind"]).combine_chunks()
    names, codes = encoded.dictionary.to_pylist(), encoded.indices
    found = pc.value_counts(codes)  # in the order each code first comes
    counted = zip(found.field("values").to_pylist(), found.field("counts").to_pylist(), strict=True)
    return {names[code]: (pc.indices_nonzero(pc.equal(codes, code)), count) for code, count in counted}


def rows_at(table: pa.Table, indices: pa.Array | list[int]) -> pa.Table:
    """The rows of ``table`` at ``indices`` (a few hundred): sliced one by one, since a take
    from a table of many chunks joins every chunk of every column first."""
    at = indices if isinstance(indices, list) else indices.to_pylist()
    picked = [table.slice(i, 1) for i in at]
    return pa.concat_tables(picked).combine_chunks() if picked else table.slice(0, 0)


def _first_of_each_kind(table: pa.Table, limit: int) -> pa.Table:
    """The first ``limit`` rows of each kind of ``table`` (findings in the analysis' order), in that order."""
    firsts = [indices.slice(0, limit).to_pylist() for indices, _ in kind_rows(table).values()]
    return rows_at(table, sorted(i for first in firsts for i in first))


class Analysis:
    """Findings (an Arrow table, sorted by severity), the inputs counted and the summary.

    The findings can be given as a table, or left in the connection as a temporary table
    that is sorted only when all of it is asked for: the text output shows the first
    findings of hundreds of thousands, and the first few come out of a top-k, not a sort.
    """

    def __init__(
        self,
        table: pa.Table | None,
        inputs: dict[str, int],
        summary: dict | None = None,
        *,
        source: tuple[duckdb.DuckDBPyConnection, str] | None = None,
    ) -> None:
        if (table is None) == (source is None):
            raise ValueError("an Analysis takes its findings as a table or as a source, one of the two")
        self._table = table
        self._source = source  # (connection, temporary table of the unsorted findings)
        self.inputs = inputs
        self.summary = summary if summary is not None else {}
        self._rows: list[dict] | None = None
        self._head: tuple[int, pa.Table] | None = None  # (limit, head_of_each_kind(limit))
        self._counts: list[tuple[str, str, int]] | None = None  # kind_counts()

    def __repr__(self) -> str:
        return f"Analysis({len(self)} findings, inputs={self.inputs!r})"

    @property
    def source_name(self) -> str | None:
        """The temporary table or view the findings are read from until they are sorted."""
        return self._source[1] if self._source is not None else None

    @property
    def table(self) -> pa.Table:
        """Every finding, in the order ``analyze --format json`` lists them."""
        if self._table is None:
            self._table = self._sorted()
            con, name = self._source  # type: ignore[misc]
            kind = con.execute(
                "SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND temporary", [name]
            ).fetchall()[0][0]
            if kind:  # a view over this run's findings and the stored ones
                con.execute(f"DROP VIEW {name}")
                con.execute(f"DROP TABLE IF EXISTS {name}_new")
            else:
                con.execute(f"DROP TABLE IF EXISTS {name}")
            self._source = None
        return self._table

    def head_of_each_kind(self, limit: int) -> pa.Table:
        """Each kind's first ``limit`` findings, in the order ``table`` lists them: what a page
        shows of each kind. Findings not sorted yet are not sorted for it: each kind's first
        rows are kept as the findings stream by (a report of half a million findings spent a
        second sorting them all). The heads are kept: a smaller limit is read from them."""
        if self._table is not None:
            return _first_of_each_kind(self._table, limit)
        if self._head is not None and self._head[0] >= limit:
            return _first_of_each_kind(self._head[1], limit)
        con, name = self._source  # type: ignore[misc]
        row = "{" + ", ".join(f"'{c}': {c}" for c in FINDING_COLUMN_NAMES) + "}"
        firsts = f"arg_min({row}, {_ORDER_KEY}, {int(limit)})"
        got = con.sql(
            f"SELECT {_COLUMNS} FROM (SELECT unnest({firsts}, recursive := true) FROM {name} GROUP BY kind) "
            f"ORDER BY {_ORDER_BY}"
        ).arrow()
        head = got.read_all() if isinstance(got, pa.RecordBatchReader) else got
        self._head = (limit, head)
        return head

    def kind_counts(self) -> list[tuple[str, str, int]]:
        """(kind, severity, findings) for every pair found."""
        if self._counts is not None:
            return self._counts
        if self._table is not None:
            pairs = self._table.group_by(["kind", "severity"], use_threads=False)
            counted = pairs.aggregate([([], "count_all")])
            columns = (counted[c].to_pylist() for c in ("kind", "severity", "count_all"))
            self._counts = list(zip(*columns, strict=True))
        else:
            con, name = self._source  # type: ignore[misc]
            self._counts = con.execute(f"SELECT kind, severity, count(*) FROM {name} GROUP BY ALL").fetchall()
        return self._counts

    def of_kind(self, kind: str, columns: list[str]) -> pa.Table:
        """``columns`` of the findings of ``kind``, in no order."""
        import pyarrow.compute as pc

        if self._table is not None:
            return self._table.filter(pc.equal(self._table["kind"], kind)).select(columns)
        con, name = self._source  # type: ignore[misc]
        query = f"SELECT {', '.join(columns)} FROM {name} WHERE kind = $kind"
        got = con.sql(query, params={"kind": kind}).arrow()
        return got.read_all() if isinstance(got, pa.RecordBatchReader) else got

    def _sorted(self, limit: int | None = None) -> pa.Table:
        con, name = self._source  # type: ignore[misc]
        cut = f" LIMIT {int(limit)}" if limit is not None else ""
        got = con.sql(f"SELECT {_COLUMNS} FROM {name} ORDER BY {_ORDER_BY}{cut}").arrow()
        return got.read_all() if isinstance(got, pa.RecordBatchReader) else got

    @property
    def findings(self) -> list[dict]:
        """Every finding as a dict, evidence parsed (built on first use: can be large)."""
        if self._rows is None:
            self._rows = self.rows()
        return self._rows

    def rows(self, limit: int | None = None) -> list[dict]:
        if self._table is None and limit is not None:
            table = self._sorted(limit)
        else:
            table = self.table if limit is None else self.table.slice(0, limit)
        rows = table.to_pylist()
        for row in rows:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else {}
        return rows

    def __len__(self) -> int:
        return self._table.num_rows if self._table is not None else self.summary["findings"]

    def as_dict(self) -> dict:
        return {"findings": self.findings, "inputs": self.inputs, "summary": self.summary}


def analyze(
    con: duckdb.DuckDBPyConnection,
    *,
    config: str | None = None,
    incremental: bool = False,
    full: bool = False,
    scope: Callable[[IncrementalRun], None] | None = None,
) -> Analysis:
    """Run every finding rule over the store behind ``con``.

    ``incremental`` keeps findings and rollups in the store and recomputes only what new
    batches touch (``incremental.py``); ``full`` with it recomputes and rewrites everything.
    ``scope`` computes the request-scope part elsewhere (on Spark: ``hybridtrace.spark.analysis``);
    without ``incremental`` that is a full run that writes no state. The result is the same
    every way.
    """
    install_thresholds(con, load_thresholds(config))
    if incremental or scope is not None:
        from hybridtrace.analyze.incremental import incremental_views, store_of

        store = store_of(con)
        if store is not None:
            from hybridtrace.analyze.incremental import (
                CURRENT_FINDING_COUNTS,
                CURRENT_FINDINGS,
                STORED_RULES,
                IncrementalRun,
                answer_unchanged,
            )

            _settle(con)
            looked = IncrementalRun(con, store, full=full or not incremental)
            looked.look()
            if incremental and not full:
                answer = answer_unchanged(looked)
                if answer is not None:
                    return _answered(con, *answer)
            if incremental:
                _import_beside("pyarrow.compute")  # the state's commit needs it
            with incremental_views(
                con, store, full=full or not incremental, scope=scope, write=incremental, run=looked
            ) as run:
                with materialized(con, MERGED_VIEWS, {"intervals": _RULE_INTERVALS, **run.merged_sources}):
                    stored = (CURRENT_FINDINGS, tuple(r.view for r in STORED_RULES), CURRENT_FINDING_COUNTS)
                    result = _analyze(con, stored=stored)
                # kept with the state: the findings it computed over the whole store now
                recomputed = (
                    f"SELECT * FROM {result.source_name}_new UNION ALL BY NAME SELECT * FROM _fitted_findings"
                )
                run.result = (result.inputs, result.summary, recomputed)
            return result
    _settle(con)
    with materialized(con, ANALYSIS_VIEWS, ANALYSIS_SOURCES), records_from_rows(con):
        return _analyze(con)


def _import_beside(module: str) -> None:
    """Import ``module`` on a thread of its own, beside what the caller goes on to do.

    pyarrow.compute takes a tenth of a second to import, most of it Python building its
    functions, and only the commit of an incremental analysis' state needs it (opening a
    store does not: ``query`` and ``report`` start without it). The analysis' statements
    release the GIL while DuckDB runs them, so an import beside them is off the run's
    critical path; the commit's own import then finds the module there, or waits for it.
    """
    import sys
    import threading

    if module in sys.modules:
        return

    def load() -> None:
        import contextlib
        import importlib

        # a failure here is the caller's own import's to report
        with contextlib.suppress(Exception):
            importlib.import_module(module)

    threading.Thread(target=load, name=f"hybridtrace-import-{module}", daemon=True).start()


@contextmanager
def records_from_rows(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """``_request_record_rows`` (the request records' columns the request rules read) read from
    ``_request_rows`` for the duration: one row per record with those columns, which an analysis
    holds once it has materialized them, where the view itself reads the records' files again."""
    columns = ", ".join(con.sql("SELECT * FROM _request_record_rows LIMIT 0").columns)
    with swapped_views(con, {"_request_record_rows": f"SELECT {columns} FROM _request_rows"}):
        yield


def _answered(con: duckdb.DuckDBPyConnection, inputs: dict, summary: dict, recomputed: str) -> Analysis:
    """The Analysis of an earlier run's answer (``answer_unchanged``): its findings those it
    recomputed (``recomputed``, SQL) and the stored ones (``_merged_findings``)."""
    kept = f"_findings_{next(_RESULTS)}"
    con.execute(f"CREATE TEMP TABLE {kept}_new AS {recomputed}")
    con.execute(f"CREATE TEMP VIEW {kept} AS SELECT * FROM {kept}_new "
                "UNION ALL BY NAME SELECT * FROM _merged_findings")  # fmt: skip
    return _unread(Analysis(None, inputs, summary, source=(con, kept)), con)


def _unread(result: Analysis, con: duckdb.DuckDBPyConnection) -> Analysis:
    """``result``, its findings still in ``con``: sorted before another analysis there replaces them."""
    for key in [k for k, unread in _UNREAD.items() if not unread]:  # connections long gone
        del _UNREAD[key]
    _UNREAD.setdefault(id(con), weakref.WeakSet()).add(result)
    return result


def _scalars(con: duckdb.DuckDBPyConnection, queries: dict[str, str]) -> dict[str, int | None]:
    """Each query's one value (a count), all in one statement: one round trip, not one per count.

    A union of the queries as derived tables, not one row of scalar subqueries: DuckDB plans
    each scalar subquery as a join of its own, which costs more than the counts themselves.
    """
    if not queries:
        return {}
    union = " UNION ALL ".join(
        f"SELECT {i} AS i, CAST(v AS BIGINT) AS v FROM ({sql}) AS q(v)"
        for i, sql in enumerate(queries.values())
    )
    found = dict(con.execute(union).fetchall())
    return {name: found.get(i) for i, name in enumerate(queries)}


def _settle(con: duckdb.DuckDBPyConnection) -> None:
    """Sort the findings of earlier analyses on ``con`` that are still unread: this one will
    replace the temporary tables and views they are read from."""
    for result in list(_UNREAD.get(id(con), ())):
        result.table  # noqa: B018  (reading it sorts and keeps it)
    _UNREAD.pop(id(con), None)


def _analyze(
    con: duckdb.DuckDBPyConnection, *, stored: tuple[str, tuple[str, ...], str] | None = None
) -> Analysis:
    """The rules' findings and the summary. ``stored`` is (a relation of findings computed
    before, with a ``rule`` column; the rule views it holds; their counts per rule, kind and
    severity, column ``n``): those views are not run, their findings are listed from the
    relation where it is and counted from the counts."""

    counted_inputs = {
        name: (f"SELECT {name} FROM _input_counts" if name in _COUNTED_INPUTS
               else f"SELECT count(*) FROM {name}")
        for name in _INPUT_TABLES
    }
    counted_inputs["transfers_accounted"] = "SELECT reads FROM _accounting_totals"
    # What the trace writers said they dropped (their `dropped` records): how incomplete the
    # trace the rules read is.
    counted_inputs["trace_records_dropped"] = "SELECT trace_records_dropped FROM _input_counts"
    # the rules with nothing to judge (no engine of the kind they judge): not run, no inputs
    required = {rule.name: rule.requires for rule in RULES if rule.requires}
    counted_inputs.update({f"requires {name}": sql for name, sql in required.items()})
    inputs = _scalars(con, counted_inputs)
    idle = {name for name in required if inputs.pop(f"requires {name}") == 0}
    # Every rule's view in one table: DuckDB runs the union in parallel, and nothing crosses
    # into Python row by row.
    views = [rule.view for rule in _FIRST_RULES]
    relation, skipped, stored_counts = stored if stored is not None else (None, (), None)
    skipped = (*skipped, *(RULES_BY_NAME[name].view for name in idle))
    union = " UNION ALL BY NAME ".join(
        f"SELECT '{v}' AS rule, {_COLUMNS} FROM {v}" for v in views if v not in skipped
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE _findings AS SELECT * FROM ({union})")
    # the findings computed now, and those of earlier runs where they are
    every = (
        "_findings"
        if relation is None
        else f"(SELECT * FROM _findings UNION ALL BY NAME SELECT * FROM {relation})"
    )
    # output_mismatch names the other findings of the same handoff: it reads them from the
    # table just made rather than running their rules a second time
    # a rule that raises findings only of its inputs is not run without any (output_mismatch
    # without verifications would still join nothing to every finding of the store)
    later_inputs = _scalars(con, {rule.name: rule.inputs for rule in _LATER_RULES if rule.needs_inputs})
    with swapped_views(con, {"_handoff_findings": f"SELECT kind, engine_id, request_id FROM {every}"}):
        for rule in _LATER_RULES:
            if later_inputs.get(rule.name) == 0:
                continue
            con.execute(f"INSERT INTO _findings BY NAME SELECT '{rule.view}' AS rule, {_COLUMNS} "
                        f"FROM {rule.view}")  # fmt: skip
    views += [rule.view for rule in _LATER_RULES]
    counts = "SELECT rule, kind, severity, count(*) AS n FROM _findings GROUP BY ALL"
    if stored_counts is not None:
        counts = (
            f"SELECT rule, kind, severity, sum(n) FROM ({counts} UNION ALL SELECT * FROM {stored_counts}) "
            "GROUP BY ALL"
        )
    counted = con.execute(counts).fetchall()
    per_view = dict.fromkeys(views, 0)
    by_kind = dict.fromkeys(_COUNTED_KINDS, 0)
    by_severity: dict[str, int] = {}
    for rule_view, kind, severity, n in counted:
        per_view[rule_view] = per_view.get(rule_view, 0) + n
        by_kind[kind] = by_kind.get(kind, 0) + n
        by_severity[severity] = by_severity.get(severity, 0) + n
    by_kind = {k: by_kind[k] for k in [*_COUNTED_KINDS, *sorted(set(by_kind) - set(_COUNTED_KINDS))]}
    severities = {
        s: by_severity[s] for s in sorted(by_severity, key=lambda s: (_SEVERITY_ORDER.get(s, 9), s))
    }
    count = sum(n for *_, n in counted)
    # the findings stay where they are, under a name of their own (a second analysis on the
    # connection must not replace the first's): Analysis sorts them when they are read
    kept = f"_findings_{next(_RESULTS)}"
    con.execute(f"ALTER TABLE _findings RENAME TO {kept}")
    if relation is not None:
        con.execute(f"ALTER TABLE {kept} RENAME TO {kept}_new")
        con.execute(
            f"CREATE TEMP VIEW {kept} AS SELECT * FROM {kept}_new UNION ALL BY NAME SELECT * FROM {relation}"
        )
    # the later rules' inputs counted above are not counted again
    others = {
        rule.name: rule.inputs for rule in RULES if rule.name not in later_inputs and rule.name not in idle
    }
    seen = later_inputs | dict.fromkeys(idle, 0) | _scalars(con, others)
    rules = {
        rule.name: {"inputs": seen[rule.name], "findings": per_view[rule.view], "kinds": list(rule.kinds)}
        for rule in RULES
    }
    logical, expected, reserved, transported, sized = con.execute(
        "SELECT logical_bytes, expected_bytes, reserved_bytes, transported_bytes, sized_transported_bytes "
        "FROM _accounting_totals"
    ).fetchall()[0]
    summary = {
        "findings": count,
        "findings_by_kind": by_kind,
        "findings_by_severity": severities,
        "logical_bytes": logical,
        "expected_bytes": expected,
        "reserved_bytes": reserved,
        "transported_bytes": transported,
        # ratios over the same reads: those the model could size
        "transported_over_expected": sized / expected if expected else None,
        "transported_over_logical": sized / logical if logical else None,
        "expected_over_logical": expected / logical if logical and expected is not None else None,
        "reserved_over_logical": reserved / logical if logical and reserved is not None else None,
        "no_inputs": [
            name for name in ("transfers", "requests", "intervals", "log_events") if inputs[name] == 0
        ],
        "rules": rules,
        "rules_without_inputs": [rule for rule, counts in rules.items() if counts["inputs"] == 0],
    }
    return _unread(Analysis(None, inputs, summary, source=(con, kept)), con)
