"""The analysis on Spark (``analyze``, ``report`` and ``run`` with ``--engine spark``).

The views are DuckDB SQL, so DuckDB runs inside each Spark task. The split is the one the
incremental analysis makes (``analyze/incremental.py``): the request-scope rules, the
per-request rollups and the slow-rank windows are computed for a set of request ids
(``_scope_ids``) and windows (``_scope_windows``); everything that spans partitions (the
engine pairs, the native-metrics rules, slow_rank's verdicts, output_mismatch, the input
counts) runs on the merged result. Here the driver plans the run as a local one does
(``IncrementalRun.plan``), cuts the scope into parts and hands ``IncrementalRun.compute``
a ``scope`` that computes the parts on executors; the driver then merges and analyses as
a local run does, and writes the incremental state the same way.

A part is a (day, decode engine) partition, the one the incremental state is kept in:

- **Request ids** go in groups that must be computed together: requests that share a
  prefill request id (``kv_expired`` matches prefill ids across engines) and a request id
  two engines used, closed over the records' and the reads' (request, prefill request)
  pairs. A group's home is the earliest (day, engine) of its reads (else of its records,
  else of its log events).
- **Files:** a part reads, of ``transfers``, ``requests`` and ``log_events``, the files of
  every (day, engine) folder its ids have rows in — a prefill engine's records and log
  lines live under that engine, a request's rows can cross midnight — and of its windows'
  engines the reads' folders of the days a window touches (with a day's margin each side:
  a window can cross a day edge). Every other table is read whole (small, or read only
  by the rules that run on the driver).
- **Engine-wide inputs** the request-scope rules read besides their requests' own rows are
  computed once on the driver and shipped: ``engine_models`` (each engine sized once), the
  link fits (fitted from every read) and each engine's peak prefill rate (from its log's
  stats lines), with the thresholds.
- **Rows that name no request** (a log event without a request id) are findings of their
  own, computed on the driver over the whole store with an empty scope: a part drops the
  rows it finds with no request id, so none is counted twice.

An executor needs hybridtrace (the spark extra) and read access to the store: it opens
the committed files the driver names, never lists or writes the store.
"""

from __future__ import annotations

import datetime as dt
import pickle
import traceback
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from hybridtrace.buckets import redact
from hybridtrace.errors import HybridtraceError
from hybridtrace.schema import TABLES
from hybridtrace.spark.session import SparkOptions, open_session
from hybridtrace.spark.tasks import _ipc, table_of

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import SparkSession

    from hybridtrace.analyze.incremental import IncrementalRun

__all__ = ["Part", "Shared", "SparkScope", "compute_part", "plan_parts"]

# The tables cut per partition, and the raw view of each whose engine_id is its folder's
# (log_events' own view names the engine a later read named; requests' keeps one record).
PARTITIONED = {"transfers": "transfers", "requests": "request_records", "log_events": "_log_events_as_read"}
# those whose rows naming no request the driver computes (``SparkScope._null_rows``)
_NAMED_ROWS = ("_scope_findings", "_scope_rollups", "_scope_inputs")
SCOPE_TABLES = ("_scope_findings", "_scope_rollups", "_scope_inputs", "_scope_days", "_scope_window_rows")
# Rounds of the label propagation that groups request ids; past it, one group for all.
_GROUP_ROUNDS = 64
# A part of more request ids than this is not joined with others in one Spark task.
TASK_IDS = 200_000
TASKS_PER_CORE = 2
_DAY = 86_400.0


@dataclass
class Shared:
    """What every part reads alike: the store, the whole tables' files, the engine-wide inputs."""

    location: str
    thresholds: dict[str, float]
    files: dict[str, list[str]]
    engine_models: bytes
    link_fits: bytes
    peak_prefill: bytes


@dataclass
class Part:
    """One Spark task's share: request ids and windows, and the partitioned tables' files."""

    index: int
    ids: list[str] = field(default_factory=list)
    windows: list[tuple[str, float]] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)
    homes: list[tuple[str, str]] = field(default_factory=list)  # its (day, engine) partitions


def _folder(table: str, day: object, engine: object) -> str:
    from hybridtrace.store.commit import _partition_dir

    return f"{table}/day={_partition_dir(day)}/engine_id={_partition_dir(engine)}"


def _arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    got = con.sql(sql).arrow()
    return got.read_all() if isinstance(got, pa.RecordBatchReader) else got


def _day_of(ts: float) -> dt.date:
    return dt.datetime.fromtimestamp(ts, dt.UTC).date()


# The graph of request ids to compute together: (request, prefill request) of records and reads.
_EDGES = """
CREATE OR REPLACE TEMP TABLE _spark_edges AS
SELECT DISTINCT a, b FROM (
    SELECT request_id AS a, remote_request_id AS b FROM request_records
    WHERE request_id IN (SELECT request_id FROM _scope_ids)
       OR remote_request_id IN (SELECT request_id FROM _scope_ids)
    UNION ALL
    SELECT request_id, remote_request_id FROM transfers
    WHERE request_id IN (SELECT request_id FROM _scope_ids)
       OR remote_request_id IN (SELECT request_id FROM _scope_ids)
) WHERE a IS NOT NULL AND b IS NOT NULL AND a <> b
"""
_LABELS = """
CREATE OR REPLACE TEMP TABLE _spark_labels AS
SELECT id, id AS label FROM (
    SELECT request_id AS id FROM _scope_ids UNION SELECT a FROM _spark_edges UNION SELECT b FROM _spark_edges
)
"""
_PROPAGATE = """
CREATE OR REPLACE TEMP TABLE _spark_next AS
SELECT l.id, least(l.label, coalesce(min(n.label), l.label)) AS label
FROM _spark_labels l
LEFT JOIN (SELECT a AS id, b AS other FROM _spark_edges UNION ALL SELECT b, a FROM _spark_edges) e
    ON e.id = l.id
LEFT JOIN _spark_labels n ON n.id = e.other
GROUP BY l.id, l.label
"""
# Each scope id's folders: (table, day, engine) of its rows, as stored.
_ID_FOLDERS = " UNION ALL ".join(
    f"SELECT DISTINCT '{table}' AS tbl, request_id, day, engine_id FROM {view} "
    "WHERE request_id IN (SELECT request_id FROM _scope_ids)"
    for table, view in PARTITIONED.items()
)


def _groups(con: duckdb.DuckDBPyConnection) -> None:
    """``_spark_labels``: each request id's group (the least id it is connected to)."""
    con.execute(_EDGES)
    con.execute(_LABELS)
    for _ in range(_GROUP_ROUNDS):
        con.execute(_PROPAGATE)
        moved = con.sql(
            "SELECT count(*) FROM _spark_next n JOIN _spark_labels l USING (id) WHERE n.label <> l.label"
        ).fetchall()[0][0]
        con.execute("CREATE OR REPLACE TEMP TABLE _spark_labels AS SELECT * FROM _spark_next")
        if not moved:
            return
    # chained further than the rounds go: one group, which is right, only less parallel
    con.execute("UPDATE _spark_labels SET label = ''")


def plan_parts(run: IncrementalRun, tasks: int) -> tuple[Shared, list[Part]]:
    """The run's scope as at most ``tasks`` parts (none for an empty scope), and what they share."""
    con, store = run.con, run.store
    batches = store.committed_batches()
    listing = {name: store.committed_files(name, batches) for name in TABLES}
    folders: dict[str, list[str]] = defaultdict(list)
    for name in PARTITIONED:
        for rel in listing[name]:
            folders[rel.rsplit("/", 1)[0]].append(rel)
    shared = Shared(
        location=store.location,
        thresholds=dict(con.sql("SELECT name, value FROM _thresholds").fetchall()),
        files={name: files for name, files in listing.items() if name not in PARTITIONED},
        engine_models=_ipc(_arrow(con, "SELECT * FROM engine_models")),
        link_fits=_ipc(_arrow(con, "SELECT * FROM _link_fits")),
        # the run's peaks (plan kept them: from the state and the new lines, not every line)
        peak_prefill=_ipc(_arrow(con, "SELECT * FROM _run_peak_prefill_rate")),
    )
    _groups(con)
    # per group: its ids (of the scope), the folders they have rows in, its home
    rows = con.sql(
        f"""
        SELECT l.label, f.tbl, f.request_id, f.day, f.engine_id
        FROM ({_ID_FOLDERS}) f JOIN _spark_labels l ON l.id = f.request_id
        """
    ).fetchall()
    in_scope = con.sql(
        "SELECT l.label, s.request_id FROM _scope_ids s JOIN _spark_labels l ON l.id = s.request_id"
    ).fetchall()
    group_ids: dict[str, list[str]] = defaultdict(list)
    for label, request_id in in_scope:
        group_ids[label].append(request_id)
    group_folders: dict[str, set[str]] = defaultdict(set)
    group_home: dict[str, tuple[int, str, str]] = {}
    rank = {"transfers": 0, "requests": 1, "log_events": 2}
    for label, table, _, day, engine in rows:
        group_folders[label].add(_folder(table, day, engine))
        home = (rank[table], str(day), str(engine))
        if label not in group_home or home < group_home[label]:
            group_home[label] = home
    units: dict[tuple[str, str], Part] = {}

    def unit(key: tuple[str, str]) -> Part:
        if key not in units:
            units[key] = Part(len(units), homes=[key])
        return units[key]

    unit_folders: dict[tuple[str, str], set[str]] = defaultdict(set)
    for label, ids in group_ids.items():
        _, day, engine = group_home.get(label, (3, "", ""))
        key = (day, engine)
        unit(key).ids.extend(ids)
        unit_folders[key] |= group_folders.get(label, set())
    window_s = shared.thresholds["window_s"]
    for engine, index in con.sql("SELECT engine_id, window_index FROM _scope_windows").fetchall():
        if engine is None or index is None:
            continue  # no read of such a window is counted (the windows join on engine and index)
        first, last = _day_of(index * window_s), _day_of((index + 1) * window_s)
        key = (str(first), str(engine))
        unit(key).windows.append((engine, index))
        day = first - dt.timedelta(days=1)
        while day <= last + dt.timedelta(days=1):
            unit_folders[key].add(_folder("transfers", day, engine))
            day += dt.timedelta(days=1)
    parts = []
    for part, wanted in _pack(list(units.values()), unit_folders, max(tasks, 1)):
        for name in PARTITIONED:
            mine = sorted(folder for folder in wanted if folder.startswith(name + "/"))
            part.files[name] = sorted(f for folder in mine for f in folders.get(folder, []))
        parts.append(part)
    return shared, parts


def _pack(
    units: list[Part], unit_folders: dict[tuple[str, str], set[str]], tasks: int
) -> list[tuple[Part, set[str]]]:
    """Units into at most ``tasks`` parts (more when a part would hold over ``TASK_IDS`` ids),
    each with the folders it reads: the largest first, each to the part with the least work."""
    if not units:
        return []
    work = [len(u.ids) + len(u.windows) for u in units]
    count = min(len(units), max(tasks, -(-sum(work) // TASK_IDS)))
    parts = [Part(i) for i in range(count)]
    load = [0] * count
    chosen: list[set[str]] = [set() for _ in range(count)]
    for u, size in sorted(zip(units, work, strict=True), key=lambda x: (-x[1], x[0].homes)):
        i = load.index(min(load))
        parts[i].ids.extend(u.ids)
        parts[i].windows.extend(u.windows)
        parts[i].homes.extend(u.homes)
        chosen[i] |= unit_folders[u.homes[0]]
        load[i] += size
    return [(p, c) for p, c in zip(parts, chosen, strict=True) if p.ids or p.windows]


# --- on an executor ---------------------------------------------------------------------


def part_connection(shared: Shared, part: Part) -> duckdb.DuckDBPyConnection:
    """A connection on the part's files, with the engine-wide inputs the driver computed."""
    from hybridtrace.analyze.thresholds import install as install_thresholds
    from hybridtrace.queries_loader import install_views
    from hybridtrace.store.commit import Store
    from hybridtrace.store.raw_views import raw_connection

    store = Store(shared.location)
    con = raw_connection(store, {**shared.files, **part.files})
    con.register("_engine_models_table", table_of(shared.engine_models))
    con.execute("CREATE VIEW engine_models AS SELECT * FROM _engine_models_table")
    install_thresholds(con, shared.thresholds)
    install_views(con)
    con.register("_shipped_link_fits", table_of(shared.link_fits))
    con.execute("INSERT INTO _link_fits BY NAME SELECT * FROM _shipped_link_fits")
    con.register("_shipped_peak_prefill", table_of(shared.peak_prefill))
    con.execute("CREATE OR REPLACE VIEW _peak_prefill_rate AS SELECT * FROM _shipped_peak_prefill")
    return con


def compute_part(shared: Shared, part: Part) -> dict[str, bytes]:
    """The scope tables of one part, as Arrow IPC streams (rows naming no request left out)."""
    from hybridtrace.analyze.incremental import IncrementalRun
    from hybridtrace.store.commit import Store

    con = part_connection(shared, part)
    con.register("_part_ids", pa.table({"request_id": pa.array(part.ids, pa.string())}))
    con.execute("CREATE OR REPLACE TEMP TABLE _scope_ids AS SELECT request_id FROM _part_ids")
    engines, indexes = zip(*part.windows, strict=True) if part.windows else ((), ())
    con.register("_part_windows", pa.table({"engine_id": pa.array(engines, pa.string()),
                                            "window_index": pa.array(indexes, pa.float64())}))  # fmt: skip
    con.execute("CREATE OR REPLACE TEMP TABLE _scope_windows AS SELECT * FROM _part_windows")
    IncrementalRun(con, Store(shared.location), full=False).compute_scope(cut=True)
    out = {}
    for table in SCOPE_TABLES:
        named = " WHERE request_id IS NOT NULL" if table in _NAMED_ROWS else ""
        out[table] = _ipc(_arrow(con, f"SELECT * FROM {table}{named}"))
    con.close()
    return out


RESULT_SCHEMA = pa.schema([("index", pa.int64()), ("result", pa.binary())])


def compute_partition(shared: bytes, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: each row a pickled ``Part``; yields its index and its pickled
    result (the tables, or the error's text: an executor's traceback is not the driver's)."""
    common = pickle.loads(shared)
    for batch in batches:
        for payload in batch.column("payload").to_pylist():
            part = pickle.loads(payload)
            try:
                result: object = compute_part(common, part)
            except Exception as exc:
                result = "".join(traceback.format_exception(exc))
            yield pa.RecordBatch.from_pydict({"index": [part.index], "result": [pickle.dumps(result)]},
                                             schema=RESULT_SCHEMA)  # fmt: skip


# --- on the driver ----------------------------------------------------------------------


class SparkScope:
    """``IncrementalRun.compute``'s ``scope``: the scope tables computed on Spark executors."""

    def __init__(self, options: SparkOptions | None = None, session: SparkSession | None = None) -> None:
        self.options = options or SparkOptions()
        self._session = session
        self.parts = 0  # Spark tasks of the last run (for tests and the benchmark)

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            self._session = open_session(self.options)
        return self._session

    def _parallelism(self) -> int:
        try:
            return int(self.session.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect has no SparkContext
            return int(self.session.conf.get("spark.default.parallelism", "8") or 8)

    def __call__(self, run: IncrementalRun) -> None:
        con = run.con
        if not con.sql("SELECT EXISTS (SELECT 1 FROM _scope_ids) OR EXISTS (SELECT 1 FROM _scope_windows)"
                       ).fetchall()[0][0]:  # fmt: skip
            run.compute_scope()  # nothing to hand out
            self.parts = 0
            return
        shared, parts = plan_parts(run, TASKS_PER_CORE * self._parallelism())
        results = self._run(shared, parts)
        self._null_rows(run)
        con.execute("DELETE FROM _scope_findings WHERE request_id IS NOT NULL")
        con.execute("DELETE FROM _scope_rollups WHERE request_id IS NOT NULL")
        con.execute("DELETE FROM _scope_inputs WHERE request_id IS NOT NULL")
        first = True
        for index in sorted(results):
            for table in SCOPE_TABLES:
                name = f"_part{table}"
                con.register(name, table_of(results[index][table]))
                if table == "_scope_window_rows" and first:
                    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM {name}")
                else:
                    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {name}")
                con.unregister(name)
            first = False

    @staticmethod
    def _null_rows(run: IncrementalRun) -> None:
        """The scope tables of the rows that name no request (an empty scope, cut), on this connection."""
        con = run.con
        con.execute("CREATE OR REPLACE TEMP TABLE _spark_scope_ids AS SELECT * FROM _scope_ids")
        con.execute("DELETE FROM _scope_ids")
        try:
            run.compute_scope(cut=True, windows=False)
        finally:
            con.execute("INSERT INTO _scope_ids SELECT * FROM _spark_scope_ids")
            con.execute("DROP TABLE _spark_scope_ids")

    def _run(self, shared: Shared, parts: list[Part]) -> dict[int, dict[str, bytes]]:
        rows = [(part.index, pickle.dumps(part)) for part in parts]
        frame = self.session.createDataFrame(rows, "index long, payload binary").repartition(len(rows))
        try:
            task = partial(compute_partition, pickle.dumps(shared))
            got = frame.mapInArrow(task, "index long, result binary").collect()
        except Exception as exc:
            text = str(exc).strip().splitlines()
            raise HybridtraceError(f"the Spark job failed: {redact(text[0] if text else repr(exc))}") from exc
        self.parts = len(parts)
        results: dict[int, dict[str, bytes]] = {}
        for row in got:
            result = pickle.loads(row["result"])
            if isinstance(result, str):
                raise HybridtraceError(f"a part of the analysis failed on an executor:\n{result}")
            results[row["index"]] = result
        missing = {p.index for p in parts} - set(results)
        if missing:
            raise HybridtraceError(f"the Spark job returned nothing for {len(missing)} of {len(parts)} parts")
        return results
