"""Incremental analysis: findings and per-request rollups kept in the store, recomputed only
where new batches touch them, merged with what earlier runs left.

The unit of work is a request id. A run finds the ingest batches no earlier run covered
(``analysis_runs.batches``), and from their rows the request ids they touch: the ids of new
reads, request records and log events, the prefill ids those name, and every request of an
engine whose inputs to the rules changed (its byte model, host buffer, peak prefill rate, a
log's engine named later: ``_ENGINE_DIGESTS``). That set is closed over the requests that
share a prefill request id (``kv_expired`` matches prefill ids across engines). The
request-scope rules then run on ``transfers``, ``requests`` and ``log_events`` cut down to
those ids (log events that name no request are kept, but for the engine stats lines, which
only ``_peak_prefill_rate`` reads: the run computes that once over the store and counts the
lines), and their findings and rollups replace the stored ones of the same ids. An id no
earlier run had in scope has all its rows among the new ones, which the run keeps whole: its
rows and records are read from those, not looked up in every file of the store
(``_known_ids``; the records naming it as their prefill id still are). The slow-rank
windows (engine, window) that new reads fall into are recomputed from all reads of those
windows. Other thresholds than the state's, or ``analyze --full``, recompute everything.

What is recomputed in full every run, because it spans partitions, reads the rollups instead
of the reads: the engine pair rule (``config_mismatch``: each request's prefill engines), the
native-metrics rules (the intervals, the scrapes' kept in the state and computed only where new
samples make or change them, ``incremental_scrapes.py``; the failures and expiries
``_named_trace_events`` counts),
``slow_rank``'s verdicts (the stored windows, the requests' critical paths),
``output_mismatch`` (verifications, with the merged findings as its ``_handoff_findings``)
and the input counts. The analysis itself then runs unchanged (``_analyze``) on views that read the
merged state instead of recomputing it, so its result equals a full analysis'.

The fleet-wide sums those rules read (byte totals, critical-path leads, handoffs with a
prefill time, engine pairs, the failures and expiries the trace names) and the counts of the
stored findings are not summed over every rollup and finding each run: each run stores the
change it made to them (``analysis_counts``: its rollups' and findings' counts less those of
the ones they replace), and the counts are the sum of the changes since the last full run.

The state is the store's ``analysis_*`` tables (schemas beside the others), written as one
batch with the store's commit protocol under the writer lock; every row carries the run's
``seq`` and a row counts while it is the newest for its key since the last full run (a
change counts from the last full run on), so a compaction that merges state files of many
runs changes nothing, and a run killed before its commit leaves the state as it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from hybridtrace.analyze.incremental_scrapes import merge_scrapes, no_scrapes, scope_scrapes
from hybridtrace.analyze.rules import FINDING_COLUMN_NAMES, RULES, request_rules
from hybridtrace.analyze.view_swap import swapped_views
from hybridtrace.errors import UsageError
from hybridtrace.store.commit import Store, new_batch_id
from hybridtrace.store.raw_views import LATEST_RECORD

__all__ = [
    "CURRENT_FINDINGS",
    "CURRENT_FINDING_COUNTS",
    "RECOMPUTED_RULES",
    "REPORT_STATE_VIEWS",
    "STORED_RULES",
    "IncrementalRun",
    "cut_to_requests",
    "incremental_views",
    "store_of",
]

# The rules whose findings are stored per request; the others are recomputed each run.
STORED_RULES = tuple(r for r in request_rules(after_others=False))
_STORED_VIEWS = tuple(r.view for r in STORED_RULES)
# Inside ``merged_views``: every finding of the stored rules (a ``rule`` column names the view).
CURRENT_FINDINGS = "_current_findings"
# Their counts per (rule view, kind, severity), from the state: no run counts every stored finding.
CURRENT_FINDING_COUNTS = "_current_finding_counts"
# What is recomputed in full each run (module docstring says why).
RECOMPUTED_RULES = tuple(r.name for r in RULES if r not in STORED_RULES)
_COLUMNS = ", ".join(FINDING_COLUMN_NAMES)
# The state's layout: a run finding state of another (an older hybridtrace's) recomputes in
# full rather than read columns that layout lacked as nulls.
STATE_VERSION = 11
# The views the scope's rules share, computed once each (in this order: each reads the ones
# before it). Over the whole store, those that save a pass over the reads. Over a scope cut
# to a few requests every one is small, and what costs is planning: a rule's view is planned
# with every view it reads expanded in it, a few milliseconds each, many times over (the
# rules read the request model and the sized requests a dozen times); a table is planned as one.
_WHOLE_VIEWS = (
    "_unusual_reads",
    "_request_reads",
    "_request_rows",
    "_unsuccessful_requests",
    "_excess_reads",
)
_CUT_VIEWS = (
    "_host_buffer_engines",
    "_peak_prefill_rate",
    "_request_model",
    "_request_reads",
    "_request_rows",
    "_sized_requests",
    "_excess_request_model",
    "_excess_reads",
    "transfer_bytes",
    "handoffs",
)
# What the report reads of every request's accounted reads (report.sql's private views), from
# the rollups a run leaves merged in ``_merged_requests``: the scheduled job's report then sizes
# no read of the store again.
REPORT_STATE_VIEWS = {
    "_report_request_sums": "SELECT engine_id, request_id, CAST(reads_ok AS BIGINT) AS reads_ok, "
    "CAST(excess_bytes AS HUGEINT) AS excess_bytes, max_tokens FROM _merged_requests WHERE reads IS NOT NULL",
    "_report_share_reads": """
        SELECT engine_id, share, CAST(sum(n) AS BIGINT) AS reads FROM (
            SELECT engine_id, share, share_reads AS n FROM _merged_requests WHERE share IS NOT NULL
            UNION ALL
            SELECT engine_id, s.share, s.reads FROM (
                SELECT engine_id,
                       unnest(json_transform(shares, '[{"share": "INTEGER", "reads": "BIGINT"}]')) AS s
                FROM _merged_requests WHERE shares IS NOT NULL
            )
        ) GROUP BY ALL""",
    "_handoff_times": """
        SELECT engine_id, handoff_missing_tokens AS missing_tokens, critical_path_s, prefill_s, prefill_source
        FROM _merged_requests WHERE handoff AND critical_path_s IS NOT NULL AND prefill_s IS NOT NULL""",
    # every scrape's interval, as the runs left them (incremental_scrapes.py)
    "_prom_scrape_intervals": "SELECT * FROM _merged_scrapes",
}
# What IncrementalRun.last holds until the run has looked at the state.
_NOT_LOOKED = object()
# A chain of requests sharing prefill ids longer than this is analysed in full instead.
_CLOSURE_ROUNDS = 16

# Per engine, everything the request-scope rules read of it besides its requests' own rows:
# a change recomputes all its requests.
_ENGINE_DIGESTS = """
SELECT engine_id, md5(string_agg(part, '|' ORDER BY part)) AS digest FROM (
    SELECT engine_id, 'model ' || CAST(m AS VARCHAR) AS part FROM engine_models m
    UNION ALL SELECT engine_id, 'host buffer' FROM _host_buffer_engines
    UNION ALL SELECT engine_id, 'peak prefill ' || CAST(tokens_per_s AS VARCHAR) FROM _run_peak_prefill_rate
    UNION ALL SELECT fallback, 'renamed to ' || engine_id || ' in ' || source_id FROM _engine_renames
    UNION ALL SELECT engine_id, 'renamed from ' || fallback || ' in ' || source_id FROM _engine_renames
) WHERE engine_id IS NOT NULL GROUP BY engine_id
"""


def store_of(con: duckdb.DuckDBPyConnection) -> Store | None:
    """The store ``con`` was opened on by ``analysis_connection``; None for another connection."""
    try:
        found = con.execute("SELECT location FROM _analysis_store").fetchall()
    except duckdb.CatalogException:
        return None
    return Store(found[0][0]) if found else None


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    return con.execute(sql, params or []).fetchall()[0][0]


def _listed(ids: list[str], table: str, column: str = "request_id", limit: int = 2000) -> str:
    """``ids`` as the right side of an ``IN``: a short list spelled out, so that a Parquet scan
    filters by it as it reads (and skips, by their statistics and Bloom filters, the row groups
    that hold none of the ids) instead of reading every row for a join; a long one read from
    ``column`` of ``table`` (a table holding them, and maybe more)."""
    if len(ids) > limit:
        return f"(SELECT {column} FROM {table})"
    return "(" + (", ".join("'" + i.replace("'", "''") + "'" for i in ids) or "NULL") + ")"


def _records_naming(column: str, known: list[str], fresh: list[str]) -> str:
    """The request ids and prefill ids of the request records whose ``column`` is one of
    ``known`` or ``fresh`` (``_known_ids``). A fresh id's own records (``request_id``) are
    among the new ones, ``_new_request_records``, and the store's files are not read for
    them; a record of an analysed batch may name it as its prefill id, so those are looked up
    in every file."""
    ids = "SELECT unnest([request_id, remote_request_id]) AS id FROM"
    if column != "request_id":
        known, fresh = known + fresh, []
    found = [f"{ids} request_records WHERE {column} IN {_listed(known, '_scope_ids')}"] if known else []
    if fresh:
        found.append(f"{ids} _new_request_records WHERE {column} IN {_listed(fresh, '_scope_fresh')}")
    return " UNION ALL ".join(found) or "SELECT NULL AS id"


# A log's engine stats lines (``Engine NNN:``): they name no request, and of the request-scope
# rules only the peak prefill rate reads them (tests/test_incremental_analysis.py checks it).
_STATS_LINE = "kind IS NOT DISTINCT FROM 'engine_stats'"

# The tables whose new rows an incremental run holds (``_new_<name>``), each read as the
# analysis reads it: the raw request records (``requests`` keeps the latest of each, below).
_NEW_ROWS = ("transfers", "request_records", "log_events")


def _in_scope(con: duckdb.DuckDBPyConnection, column: str, limit: int = 2000, ids: str = "_scope_ids") -> str:
    """``column IN`` the ids of ``ids`` (a table of ``request_id``), as SQL (``_listed``)."""
    return _in_scope_and_count(con, column, limit, ids)[0]


def _in_scope_and_count(
    con: duckdb.DuckDBPyConnection, column: str, limit: int = 2000, ids: str = "_scope_ids"
) -> tuple[str, int]:
    """``_in_scope``, and how many ids it read (at most ``limit`` + 1: more than ``limit``)."""
    found = [i for (i,) in con.execute(f"SELECT request_id FROM {ids} LIMIT {limit + 1}").fetchall()]
    if not found:
        return "false", 0  # no id in scope (nothing new): no join of every row with an empty list
    return f"{column} IN {_listed(found, ids, limit=limit)}", len(found)


# The tables whose rows naming no request share row groups with the rows naming one (a log's
# stats and engine lines among its request lines); the reads and the records have none, and a
# scan for them skips every row group by its statistics. A list of ids this short under an OR
# costs less than a second read of those groups.
_NAMELESS_ALONGSIDE = ("log_events",)
_FEW_IDS = 64


@contextmanager
def cut_to_requests(
    con: duckdb.DuckDBPyConnection,
    ids: str = "_scope_ids",
    names: tuple[str, ...] = ("transfers", "requests", "log_events"),
    *,
    fresh: tuple[str, dict[str, str]] | None = None,
    nameless: dict[str, str] | None = None,
) -> Iterator[None]:
    """``names`` (tables with a ``request_id``) cut to the request ids of the table ``ids``.

    Rows without a request id stay: they are recomputed every run (``_peak_prefill_rate``
    reads the log's stats lines, a log event naming no request is a finding of its own).
    What is computed of one request reads only its own rows of these tables, so a view over
    them gives, for those requests, the rows it gives over the whole store.

    ``fresh`` is (a table of request ids that no row of an analysed batch names, for each of
    ``names`` a relation of the new batches' rows as that view gives them): every row of those
    ids is a new one, so they are taken from those rows, not looked up in every file of the
    store; ``ids`` then holds the others. ``nameless`` gives, for some of ``names``, which of
    their rows naming no request to keep (a condition): the others are read by no view that
    reads the cut.
    """
    # each cut once into a table: the rules read transfers a dozen times, and each read of
    # the view would scan every request id of the store again
    scoped, count = _in_scope_and_count(con, "request_id", ids=ids)
    few = count <= _FEW_IDS
    in_fresh, fresh_count = (
        _in_scope_and_count(con, "request_id", ids=fresh[0]) if fresh is not None else ("false", 0)
    )

    def fresh_rows(name: str) -> str:
        if not fresh_count or fresh is None:
            return ""
        return f" UNION ALL BY NAME SELECT * FROM {fresh[1][name]} WHERE {in_fresh}"

    for name in names:
        unnamed = "request_id IS NULL"
        if nameless and name in nameless:
            unnamed = f"({unnamed} AND {nameless[name]})"
        if few and name in _NAMELESS_ALONGSIDE:
            # one scan with OR: its rows naming no request sit in the row groups of those
            # naming one, which two scans would each read whole (measured: 35 ms against 23
            # on the log events of a million requests); a short list only (below)
            where = f"{scoped} OR {unnamed}"
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE _cut_{name} AS SELECT * FROM {name} WHERE {where}"
                + fresh_rows(name)
            )
            continue
        # two scans, not one filter with OR: a list under an OR is compared item by item on
        # every row (a thousand ids made a cut of a million requests' reads take seconds);
        # the list alone, and IS NULL alone, reach the Parquet reader
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _cut_{name} AS SELECT * FROM {name} WHERE {scoped} "
            f"UNION ALL SELECT * FROM {name} WHERE {unnamed}" + fresh_rows(name)
        )
    try:
        with swapped_views(con, {name: f"SELECT * FROM _cut_{name}" for name in names}):
            yield
    finally:
        for name in names:
            con.execute(f"DROP TABLE IF EXISTS _cut_{name}")


@dataclass
class IncrementalRun:
    """One incremental analysis of a store: what it found new, and the state it will write."""

    con: duckdb.DuckDBPyConnection
    store: Store
    full: bool
    seq: int = 0
    reason: str = ""
    batches: list[str] = field(default_factory=list)
    engines: dict[str, str] = field(default_factory=dict)
    # each engine's peak prefill rate over every stats line (``_peak_prefill_rates``)
    peaks: dict[str, float] = field(default_factory=dict)
    # the filter of the new batches' rows (``_new_rows``), once it is spelled
    _is_new: str | None = None
    thresholds: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)  # engines whose inputs to the rules changed
    # the last committed run's result cannot answer for this code (another version wrote it)
    stale_result: bool = False
    # the analysis' result, set before the state is written: its input counts, its summary and
    # the relation of the findings it recomputed over the whole store (analysis_run_findings)
    result: tuple[dict, dict, str] | None = None
    # the last committed run's row of analysis_runs, None when there is none (``look``)
    last: Any = _NOT_LOOKED
    # inside ``merged_views``: the relations of the merged state that give the rows of views
    # the analysis materializes (``materialized``'s sources): computed into their tables
    # straight away, not swapped in as views first (a view is bound when it is made)
    merged_sources: dict[str, str] = field(default_factory=dict)
    # an incremental run's scope split into ids earlier runs saw and the others (``_known_ids``),
    # the new rows kept (``_new_<table>``)
    split: bool = False
    # the newest full run's seq (0: none, or this run is one)
    full_seq: int = 0

    # --- what is new -------------------------------------------------------------------

    def look(self) -> None:
        """Read what the last committed run left (``last``), the thresholds' digest and the
        batches no run covered (``batches``, and their sources in ``_new_sources``): what
        ``answer_unchanged`` decides on, and where ``plan`` starts."""
        con = self.con
        self.thresholds = _scalar(con, _THRESHOLDS_DIGEST)
        last = con.execute(
            "SELECT seq, thresholds, engines, state_version, code, result, peak_prefill_rates "
            "FROM analysis_runs ORDER BY seq DESC LIMIT 1"
        ).fetchall()
        self.last = last[0] if last else None
        self.seq = (last[0][0] + 1) if last else 1
        self.stale_result = bool(last) and (last[0][4] != _code() or last[0][5] is None)
        con.execute(
            # whether a read wrote Prometheus samples (a store's older rows may not say: then it may)
            "CREATE OR REPLACE TEMP TABLE _new_sources AS SELECT source_id, batch_id, format, "
            "coalesce(TRY_CAST(json_extract(rows, '$.prom_samples') AS BIGINT) > 0, rows IS NULL) AS scraped "
            "FROM sources "
            f"WHERE batch_id NOT IN (SELECT DISTINCT * FROM ({_ANALYZED_BATCHES}))"
        )
        found = con.execute("SELECT DISTINCT batch_id FROM _new_sources").fetchall()
        self.batches = sorted(b for (b,) in found)

    def plan(self) -> None:
        """Decide full or incremental, and fill ``_scope_ids`` and ``_scope_windows``."""
        con = self.con
        if self.last is _NOT_LOOKED:
            self.look()
        last = [self.last] if self.last is not None else []
        # the peak prefill rate once, the peak of every line of the store (from the kept peaks
        # and the new lines): the digests read it, and so do the scope's rules, whose cut then
        # leaves the stats lines out instead of copying and parsing them all again
        self._peak_prefill_rates()
        self.engines = dict(con.execute(_ENGINE_DIGESTS).fetchall())
        if not self.full:
            if not last:
                self.full, self.reason = True, "no analysis state yet"
            elif last[0][3] != STATE_VERSION:
                self.full, self.reason = True, "state of another layout"
            elif last[0][1] != self.thresholds:
                self.full, self.reason = True, "thresholds changed"
        if self.full:
            self.reason = self.reason or "--full"
            self.full_seq = 0
            con.execute(
                "CREATE OR REPLACE TEMP TABLE _scope_ids AS SELECT DISTINCT request_id FROM ("
                "SELECT request_id FROM transfers UNION ALL SELECT request_id FROM request_records "
                "UNION ALL SELECT request_id FROM log_events) WHERE request_id IS NOT NULL"
            )
            con.execute(
                "CREATE OR REPLACE TEMP TABLE _scope_windows AS "
                "SELECT DISTINCT engine_id, floor(ts / _t('window_s')) AS window_index FROM transfers"
            )
        else:
            before = json.loads(last[0][2] or "{}")
            changed = sorted(
                e for e in set(before) | set(self.engines) if before.get(e) != self.engines.get(e)
            )
            self.changed = changed
            self._incremental_scope(changed)
        self.counts = {
            "requests": _scalar(con, "SELECT count(*) FROM _scope_ids"),
            "windows": _scalar(con, "SELECT count(*) FROM _scope_windows"),
        }

    def _peak_prefill_rates(self) -> None:
        """``_run_peak_prefill_rate``, and ``peaks`` as the state keeps them.

        A peak is a maximum: the last run's peaks and the new reads' stats lines give the
        peaks of every line, without reading the month of lines before them again. Unless a
        new read is a vLLM log: it may name the engine of an instance folder whose older
        lines were filed under the folder's name, which moves them to another engine. Then,
        and whenever the last run's state cannot be built on, every line is read."""
        con, last = self.con, self.last
        kept = None
        if not self.full and last is not None and last[3] == STATE_VERSION and last[4] == _code():
            kept = json.loads(last[6]) if last[6] is not None else None
        if kept is not None and _scalar(con, _NEW_LOG_READS) == 0:
            lines = self._new_rows("log_events", "engine_id, kind, details", "kind = 'engine_stats'")
            con.execute(f"CREATE OR REPLACE TEMP TABLE _new_stats_lines AS SELECT * FROM {lines}")
            con.execute(
                """
                CREATE OR REPLACE TEMP TABLE _run_peak_prefill_rate AS
                SELECT engine_id, max(tokens_per_s) AS tokens_per_s FROM (
                    SELECT unnest($engines::VARCHAR[]) AS engine_id, unnest($rates::DOUBLE[]) AS tokens_per_s
                    UNION ALL SELECT * FROM _peak_prefill_rate_of('_new_stats_lines')
                ) GROUP BY engine_id
                """,
                {"engines": list(kept), "rates": list(kept.values())},
            )
            con.execute("DROP TABLE _new_stats_lines")
        else:
            con.execute("CREATE OR REPLACE TEMP TABLE _run_peak_prefill_rate AS "
                        "SELECT * FROM _peak_prefill_rate")  # fmt: skip
        self.peaks = dict(con.execute("SELECT * FROM _run_peak_prefill_rate").fetchall())

    def _new_rows(self, table: str, columns: str, where: str = "") -> str:
        """SQL of the rows of ``table`` (``columns`` of those that meet ``where``) that the new
        batches wrote: a row is new when its read (its sources row, which ingest commits in the
        same batch) is, and a row without a source is new too."""
        if self._is_new is None:
            # a short list is spelled out, so that the Parquet scans skip, by their source_id
            # statistics, every row group of an older read
            found = self.con.execute("SELECT source_id FROM _new_sources").fetchall()
            new_ids = [i for (i,) in found if i is not None]
            self._is_new = f"source_id IN {_listed(new_ids, '_new_sources', 'source_id')}"
        # two scans, not one filter with OR: a list under an OR is compared item by item on
        # every row (a thousand items made a scan of a million requests' reads take seconds),
        # while a list alone, and IS NULL alone, reach the Parquet reader (which skips the row
        # groups with no null)
        also = f"({where}) AND " if where else ""
        return (
            f"(SELECT {columns} FROM {table} WHERE {also}{self._is_new} "
            f"UNION ALL SELECT {columns} FROM {table} WHERE {also}source_id IS NULL)"
        )

    def _incremental_scope(self, changed: list[str]) -> None:
        con = self.con
        new = self._new_rows
        con.execute("CREATE OR REPLACE TEMP TABLE _changed_engines (engine_id VARCHAR)")
        if changed:
            con.executemany("INSERT INTO _changed_engines VALUES (?)", [(e,) for e in changed])
        # the new rows, whole: the scope's ids come from them, and the rows of the ids among
        # them that no earlier run saw are all here (_known_ids: the closure and the cut read
        # them from these instead of the store's files)
        for name in _NEW_ROWS:
            con.execute(f"CREATE OR REPLACE TEMP TABLE _new_{name} AS SELECT * FROM {new(name, '*')}")
        engines = "(SELECT engine_id FROM _changed_engines)"
        of_changed = f"""
                UNION ALL SELECT request_id FROM transfers
                    WHERE engine_id IN {engines} OR remote_engine_id IN {engines}
                UNION ALL SELECT request_id FROM request_records
                    WHERE engine_id IN {engines} OR remote_engine_id IN {engines}
                UNION ALL SELECT request_id FROM log_events WHERE engine_id IN {engines}
                UNION ALL SELECT request_id FROM analysis_requests WHERE engine_id IN {engines}
                UNION ALL SELECT request_id FROM analysis_findings
                    WHERE engine_id IN {engines} OR remote_engine_id IN {engines}"""
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _scope_ids AS
            SELECT DISTINCT request_id FROM (
                SELECT request_id FROM _new_transfers
                UNION ALL SELECT remote_request_id FROM _new_transfers
                UNION ALL SELECT unnest([request_id, remote_request_id]) FROM _new_request_records
                UNION ALL SELECT request_id FROM _new_log_events
                {of_changed if changed else ""}
            ) WHERE request_id IS NOT NULL
            """
        )
        # which of them an earlier run had in scope: the records of the others are new ones
        self.full_seq = _scalar(con, _LAST_FULL_RUN)
        self._known_ids("_scope_ids")
        self.split = True
        known = [i for (i,) in con.execute("SELECT request_id FROM _scope_markers").fetchall()]
        fresh = [i for (i,) in con.execute("SELECT request_id FROM _scope_fresh").fetchall()]
        # requests that share a prefill id see each other's records (kv_expired): one in
        # scope brings the others
        # each round looks up the ids the last one added (the others' records were read already)
        for _ in range(_CLOSURE_ROUNDS):
            if not known and not fresh:
                break
            named = " UNION ALL ".join(
                _records_naming(column, known, fresh) for column in ("request_id", "remote_request_id")
            )
            added = con.execute(
                f"""
                INSERT INTO _scope_ids
                SELECT DISTINCT id FROM ({named})
                WHERE id IS NOT NULL AND id NOT IN (SELECT request_id FROM _scope_ids)
                RETURNING request_id
                """
            ).fetchall()
            # the ids added come from records of analysed batches, or new ones: looked up too
            frontier = [i for (i,) in added]
            if not frontier:
                break
            con.execute(
                "CREATE OR REPLACE TEMP TABLE _scope_added AS SELECT unnest(?::VARCHAR[]) AS request_id",
                [frontier],
            )
            self._known_ids("_scope_added")
            added_of = "SELECT request_id FROM {} SEMI JOIN _scope_added USING (request_id)"
            known = [i for (i,) in con.execute(added_of.format("_scope_markers")).fetchall()]
            fresh = [i for (i,) in con.execute(added_of.format("_scope_fresh")).fetchall()]
        else:
            self.full, self.reason = True, "requests chained through prefill ids beyond the closure rounds"
            self.plan()
            return
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _scope_windows AS "
            "SELECT DISTINCT engine_id, floor(ts / _t('window_s')) AS window_index FROM _new_transfers"
        )

    # --- computing the scope ---------------------------------------------------------

    def compute(self, scope: Callable[[IncrementalRun], None] | None = None) -> None:
        """The scope's findings, rollups and windows; then the state merged with them.

        ``scope`` computes the scope tables in place of ``compute_scope`` (the analysis on
        Spark, ``hybridtrace.spark.analysis``: on executors, a partition each); it leaves the
        same four tables on this connection.
        """
        con = self.con
        full_seq = 0 if self.full else self.full_seq
        if scope is None and self.unchanged():
            self.reuse_scope()
        elif scope is None:
            self.compute_scope(fresh=not self.full and self.split)
        else:
            scope(self)
        # new samples come from new reads that wrote some: without one, no scrape is computed
        scraped = [i for (i,) in con.execute("SELECT source_id FROM _new_sources WHERE scraped").fetchall()]
        if self.full or scraped:
            self.counts["scrapes"] = scope_scrapes(
                con, full=self.full, full_seq=full_seq,
                new_sources=_listed(scraped, "(SELECT * FROM _new_sources WHERE scraped)", "source_id"),
            )  # fmt: skip
        else:
            no_scrapes(con)
        self.merge(full_seq)
        self._counts(full_seq)
        window_keep = (
            "false"
            if self.full
            else ("(engine_id, window_index) NOT IN (SELECT (engine_id, window_index) FROM _scope_windows)")
        )
        # a view: _rank_windows, which the analysis materializes, is its only reader. A window's
        # rows are those of the last run that computed it: the full run's, unless a later run
        # recomputed the window. The later runs' windows are few (their files are found by
        # their seq statistics), so they are grouped, not every window of the store (half the
        # time over a week's windows)
        con.execute(
            f"""
            CREATE OR REPLACE TEMP VIEW _merged_windows AS
            SELECT w.* EXCLUDE (seq, day) FROM analysis_rank_windows w
            LEFT JOIN (SELECT engine_id, window_index, max(seq) AS seq FROM analysis_rank_windows
                       WHERE seq > {full_seq} GROUP BY ALL) l USING (engine_id, window_index)
            WHERE w.seq >= {full_seq} AND (l.seq IS NULL OR w.seq >= l.seq) AND {window_keep}
            UNION ALL BY NAME SELECT * EXCLUDE (day) FROM _scope_window_rows
            """
        )

    def _known_ids(self, ids: str) -> None:
        """Of the request ids of the table ``ids`` (the scope, or ids added to it), those a run
        since the last full one had in scope go to ``_scope_markers``, each with the newest
        marker of a run after that full one (null when none); the others to ``_scope_fresh``.

        A run's scope holds every request id its new batches' rows name, and a full run's every
        request id of the store: an id no such run had in scope is the request id of no row in
        an analysed batch. Its rows are all new (the closure and ``cut_to_requests`` take them
        from the new rows the run keeps), and no rollup or finding of it is stored (``_counts``
        looks up none). An analysed record may still name it as its prefill id: a full run's
        scope holds no prefill id that is not a request id of its own."""
        con, full_seq = self.con, self.full_seq
        found = (
            f"SELECT request_id, max(seq) FILTER (WHERE seq > {full_seq}) AS marker_seq "
            f"FROM analysis_requests WHERE engine_id IS NULL AND seq >= {full_seq} "
            f"AND {_in_scope(con, 'request_id', ids=ids)} GROUP BY request_id"
        )
        others = f"SELECT request_id FROM {ids} ANTI JOIN _scope_markers USING (request_id)"
        if ids == "_scope_ids":
            con.execute(f"CREATE OR REPLACE TEMP TABLE _scope_markers AS {found}")
            con.execute(f"CREATE OR REPLACE TEMP TABLE _scope_fresh AS {others}")
        else:
            con.execute(f"INSERT INTO _scope_markers {found}")
            con.execute(f"INSERT INTO _scope_fresh {others}")

    def merge(self, full_seq: int) -> None:
        """``_merged_requests`` and ``_merged_findings``: the stored rollups and findings that
        still count (since the last full run ``full_seq``), with the scope's."""
        con = self.con
        # a stored row counts unless a later run (or this one) recomputed its request id: the
        # marker rows of runs since the last full one are few, and the full run's files are
        # skipped by their seq statistics, so this reads no row it does not keep
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _later_markers AS
            SELECT request_id, max(seq) AS seq FROM (
                SELECT request_id, seq FROM analysis_requests WHERE engine_id IS NULL AND seq > {full_seq}
                UNION ALL SELECT request_id, {self.seq} FROM _scope_ids
            ) GROUP BY request_id
            """
        )
        current = (
            "LEFT JOIN _later_markers m ON m.request_id = x.request_id "
            f"WHERE x.seq >= {full_seq} AND x.request_id IS NOT NULL AND (m.seq IS NULL OR m.seq <= x.seq)"
        )
        stored_requests = (
            ""
            if self.full
            else "SELECT x.* EXCLUDE (seq, day) FROM analysis_requests x "
            f"{current} AND x.engine_id IS NOT NULL UNION ALL BY NAME"
        )
        # a view: what reads it (the untimed handoffs, the failed and expired reads) wants a few
        # rows, which its filters pick from the stored files; the sums come from _current_counts
        con.execute(
            "CREATE OR REPLACE TEMP VIEW _merged_requests AS "
            f"{stored_requests} SELECT * EXCLUDE (day) FROM _scope_rollups"
        )
        stored_findings = (
            ""
            if self.full
            else f"SELECT x.* EXCLUDE (seq, day) FROM analysis_findings x {current} UNION ALL BY NAME"
        )
        # a view, not a copy: the analysis counts the stored findings where they are, and
        # sorts them only when all are asked for (analyze/__init__.py's Analysis)
        con.execute(f"CREATE OR REPLACE TEMP VIEW _merged_findings AS {stored_findings} "
                    "SELECT * FROM _scope_findings")  # fmt: skip
        merge_scrapes(con, full=self.full, seq=self.seq, full_seq=full_seq)

    def _counts(self, full_seq: int) -> None:
        """``_run_counts`` (this run's change to the counts: its rollups' counts less those of
        the rollups they replace) and ``_current_counts`` (every count, state and change)."""
        con = self.con
        rollups = "SELECT 1 AS sign, * FROM _scope_rollups"
        days = "LEFT JOIN _scope_days d USING (request_id)"
        findings = f"SELECT 1 AS sign, f.*, d.day FROM _scope_findings f {days}"
        inputs = f"SELECT 1 AS sign, i.*, d.day FROM _scope_inputs i {days}"
        if not self.full:
            # the rollups, markers and findings of the scope's ids that counted until now: the
            # newest of each id's since the last full run (as _merged_requests reads the others),
            # those no later marker of the id outdates (_scope_markers); of the ids an earlier
            # run had in scope only (no other has any stored); a short list of ids is spelled
            # out, so that the scans filter the stored rows as they read them. Each is counted
            # with the sign -1 beside the scope's own: one count of both gives the change.
            scoped = _in_scope(con, "request_id", ids="_scope_markers")

            def replaced(table: str) -> str:
                return f"""
                    SELECT -1 AS sign, x.* EXCLUDE (seq) FROM (SELECT * FROM {table} WHERE {scoped}) x
                    LEFT JOIN _scope_markers m ON m.request_id = x.request_id
                    WHERE x.seq >= {full_seq} AND (m.marker_seq IS NULL OR m.marker_seq <= x.seq)"""

            # the stored rows of the scope's ids once: rollups and markers are both there
            con.execute(f"CREATE OR REPLACE TEMP TABLE _replaced_requests AS {replaced('analysis_requests')}")
            sums = ", ".join(f"CAST({c} AS HUGEINT) AS {c}" for c in _ROLLUP_SUMS)
            rollups += (
                f" UNION ALL BY NAME SELECT * EXCLUDE ({_INPUT_COLUMNS}) REPLACE ({sums}) "
                "FROM _replaced_requests WHERE engine_id IS NOT NULL"
                # the rollups of rows that name no request, as the last run that wrote state had them
                f" UNION ALL BY NAME SELECT -1 AS sign, * EXCLUDE (seq, {_INPUT_COLUMNS}) REPLACE ({sums}) "
                f"FROM analysis_requests WHERE seq = {self.seq - 1} AND request_id IS NULL "
                "AND engine_id IS NOT NULL"
            )
            findings += f" UNION ALL BY NAME {replaced('analysis_findings')}"
            # the markers' input counts, and those of the rows that name no request as the last
            # run that wrote state counted them
            columns = f"request_id, day, {_INPUT_COLUMNS}"
            inputs += (
                f" UNION ALL BY NAME SELECT sign, {columns} FROM _replaced_requests WHERE engine_id IS NULL "
                f"UNION ALL BY NAME SELECT -1 AS sign, {columns} FROM analysis_requests "
                f"WHERE seq = {self.seq - 1} AND request_id IS NULL AND engine_id IS NULL"
            )
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _run_counts AS
            SELECT engine_id, day, counter, key, CAST(sum(value) AS BIGINT) AS value FROM (
                {_COUNTS.format(rollups=f"({rollups})")}
                UNION ALL {_FINDING_COUNTS.format(findings=f"({findings})")}
                UNION ALL {_INPUT_COUNTS.format(markers=f"({inputs})")}
            ) GROUP BY ALL HAVING sum(value) <> 0
            """
        )
        stored = (
            ""
            if self.full
            else "SELECT engine_id, counter, key, value FROM analysis_counts "
            f"WHERE seq >= {full_seq} UNION ALL "
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _current_counts AS SELECT engine_id, counter, key, "
            f"CAST(sum(value) AS BIGINT) AS value FROM ({stored}SELECT engine_id, counter, key, value "
            "FROM _run_counts) GROUP BY ALL"
        )

    def unchanged(self) -> bool:
        """Whether the store holds nothing this run's state has not seen: no new batch, the
        same engine inputs and thresholds (else it would be a full run), no request in scope."""
        return not (self.full or self.batches or self.changed or any(self.counts.values()))

    def reuse_scope(self) -> None:
        """The scope tables of a run with nothing new, without running the rules.

        Such a run recomputes only the rows that name no request (the cut keeps them every
        run), from the same rows as the last run that committed state, with the same engine
        inputs and thresholds: that run's results for them, stored with its ``seq``, are
        what the rules would give again. Planning the rules over an empty scope costs as much
        as running them over a small one, and this is the scheduled job's run between new
        objects."""
        con, last = self.con, self.seq - 1
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _scope_findings AS SELECT * EXCLUDE (seq, day) "
            f"FROM analysis_findings WHERE seq = {last} AND request_id IS NULL"
        )
        # the byte sums as _SCOPE_ROLLUPS gives them (128-bit: the state keeps them in 64 bits)
        sums = ", ".join(f"CAST({c} AS HUGEINT) AS {c}" for c in _ROLLUP_SUMS)
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _scope_rollups AS SELECT * EXCLUDE (seq, {_INPUT_COLUMNS}) "
            f"REPLACE ({sums}) FROM analysis_requests WHERE seq = {last} AND request_id IS NULL "
            "AND engine_id IS NOT NULL"
        )
        # the rows naming no request as that run counted them: the same rows
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _scope_inputs AS SELECT request_id, {_INPUT_COLUMNS} "
            f"FROM analysis_requests WHERE seq = {last} AND request_id IS NULL AND engine_id IS NULL"
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _scope_days AS SELECT request_id, day "
            "FROM analysis_requests LIMIT 0"
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _scope_window_rows AS SELECT * EXCLUDE (seq) "
            "FROM analysis_rank_windows LIMIT 0"
        )

    def compute_scope(self, *, cut: bool | None = None, windows: bool = True, fresh: bool = False) -> None:
        """``_scope_findings``, ``_scope_days``, ``_scope_rollups`` and (with ``windows``)
        ``_scope_window_rows`` for ``_scope_ids`` and ``_scope_windows`` on this connection.

        ``cut`` (default: unless a full run) reads only the scope's request ids' rows, and
        those that name no request. ``fresh`` (an incremental run that split its scope,
        ``_known_ids``) reads the rows of ids no earlier run had in scope from the new rows.
        """
        from hybridtrace.analyze import HELD_SOURCES, materialized, records_from_rows

        con = self.con
        # a join key for (engine, request) in which a null matches a null, for hash joins
        con.execute("CREATE OR REPLACE TEMP MACRO _key(e, r) AS "
                    "coalesce('v' || e, 'n') || chr(0) || coalesce('v' || r, 'n')")  # fmt: skip
        with ExitStack() as stack:
            cutting = (not self.full) if cut is None else cut
            if cutting and fresh:
                # the new rows as the views give them: ``requests`` keeps the latest record of
                # each request, and every record of a fresh id is among the new ones
                new_rows = {
                    "transfers": "_new_transfers",
                    "requests": f"(SELECT * FROM _new_request_records{LATEST_RECORD})",
                    "log_events": "_new_log_events",
                }
                # the stats lines name no request, and only the peak prefill rate reads them (the
                # run's, over the whole store): counted here, not copied (a month of them each run)
                con.execute(f"CREATE OR REPLACE TEMP TABLE _run_stats_lines AS SELECT count(*) AS n "
                            f"FROM log_events WHERE request_id IS NULL AND {_STATS_LINE}")  # fmt: skip
                stack.enter_context(cut_to_requests(
                    con, "_scope_markers", fresh=("_scope_fresh", new_rows),
                    nameless={"log_events": f"NOT ({_STATS_LINE})"},
                ))  # fmt: skip
            elif cutting:
                stack.enter_context(cut_to_requests(con))
            # the stats lines name no request: the peak over the store is the one a cut keeping
            # them would give, and this cut leaves them out (above)
            sources = HELD_SOURCES
            if fresh:
                sources = {**HELD_SOURCES, "_peak_prefill_rate": "_run_peak_prefill_rate"}
            stack.enter_context(materialized(con, _CUT_VIEWS if cutting else _WHOLE_VIEWS, sources))
            stack.enter_context(records_from_rows(con))
            con.execute("CREATE OR REPLACE TEMP TABLE _scope_untimed AS SELECT * FROM _untimed_handoffs")
            union = " UNION ALL BY NAME ".join(
                f"SELECT '{v}' AS rule, {_COLUMNS} FROM {v}" for v in _STORED_VIEWS
            )
            # the handoffs judged by the fitted link are not kept: the fits move with every
            # read, so merged_views applies the current ones to the kept untimed rows
            with swapped_views(con, {"_untimed_handoffs": "SELECT * FROM _scope_untimed LIMIT 0"}):
                con.execute(f"CREATE OR REPLACE TEMP TABLE _scope_findings AS SELECT * FROM ({union})")
            # a full run's scope is every request id of those tables: no look-up of each in it
            whole = self.full and not cutting
            in_scope = (
                "request_id IS NOT NULL" if whole else "request_id IN (SELECT request_id FROM _scope_ids)"
            )
            con.execute(_SCOPE_DAYS.format(in_scope=in_scope))
            # the stats lines the cut left out, counted as rows naming no request
            stats_lines = "SELECT NULL, 0, 0, 0, 0, n, 0 FROM _run_stats_lines" if cutting and fresh else ""
            con.execute(_SCOPE_INPUTS.format(stats_lines=f"UNION ALL {stats_lines}" if stats_lines else ""))
            con.execute(_SCOPE_ROLLUPS)
        if windows:
            # no window in scope: the table empty, without a scan of the reads for none
            none = not _scalar(con, "SELECT count(*) FROM _scope_windows")
            con.execute(_SCOPE_WINDOWS + (" LIMIT 0" if none else ""))

    # --- the analysis on the merged state ---------------------------------------------

    @contextmanager
    def merged_views(self) -> Iterator[None]:
        """The views ``_analyze`` reads, pointed at the merged state where it holds them.

        The stored rules' own views are left as they are: ``_analyze`` reads their findings
        from ``CURRENT_FINDINGS`` and does not run them (and each view replaced costs a bind,
        and its restoring another)."""
        untimed = (
            "SELECT engine_id, request_id, untimed_remote_engine_id AS remote_engine_id, missing_tokens, "
            "measured_prefill_s, read_bytes FROM _merged_requests WHERE untimed"
        )
        replacements = {
            "_accounting_totals": _TOTALS,
            "_critical_path_leads": "SELECT engine_id, CAST(key AS INTEGER) AS rank, value AS requests_led "
                                    "FROM _current_counts WHERE counter = 'led' AND value > 0",
            "_critical_path_requests": "SELECT engine_id, value AS requests FROM _current_counts "
                                       "WHERE counter = 'critical_path' AND value > 0",
            "_timed_prefill_handoffs": "SELECT coalesce(sum(value), 0) AS handoffs FROM _current_counts "
                                       "WHERE counter = 'handoff_prefill'",
            "_rank_windows": _RANK_WINDOWS,
            "_named_trace_events": _NAMED_TRACE_EVENTS,
            "_input_counts": _STATE_INPUT_COUNTS,
            # the engines the trace covers are those with reads: the pair counts name them all
            # (a request's reads count for its prefill engine, or for none), so the native
            # rules' intervals need no scan of every read's engine
            "_untraced_interval_bytes": "SELECT * FROM _interval_verdicts((SELECT "
                                        "coalesce(list(DISTINCT engine_id), []) FROM _transfer_pairs))",
            # the scrapes' intervals from the state, not from every sample of the store
            "_prom_scrape_intervals": REPORT_STATE_VIEWS["_prom_scrape_intervals"],
            # the peaks plan() kept, not every stats line of the store parsed again (the
            # handoffs judged by the fitted link estimate their prefill from them)
            "_peak_prefill_rate": "SELECT * FROM _run_peak_prefill_rate",
        }  # fmt: skip
        # _config_pairs reads of the reads and the records only the engine pairs they name:
        # those come from the counts, not from every read and record
        con = self.con
        con.execute(f"CREATE OR REPLACE TEMP TABLE _transfer_pairs AS {_TRANSFER_PAIRS}")
        replacements["_read_engine_pairs"] = "SELECT * FROM _transfer_pairs"
        replacements["_record_engine_pairs"] = _RECORD_PAIRS
        from hybridtrace.analyze import MERGED_VIEWS

        self.merged_sources = {
            name: f"({replacements.pop(name)})" for name in MERGED_VIEWS if name in replacements
        }
        try:
            # the kept untimed handoffs, judged by the fits of now, beside the kept findings (a
            # view is bound when it is made: these come first, the views that read them after)
            peaks = {"_peak_prefill_rate": replacements["_peak_prefill_rate"]}
            with swapped_views(con, {**peaks, "_untimed_handoffs": untimed}):
                # once, for the findings and for recompute_cheaper's inputs
                con.execute("CREATE OR REPLACE TEMP TABLE _fitted_now AS SELECT * FROM _fitted_handoffs")
                fitted = {"_fitted_handoffs": "SELECT * FROM _fitted_now"}
                with swapped_views(con, fitted):
                    con.execute(
                        "CREATE OR REPLACE TEMP TABLE _fitted_findings AS SELECT "
                        f"'finding_recompute_cheaper' AS rule, {_COLUMNS} FROM _recompute_cheaper_fitted"
                    )
            replacements.update(fitted)
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW {CURRENT_FINDINGS} AS SELECT * FROM _merged_findings "
                "UNION ALL BY NAME SELECT * FROM _fitted_findings"
            )
            con.execute(f"CREATE OR REPLACE TEMP TABLE {CURRENT_FINDING_COUNTS} AS {_CURRENT_FINDING_COUNTS}")
            with swapped_views(con, {**replacements, "_untimed_handoffs": untimed}):
                yield
        finally:
            for table in ("_transfer_pairs", "_fitted_now"):
                con.execute(f"DROP TABLE IF EXISTS {table}")

    # --- the state written -----------------------------------------------------------

    def write(self) -> bool:
        """Commit this run's state (and ``result``) as one batch; False when another writer holds
        the store, or when there is nothing to add (no new batch, nothing recomputed, the same
        engine inputs, a result the last run stored for this code)."""
        nothing = not self.full and not self.batches and not any(self.counts.values()) and not self.changed
        if nothing and not (self.stale_result and self.result is not None):
            return False
        try:
            with self.store.writer_lock():
                if self._newest_committed_seq() != self.seq - 1:
                    return False  # another analysis committed state since this one read it
                self.store.recover()
                self.store.write_batch(new_batch_id(), self._state_tables(), _empty_sources())
        except UsageError:
            return False
        return True

    def _newest_committed_seq(self) -> int:
        files = self.store.committed_files("analysis_runs")
        seqs = [s for f in files for s in self.store.files.read_table(f).column("seq").to_pylist()]
        return max(seqs, default=0)

    def _state_tables(self) -> dict[str, pa.Table]:
        con, seq = self.con, self.seq
        all_batches = self.batches
        if self.full:
            found = con.execute("SELECT DISTINCT batch_id FROM sources").fetchall()
            all_batches = sorted(b for (b,) in found)
        result = None
        if self.result is not None:
            inputs, summary, _ = self.result
            result = json.dumps({"inputs": inputs, "summary": summary})
        runs = pa.Table.from_pylist([{
            "seq": seq, "full_run": self.full, "batches": json.dumps(all_batches),
            "thresholds": self.thresholds,
            "engines": json.dumps(self.engines, sort_keys=True), "requests": self.counts.get("requests", 0),
            "peak_prefill_rates": json.dumps(self.peaks, sort_keys=True),
            "windows": self.counts.get("windows", 0), "scrapes": self.counts.get("scrapes", 0),
            "ran_at": time.time(), "state_version": STATE_VERSION,
            "code": _code(), "result": result,
        }])  # fmt: skip
        inputs = ", ".join(f"coalesce(i.{c}, 0) AS {c}" for c in _INPUT_COLUMNS.split(", "))
        markers = (
            f"SELECT s.request_id, CAST(NULL AS VARCHAR) AS engine_id, d.day, {inputs} FROM _scope_ids s "
            "LEFT JOIN _scope_days d USING (request_id) LEFT JOIN _scope_inputs i USING (request_id) "
            f"UNION ALL SELECT NULL, NULL, NULL, {inputs} FROM _scope_inputs i WHERE i.request_id IS NULL"
        )
        tables = {
            "analysis_runs": runs,
            # in request id order within each partition: a later run looks up its scope's ids,
            # and the row groups' statistics then skip the groups that hold none of them; the
            # partitions first, so that each is one run of rows (written without a copy)
            "analysis_requests": _arrow(
                con,
                f"SELECT {seq} AS seq, * FROM _scope_rollups "
                f"UNION ALL BY NAME SELECT {seq} AS seq, * FROM ({markers}) "
                "ORDER BY day, engine_id, request_id",
            ),
            "analysis_findings": _arrow(
                con,
                f"SELECT {seq} AS seq, f.*, d.day FROM _scope_findings f "
                "LEFT JOIN _scope_days d ON d.request_id = f.request_id "
                "ORDER BY d.day, f.engine_id, f.request_id",
            ),
            "analysis_rank_windows": _arrow(con, f"SELECT {seq} AS seq, * FROM _scope_window_rows"),
            "analysis_counts": _arrow(con, f"SELECT {seq} AS seq, * FROM _run_counts"),
            "analysis_scrapes": _arrow(
                con, f"SELECT {seq} AS seq, * FROM _scope_scrapes ORDER BY day, instance, end_ts"
            ),
            "analysis_scrape_series": _arrow(
                con, f"SELECT {seq} AS seq, * FROM _scope_scrape_series ORDER BY day, instance, metric"
            ),
        }
        if self.result is not None:
            # every finding of the rules run over the whole store, with the day of its span
            tables["analysis_run_findings"] = _arrow(
                con,
                f"SELECT {seq} AS seq, rule, {_COLUMNS}, "
                "CAST(make_timestamp(CAST(start_ts * 1e6 AS BIGINT)) AS DATE) AS day "
                f"FROM ({self.result[2]}) ORDER BY day, engine_id, rule, {_COLUMNS}",
            )
        return tables


def _arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    got = con.sql(sql).arrow()
    return got.read_all() if isinstance(got, pa.RecordBatchReader) else got


def _empty_sources() -> pa.Table:
    from hybridtrace.schema import table_schema

    return table_schema("sources").arrow_schema().empty_table()


# The scope's rollups, one row per (engine, request) that has reads or a request record
# (read in the scope-cut views): the sums of _accounting_totals, the critical path of
# _request_reads and the handoff's prefill time.
_SCOPE_ROLLUPS = """
CREATE OR REPLACE TEMP TABLE _scope_rollups AS
WITH acc AS (
    SELECT engine_id, request_id, _key(engine_id, request_id) AS k, count(*) AS reads,
           count(*) FILTER (WHERE status = 'ok') AS reads_ok,
           count(*) FILTER (WHERE status = 'ok' AND expected_bytes IS NOT NULL) AS reads_sized,
           sum(logical_bytes) FILTER (WHERE status = 'ok') AS logical_bytes,
           sum(expected_bytes) FILTER (WHERE status = 'ok') AS expected_bytes,
           sum(reserved_bytes) FILTER (WHERE status = 'ok') AS reserved_bytes,
           sum(transported_bytes) FILTER (WHERE status = 'ok') AS transported_bytes,
           sum(transported_bytes) FILTER (WHERE status = 'ok' AND expected_bytes IS NOT NULL)
               AS sized_transported_bytes,
           -- what the report reads of the reads' byte counts (report.sql's _report_request_sums)
           sum(excess_bytes) FILTER (WHERE status = 'ok') AS excess_bytes,
           max(transferred_tokens) AS max_tokens,
           min(share) AS share_lo, max(share) AS share_hi, count(share) AS share_n
    FROM transfer_bytes GROUP BY ALL
),
-- the reads each share counts (report.sql's _report_share_reads): one share for nearly every
-- request (its least and greatest share are one), a list for the few whose reads make
-- several, read again for those alone (a list per request cost a quarter of a full run's
-- rollups, a second pass over the reads another)
shm AS (
    SELECT _key(engine_id, request_id) AS k,
           CAST(to_json(list({'share': share, 'reads': n} ORDER BY share)) AS VARCHAR) AS shares
    FROM (
        SELECT t.engine_id, t.request_id, t.share, count(*) AS n FROM transfer_bytes t
        SEMI JOIN (SELECT engine_id, request_id FROM acc WHERE share_lo <> share_hi) m
            ON t.engine_id IS NOT DISTINCT FROM m.engine_id AND t.request_id IS NOT DISTINCT FROM m.request_id
        WHERE t.share IS NOT NULL GROUP BY ALL
    )
    GROUP BY ALL
),
rr AS (SELECT _key(engine_id, request_id) AS k, slowest_rank, critical_path_s FROM _request_reads),
-- the prefill engines its reads name: the least and the greatest, which tell one from several
-- (a count of distinct ones per request costs a grouping of every read of its own)
tx AS (
    SELECT engine_id, request_id, _key(engine_id, request_id) AS k,
           count(*) FILTER (WHERE status = 'failed') AS failed_reads,
           min(remote_engine_id) AS remote_lo, max(remote_engine_id) AS remote_hi,
           bool_or(remote_engine_id IS NULL) AS null_remote
    FROM transfers GROUP BY engine_id, request_id
),
-- counted and listed for the few requests whose reads name several
txm AS (
    SELECT _key(t.engine_id, t.request_id) AS k, count(DISTINCT t.remote_engine_id) AS remote_count,
           CAST(to_json(list(DISTINCT t.remote_engine_id ORDER BY t.remote_engine_id)
                FILTER (WHERE t.remote_engine_id IS NOT NULL)) AS VARCHAR) AS remotes
    FROM transfers t
    SEMI JOIN (SELECT engine_id, request_id FROM tx WHERE remote_lo <> remote_hi) m
        ON t.engine_id IS NOT DISTINCT FROM m.engine_id AND t.request_id IS NOT DISTINCT FROM m.request_id
    GROUP BY ALL
),
-- the prefill engines its expired reads name, for the few with one
txe AS (
    SELECT _key(engine_id, request_id) AS k, list(DISTINCT remote_engine_id) AS expired_remotes
    FROM transfers WHERE status = 'expired' AND remote_engine_id IS NOT NULL GROUP BY ALL
),
-- the request records that name a failure or an expiry (_named_trace_events counts them)
rq AS (
    SELECT engine_id, request_id, _key(engine_id, request_id) AS k,
           count(*) FILTER (WHERE status = 'failed') AS failed_records,
           list(DISTINCT remote_engine_id) FILTER (WHERE status = 'expired' AND remote_engine_id IS NOT NULL)
               AS expired_remotes
    FROM requests WHERE status IN ('failed', 'expired') GROUP BY engine_id, request_id
),
-- the prefill engine its record names (_record_engine_pairs; ``requests`` holds one record per
-- request): a failed handshake leaves a record naming the pair and no read
rp AS (
    SELECT engine_id, request_id, _key(engine_id, request_id) AS k, remote_engine_id AS record_remote
    FROM requests WHERE remote_engine_id IS NOT NULL
),
h AS (
    SELECT engine_id, request_id, _key(engine_id, request_id) AS k, prefill_s, missing_tokens, prefill_source
    FROM handoffs
),
u AS (
    SELECT engine_id, request_id, _key(engine_id, request_id) AS k, remote_engine_id, missing_tokens,
           measured_prefill_s, read_bytes
    FROM _scope_untimed
),
-- every key with a read is in tx (a handoff has reads too); an untimed handoff, a failed or
-- expired request, a record naming a prefill engine may have none
keys AS (
    SELECT engine_id, request_id, k FROM tx UNION SELECT engine_id, request_id, k FROM u
    UNION SELECT engine_id, request_id, k FROM rq UNION SELECT engine_id, request_id, k FROM rp
)
SELECT keys.request_id, keys.engine_id, d.day,
       acc.reads, acc.reads_ok, acc.reads_sized, acc.logical_bytes, acc.expected_bytes, acc.reserved_bytes,
       acc.transported_bytes, acc.sized_transported_bytes,
       rr.k IS NOT NULL AS has_reads, rr.slowest_rank, rr.critical_path_s,
       acc.excess_bytes, acc.max_tokens, CASE WHEN acc.share_lo = acc.share_hi THEN acc.share_lo END AS share,
       CASE WHEN acc.share_lo = acc.share_hi THEN CAST(acc.share_n AS HUGEINT) END AS share_reads, shm.shares,
       h.k IS NOT NULL AS handoff, h.prefill_s, h.missing_tokens AS handoff_missing_tokens, h.prefill_source,
       -- its failed reads, or (none failed) its failed records: what _named_trace_events counts
       coalesce(nullif(tx.failed_reads, 0), rq.failed_records, 0) AS failed_named,
       CASE WHEN tx.remote_lo IS NULL THEN 0 WHEN tx.remote_lo = tx.remote_hi THEN 1 ELSE txm.remote_count END
           AS remote_count,
       CASE WHEN tx.remote_lo = tx.remote_hi THEN tx.remote_lo END AS remote_engine_id, txm.remotes,
       tx.null_remote, rp.record_remote,
       CASE WHEN len(list_distinct(list_concat(txe.expired_remotes, rq.expired_remotes))) > 0
            THEN CAST(to_json(list_sort(list_distinct(list_concat(txe.expired_remotes, rq.expired_remotes))))
                      AS VARCHAR) END AS expired_named_remotes,
       u.k IS NOT NULL AS untimed, u.remote_engine_id AS untimed_remote_engine_id, u.missing_tokens,
       u.measured_prefill_s, u.read_bytes
FROM keys
LEFT JOIN tx USING (k)
LEFT JOIN txm USING (k)
LEFT JOIN txe USING (k)
LEFT JOIN acc USING (k)
LEFT JOIN rr USING (k)
LEFT JOIN h USING (k)
LEFT JOIN u USING (k)
LEFT JOIN rq USING (k)
LEFT JOIN shm USING (k)
LEFT JOIN rp USING (k)
LEFT JOIN _scope_days d ON d.request_id = keys.request_id
"""

# The request-scoped inputs' rows (the _input_counts view) per scope request id, and of the rows
# that name none (request_id null), as the markers carry them: what the counters of those
# counts are changed by.
_INPUT_COLUMNS = (
    "input_transfers, input_transfers_ok, input_requests, input_requests_with_tokens, input_log_events, "
    "input_trace_records_dropped"
)
_SCOPE_INPUTS = """
CREATE OR REPLACE TEMP TABLE _scope_inputs AS
SELECT request_id,
       CAST(coalesce(sum(input_transfers), 0) AS BIGINT) AS input_transfers,
       CAST(coalesce(sum(input_transfers_ok), 0) AS BIGINT) AS input_transfers_ok,
       CAST(coalesce(sum(input_requests), 0) AS BIGINT) AS input_requests,
       CAST(coalesce(sum(input_requests_with_tokens), 0) AS BIGINT) AS input_requests_with_tokens,
       CAST(coalesce(sum(input_log_events), 0) AS BIGINT) AS input_log_events,
       CAST(coalesce(sum(input_trace_records_dropped), 0) AS BIGINT) AS input_trace_records_dropped
FROM (
    -- from the rows the scope holds, as _input_counts_of_rows counts them: each request's reads
    -- grouped once (every read, those naming no request too), one row per request record; one
    -- grouping of them all (a grouping of the records first cost as much again)
    SELECT request_id, reads AS input_transfers, reads_ok AS input_transfers_ok, 0 AS input_requests,
           0 AS input_requests_with_tokens, 0 AS input_log_events, 0 AS input_trace_records_dropped
    FROM _request_reads
    UNION ALL
    SELECT request_id, 0, 0, 1, CAST(transferred_tokens IS NOT NULL AS INTEGER), 0, 0 FROM _request_rows
    UNION ALL
    SELECT request_id, 0, 0, 0, 0, count(*),
           sum(TRY_CAST(json_extract(details, '$.records') AS BIGINT)) FILTER (WHERE kind = 'trace_dropped')
    FROM log_events GROUP BY request_id
    {stats_lines}
) GROUP BY request_id
"""

# The input counts of a relation of markers (as _scope_inputs has them, with their day and a
# sign: 1 for the scope's, -1 for those they replace).
_INPUT_COUNTS = """
SELECT CAST(NULL AS VARCHAR) AS engine_id, day, counter, CAST(NULL AS VARCHAR) AS key, value FROM (
    UNPIVOT (SELECT day, """ + ", ".join(
    f"CAST(coalesce(sum(sign * {c}), 0) AS BIGINT) AS {c}" for c in _INPUT_COLUMNS.split(", ")
) + """ FROM {markers} GROUP BY day)
    ON COLUMNS(* EXCLUDE (day)) INTO NAME counter VALUE value
)
"""

# _input_counts from the counters.
_STATE_INPUT_COUNTS = "SELECT " + ", ".join(
    f"CAST(coalesce(sum(value) FILTER (WHERE counter = '{c}'), 0) AS BIGINT) AS {c.removeprefix('input_')}"
    for c in _INPUT_COLUMNS.split(", ")
) + " FROM _current_counts WHERE engine_id IS NULL"

# The four byte counts' sums (and the sized reads' transported bytes) the fleet-wide totals read.
_BYTE_SUMS = (
    "logical_bytes", "expected_bytes", "reserved_bytes", "transported_bytes", "sized_transported_bytes",
)  # fmt: skip
# The columns of _SCOPE_ROLLUPS that are sums of 64-bit counts.
_ROLLUP_SUMS = (*_BYTE_SUMS, "excess_bytes", "share_reads")

# Each scope request id's day (its earliest record): the partition its state rows go to.
_SCOPE_DAYS = """
CREATE OR REPLACE TEMP TABLE _scope_days AS
SELECT request_id, min(day) AS day FROM (
    SELECT request_id, day FROM transfers UNION ALL SELECT request_id, day FROM request_records
    UNION ALL SELECT request_id, day FROM log_events
) WHERE {in_scope} GROUP BY request_id
"""

# The per-rank medians of the windows new reads fall into, from every read of those windows
# (a window only gains reads: every rank's row is kept, and the HAVING of _rank_windows is
# applied when they are read), with each rank's peers' median.
_SCOPE_WINDOWS = """
CREATE OR REPLACE TEMP TABLE _scope_window_rows AS
WITH per_rank AS (
    SELECT t.engine_id, t.rank, floor(t.ts / _t('window_s')) AS window_index, count(*) AS reads,
           median(t.transported_bytes / t.xfer_s) / 1e9 AS median_gb_s, min(t.day) AS day
    FROM transfers t
    SEMI JOIN _scope_windows w ON w.engine_id = t.engine_id AND w.window_index = floor(t.ts / _t('window_s'))
    WHERE t.status = 'ok' AND t.xfer_s > 0
      -- the windows' span (a window wider on each side: floor(ts / window_s) rounds), so that
      -- files and row groups of other times are skipped unread
      AND t.ts >= (SELECT (min(window_index) - 1) * _t('window_s') FROM _scope_windows)
      AND t.ts < (SELECT (max(window_index) + 2) * _t('window_s') FROM _scope_windows)
    GROUP BY t.engine_id, t.rank, floor(t.ts / _t('window_s'))
)
-- each rank's peers as _rank_windows (findings_engines.sql) takes them: the other ranks of the
-- window with enough reads; every rank of a window is recomputed together, so this stays true
-- until the window is recomputed again, and no run compares every window of the store anew
SELECT a.engine_id, a.rank, a.window_index, a.reads, a.median_gb_s,
       (SELECT median(b.median_gb_s) FROM per_rank b
        WHERE b.engine_id = a.engine_id AND b.window_index = a.window_index AND b.rank <> a.rank
          AND b.reads >= _t('slow_rank_min_reads')) AS peer_median_gb_s,
       a.day
FROM per_rank a
"""

# The counts of a relation of rollups (as _scope_rollups has them, with a sign: 1 for the
# scope's, -1 for the stored ones they replace), per (engine, day): the change to the sums
# _accounting_totals, slow_rank and recompute_cheaper's inputs read, and to each request's
# prefill engines (_config_pairs). A byte sum has its count of requests with a value beside it,
# so that a sum over none stays null. Summed over runs they are the counts of the current rollups.
_COUNTS = """
WITH r AS (SELECT * FROM {rollups}),
sums AS (
    SELECT engine_id, day,
           CAST(sum(sign * reads) AS BIGINT) AS reads, CAST(sum(sign * reads_ok) AS BIGINT) AS reads_ok,
           CAST(sum(sign * reads_sized) AS BIGINT) AS reads_sized,
""" + "".join(
    f"           CAST(sum(sign * {c}) AS BIGINT) AS {c},\n"
    f"           CAST(coalesce(sum(sign) FILTER (WHERE {c} IS NOT NULL), 0) AS BIGINT)\n"
    f"               AS {c}_n,\n"
    for c in _BYTE_SUMS
) + """           CAST(coalesce(sum(sign) FILTER (WHERE handoff AND prefill_s IS NOT NULL), 0) AS BIGINT)
               AS handoff_prefill,
           CAST(coalesce(sum(sign) FILTER (WHERE has_reads AND critical_path_s IS NOT NULL), 0) AS BIGINT)
               AS critical_path,
           CAST(coalesce(sum(sign * failed_named), 0) AS BIGINT) AS failed_named
    FROM r GROUP BY ALL
),
pairs AS (
    SELECT engine_id, day, sign, remote_engine_id AS remote FROM r WHERE remote_count = 1
    UNION ALL
    SELECT engine_id, day, sign, unnest(CAST(json_extract_string(remotes, '$[*]') AS VARCHAR[])) FROM r
    WHERE remote_count > 1
    UNION ALL SELECT engine_id, day, sign, CAST(NULL AS VARCHAR) FROM r WHERE null_remote
),
record_pairs AS (
    SELECT engine_id, day, sign, record_remote AS remote FROM r WHERE record_remote IS NOT NULL
)
SELECT engine_id, day, counter, CAST(NULL AS VARCHAR) AS key, value
FROM (UNPIVOT sums ON COLUMNS(* EXCLUDE (engine_id, day)) INTO NAME counter VALUE value)
UNION ALL
SELECT engine_id, day, 'led', CAST(slowest_rank AS VARCHAR), CAST(sum(sign) AS BIGINT) FROM r
WHERE has_reads AND slowest_rank IS NOT NULL GROUP BY ALL
UNION ALL
SELECT engine_id, day, 'pair', remote, CAST(sum(sign) AS BIGINT) FROM pairs GROUP BY ALL
UNION ALL
SELECT engine_id, day, 'record_pair', remote, CAST(sum(sign) AS BIGINT) FROM record_pairs GROUP BY ALL
UNION ALL
SELECT engine_id, day, 'expired_named', remote, CAST(sum(sign) AS BIGINT) FROM (
    SELECT engine_id, day, sign,
           unnest(CAST(json_extract_string(expired_named_remotes, '$[*]') AS VARCHAR[])) AS remote
    FROM r WHERE expired_named_remotes IS NOT NULL
) GROUP BY ALL
"""

# The findings of a relation of stored findings (as _scope_findings has them, with their day and
# a sign as above), counted per (engine, day) and (rule view, kind, severity): the analysis'
# summary counts. Those that name no request count in the run that found them only, as
# _merged_findings lists them.
_FINDING_COUNTS = """
SELECT engine_id, day, 'findings' AS counter, CAST(to_json([rule, kind, severity]) AS VARCHAR) AS key,
       CAST(sum(sign) AS BIGINT) AS value
FROM {findings} WHERE request_id IS NOT NULL GROUP BY ALL
"""

# Every finding of CURRENT_FINDINGS counted as _analyze counts them: the stored ones from the
# counts, those judged by the current fits as they are.
_CURRENT_FINDING_COUNTS = """
SELECT rule, kind, severity, CAST(sum(n) AS BIGINT) AS n FROM (
    SELECT json_extract_string(key, '$[0]') AS rule, json_extract_string(key, '$[1]') AS kind,
           json_extract_string(key, '$[2]') AS severity, value AS n
    FROM _current_counts WHERE counter = 'findings'
    UNION ALL SELECT rule, kind, severity, count(*) FROM _fitted_findings GROUP BY ALL
    UNION ALL SELECT rule, kind, severity, count(*) FROM _scope_findings WHERE request_id IS NULL GROUP BY ALL
) GROUP BY ALL HAVING sum(n) > 0
"""

_TOTALS = """
SELECT coalesce(sum(value) FILTER (WHERE counter = 'reads'), 0) AS reads,
       coalesce(sum(value) FILTER (WHERE counter = 'reads_ok'), 0) AS reads_ok,
       coalesce(sum(value) FILTER (WHERE counter = 'reads_sized'), 0) AS reads_sized,
""" + ",\n".join(
    f"       CASE WHEN sum(value) FILTER (WHERE counter = '{name}_n') > 0 "
    f"THEN coalesce(sum(value) FILTER (WHERE counter = '{name}'), 0) END AS {name}"
    for name in _BYTE_SUMS
) + """
FROM _current_counts
"""

# What _config_pairs reads of the reads and the request records, from the state: each
# request's prefill engines (the pair counts).
_TRANSFER_PAIRS = """
SELECT engine_id, key AS remote_engine_id FROM _current_counts WHERE counter = 'pair' AND value > 0
"""
_RECORD_PAIRS = """
SELECT engine_id, key AS remote_engine_id FROM _current_counts WHERE counter = 'record_pair' AND value > 0
"""
# What _named_trace_events counts, from the state: failures per decode engine, expiries per
# prefill engine (the key).
_NAMED_TRACE_EVENTS = """
SELECT engine_id, 'failed' AS event, value AS named FROM _current_counts
WHERE counter = 'failed_named' AND value <> 0
UNION ALL
SELECT key, 'expired', CAST(sum(value) AS BIGINT) FROM _current_counts WHERE counter = 'expired_named'
GROUP BY key HAVING sum(value) <> 0
"""

_RANK_WINDOWS = """
SELECT engine_id, rank, window_index AS "window", reads, median_gb_s, peer_median_gb_s FROM _merged_windows
WHERE reads >= _t('slow_rank_min_reads')
"""


@contextmanager
def incremental_views(
    con: duckdb.DuckDBPyConnection,
    store: Store,
    *,
    full: bool,
    scope: Callable[[IncrementalRun], None] | None = None,
    write: bool = True,
    run: IncrementalRun | None = None,
) -> Iterator[IncrementalRun]:
    """Plan, compute and commit an incremental run; inside, the views read the merged state.

    ``scope`` as ``IncrementalRun.compute`` takes it; ``write=False`` commits no state.
    ``run`` is one that looked at the state already (``answer_unchanged`` did).
    """
    run = run if run is not None else IncrementalRun(con, store, full=full)
    run.plan()
    run.compute(scope)
    with run.merged_views():
        yield run
    # after the analysis: its result is kept with the state (a run killed before this commits
    # nothing, and the state stays as it was)
    run.counts["written"] = int(run.write() if write else False)


def answer_unchanged(run: IncrementalRun) -> tuple[dict, dict, str] | None:
    """The last committed run's answer when nothing changed since (no new batch, the same
    thresholds and code): its input counts, its summary, and the SQL of its findings (those
    it recomputed over the whole store, and the stored ones as they stand); None otherwise.
    ``run`` has looked at the state (``IncrementalRun.look``); without an answer, it plans on.

    The scheduled job runs every few minutes and most runs find nothing new: such a run then
    reads a few rows of the state instead of running the rules. Engines' inputs to the rules
    come from the data, so they cannot change without a new batch. It leaves ``_merged_requests``
    and ``_merged_findings`` as an analysis of the merged state does (the report reads them)."""
    if run.last is None or run.batches:
        return None
    seq, thresholds, _, version, code, result, _ = run.last
    if version != STATE_VERSION or code != _code() or result is None or thresholds != run.thresholds:
        return None
    con = run.con
    answering = IncrementalRun(con, run.store, full=False, seq=seq + 1)
    con.execute("CREATE OR REPLACE TEMP TABLE _scope_ids (request_id VARCHAR)")
    answering.reuse_scope()
    no_scrapes(con)
    answering.merge(_scalar(con, _LAST_FULL_RUN))
    answer = json.loads(result)
    findings = f"SELECT rule, {_COLUMNS} FROM analysis_run_findings WHERE seq = {seq}"
    return answer["inputs"], answer["summary"], findings


def _code() -> str:
    """What a run's result rests on besides the data and thresholds: the code and the state's layout."""
    from hybridtrace.store.catalog import code_key

    return f"{code_key()}/{STATE_VERSION}"


# The new reads that are vLLM logs: one may rename an engine (``_peak_prefill_rates``). Of
# the new reads ``look`` kept, not of the manifest again (a week of reads: 40,000 rows).
_NEW_LOG_READS = "SELECT count(*) FROM _new_sources WHERE format = 'vllm_log' AND source_id IS NOT NULL"
# The ingest batches some run covered, and the newest full run (0 when none).
_ANALYZED_BATCHES = (
    "SELECT unnest(CAST(json_extract_string(batches, '$[*]') AS VARCHAR[])) AS batch_id FROM analysis_runs"
)
_LAST_FULL_RUN = "SELECT coalesce(max(seq) FILTER (WHERE full_run), 0) FROM analysis_runs"
_THRESHOLDS_DIGEST = (
    "SELECT md5(coalesce(string_agg(name || '=' || CAST(value AS VARCHAR), ';' ORDER BY name), '')) "
    "FROM _thresholds"
)
