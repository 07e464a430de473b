"""The store: Parquet files per table, a ``sources`` manifest, DuckDB views over both.

Layout under the store root::

    _meta.json                                   schema version
    transfers/day=2026-11-29/engine_id=d0/part-<batch>-<n>.parquet
    sources/part-<batch>.parquet                 the commit record of a batch

A batch commits when its ``sources`` file appears (written last: by atomic rename in a
folder, by one whole upload in a bucket; see ``storage.py``).
Data files carry their batch id in the name; the views read only files of committed
batches, so a process killed mid-batch leaves a readable store, and the files it left
are removed by the next run, which then reads the same objects again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.errors import StoreDamagedError, UsageError
from hybridtrace.schema import SCHEMA_VERSION, TABLES, TableSchema, table_schema
from hybridtrace.storage import BucketRoot, LeaseHeld, LocalRoot, root_of

if TYPE_CHECKING:
    import duckdb

DEFAULT_STORE = "hybridtrace-data"
# Compaction: batches of at most COMPACT_SMALL_BYTES are merged once there are
# COMPACT_MIN_BATCHES of them, at most COMPACT_MAX_BYTES at a time.
COMPACT_MIN_BATCHES = int(os.environ.get("HYBRIDTRACE_COMPACT_MIN_BATCHES", "32"))
COMPACT_SMALL_BYTES = 64 << 20
COMPACT_MAX_BYTES = 1 << 30
# Superseded files stay this long after their compaction, for readers that listed them.
COMPACT_GRACE_S = float(os.environ.get("HYBRIDTRACE_COMPACT_GRACE_S", "3600"))
_PART = re.compile(r"^part-(?P<batch>[0-9a-f]{32})(?:-\d+)?\.parquet$")
# The reason of a reject for a trace's last record cut short in an object that could no
# longer grow. Should it grow after all, a later read takes the whole line: that read's
# `sources` row reaches past the line, and the `rejects` view drops this reject from then on.
CUT_RECORD = "not valid JSON: last record cut short (no newline after it)"


def default_store() -> str:
    return os.environ.get("HYBRIDTRACE_STORE") or DEFAULT_STORE


def new_batch_id() -> str:
    return uuid.uuid4().hex


def _partition_dir(value: object) -> str:
    # Engine ids can hold any character; keep directory names safe and reversible.
    return quote(str(value), safe="")


class Store:
    """A store root: a local folder, or a bucket prefix (``s3://…``, ``gs://…``)."""

    def __init__(self, root: str | Path) -> None:
        self.location = str(root)
        self.files = root_of(root)
        self.is_bucket = isinstance(self.files, BucketRoot)
        self._lease_check = None  # set while a bucket writer holds its lease
        # local stores keep a Path for callers that want one
        self.root = Path(root) if not self.is_bucket else None

    def __str__(self) -> str:
        return self.files.display

    # --- layout -----------------------------------------------------------------------

    def init(self) -> None:
        self.check_version()
        self.files.make()
        if not self.files.exists("_meta.json"):
            try:
                self.files.write_text("_meta.json", json.dumps({"schema_version": SCHEMA_VERSION}))
            except FileNotFoundError:
                # another process created the store at the same moment (its recovery may
                # have swept our temporary file): theirs is the same file
                if not self.files.exists("_meta.json"):
                    raise

    @property
    def schema_version(self) -> int | None:
        if not self.files.exists("_meta.json"):
            return None
        try:
            return int(json.loads(self.files.read_text("_meta.json"))["schema_version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{self}: _meta.json is damaged ({exc}); this is not a readable store") from exc
        except OSError as exc:
            raise UsageError(f"{self}: cannot read _meta.json: {exc.strerror or exc}") from exc

    @contextlib.contextmanager
    def writer_lock(self, lease_s: float | None = None) -> Iterator[None]:
        """Hold the store's writer lock: one ingest at a time (a crashed one releases it).

        A file lock locally; in a bucket, a lease renewed while the ingest runs, which
        expires ``lease_s`` (HYBRIDTRACE_LEASE_S, default 60 s) after a killed run.
        """
        lease_s = lease_s or float(os.environ.get("HYBRIDTRACE_LEASE_S", "60"))
        try:
            with self.files.lock(".writer.lock", lease_s, "another ingest is writing to this store; "
                                 "try again when it ends") as held:  # fmt: skip
                self._lease_check = held.get("check")
                try:
                    yield
                finally:
                    self._lease_check = None
        except LeaseHeld as held:
            raise UsageError(str(held)) from None

    def check_version(self) -> None:
        version = self.schema_version
        if version is not None and version > SCHEMA_VERSION:
            raise UsageError(
                f"{self}: written by a newer hybridtrace (store schema {version}, this one reads "
                f"up to {SCHEMA_VERSION}); upgrade hybridtrace"
            )

    def exists(self) -> bool:
        return self.files.exists("_meta.json")

    def _files(self, table: str) -> list[str]:
        return [f for f in self.files.list_files(table) if _PART.match(f.rsplit("/", 1)[-1])]

    def _parts(self) -> set[str]:
        """Batches that have a ``sources`` file."""
        batches = set()
        for rel in self._files("sources"):
            match = _PART.match(rel.rsplit("/", 1)[-1])
            if match:
                batches.add(match.group("batch"))
        return batches

    def _compactions(self) -> dict[str, dict]:
        """Every compaction's record: its batch -> {"batches": superseded, "committed_at": t}."""
        records = {}
        for rel in self.files.list_files("sources", "supersedes-*.json"):
            batch = rel.rsplit("/", 1)[-1][len("supersedes-"):-len(".json")]
            value = json.loads(self.files.read_text(rel))
            records[batch] = value if isinstance(value, dict) else {"batches": value, "committed_at": 0.0}
        return records

    def committed_batches(self) -> set[str]:
        """Batches with a ``sources`` file, less those a committed compaction superseded."""
        batches = self._parts()
        return batches - self._superseded(batches, self._compactions())

    @staticmethod
    def _superseded(batches: set[str], compactions: dict[str, dict]) -> set[str]:
        """Batches merged into a compaction that committed (its ``sources`` file exists)."""
        gone: set[str] = set()
        for batch, record in compactions.items():
            if batch in batches:
                gone.update(record["batches"])
        return gone

    def committed_files(self, table: str, batches: set[str] | None = None) -> list[str]:
        """Paths (relative to the root) of the table's files in committed batches."""
        batches = self.committed_batches() if batches is None else batches
        out = []
        for rel in self._files(table):
            match = _PART.match(rel.rsplit("/", 1)[-1])
            if match and match.group("batch") in batches:
                out.append(rel)
        return out

    def recover(self) -> int:
        """Remove what interrupted batches and old compactions left; returns how many files went.

        Files of a batch that never committed go at once. Files a compaction superseded go
        only ``COMPACT_GRACE_S`` after it committed: a reader that listed them before the
        commit (``query``, ``analyze`` and ``report`` take no lock) can still open them.
        """
        if not self.exists():
            return 0
        parts, compactions = self._parts(), self._compactions()
        superseded_at: dict[str, float] = {}
        for batch, record in compactions.items():
            if batch in parts:
                for old in record["batches"]:
                    superseded_at[old] = min(superseded_at.get(old, float("inf")), record["committed_at"])
        committed = parts - set(superseded_at)
        if self._lease_check is not None:
            self._lease_check()  # a writer that lost its lease deletes nothing another may use
        removed = 0
        for tmp in self.files.leftovers():
            self.files.delete(tmp)
            removed += 1
        files: dict[str, list[str]] = {}
        for table in TABLES:
            for rel in self._files(table):
                match = _PART.match(rel.rsplit("/", 1)[-1])
                if match and match.group("batch") not in committed:
                    files.setdefault(match.group("batch"), []).append(rel)
        now = time.time()
        # the oldest supersessions first, and a batch's sources file last: a crash between
        # deletions never brings a superseded batch back
        kept: set[str] = set()  # superseded batches still within their grace period
        for batch in sorted(files, key=lambda b: superseded_at.get(b, -1.0)):
            if batch in superseded_at and now - superseded_at[batch] < COMPACT_GRACE_S:
                kept.add(batch)
                continue
            for rel in sorted(files[batch], key=lambda r: r.startswith("sources/")):
                self.files.delete(rel)
                removed += 1
        for batch, record in compactions.items():
            # a record goes when its compaction never committed, or none of the batches it
            # lists has a file left (so dropping it cannot bring one back)
            if batch not in parts or not set(record["batches"]) & kept:
                self.files.delete(f"sources/supersedes-{batch}.json")
                removed += 1
        return removed

    def compact(self, *, min_batches: int = COMPACT_MIN_BATCHES) -> int:
        """Merge the files of many small batches into one batch; returns how many were merged.

        A scheduled job commits a small batch every run, and each adds files to every
        table partition it touches and one ``sources`` file, which every reader lists and
        every run reads. Compaction rewrites the small batches' files as one new batch:
        its data files first (invisible until committed), then the list of batches it
        supersedes, then its ``sources`` file (the merged manifest rows) as the commit;
        readers then ignore the superseded batches, whose files ``recover`` deletes once
        no reader can still be using them. A crash at any step leaves the store readable
        with every row once.
        """
        committed = self.committed_batches()
        sizes: dict[str, int] = {}
        files: dict[str, list[tuple[str, str]]] = {}
        for table in TABLES:
            for rel, size in self.files.list_sized(table):
                match = _PART.match(rel.rsplit("/", 1)[-1])
                if match and match.group("batch") in committed:
                    batch = match.group("batch")
                    sizes[batch] = sizes.get(batch, 0) + size
                    files.setdefault(batch, []).append((table, rel))
        chosen, total = [], 0
        for batch in sorted(committed, key=lambda b: sizes.get(b, 0)):
            if sizes.get(batch, 0) > COMPACT_SMALL_BYTES or total + sizes.get(batch, 0) > COMPACT_MAX_BYTES:
                break
            chosen.append(batch)
            total += sizes.get(batch, 0)
        if len(chosen) < min_batches:
            return 0
        merged_id = new_batch_id()
        by_partition: dict[tuple[str, str], list[str]] = {}
        for batch in chosen:
            for table, rel in files.get(batch, []):
                if table != "sources":
                    by_partition.setdefault((table, rel.rsplit("/", 1)[0]), []).append(rel)
        for n, ((table, directory), rels) in enumerate(sorted(by_partition.items())):
            schema = table_schema(table)
            data = concat((self.files.read_table(rel) for rel in rels), schema)
            self.files.write_parquet(data, f"{directory}/part-{merged_id}-{n}.parquet")
        manifest = concat(
            (self.files.read_table(rel) for b in chosen for t, rel in files.get(b, []) if t == "sources"),
            table_schema("sources"),
        )
        record = {"batches": sorted(chosen), "committed_at": time.time()}
        self.files.write_text(f"sources/supersedes-{merged_id}.json", json.dumps(record))
        if self._lease_check is not None:
            self._lease_check()
        self.files.write_parquet(manifest, f"sources/part-{merged_id}.parquet")  # the commit
        # the superseded files stay for readers that listed them; recover() removes them
        # once the grace period has passed
        self.recover()
        return len(chosen)

    # --- writing ----------------------------------------------------------------------

    def write_batch(self, batch_id: str, tables: dict[str, pa.Table], sources: pa.Table) -> None:
        """Write a batch's data files, then commit it by writing its ``sources`` file."""
        for name, data in tables.items():
            if data.num_rows:
                self._write_table(batch_id, table_schema(name), data)
        schema = table_schema("sources")
        if self._lease_check is not None:
            self._lease_check()  # a bucket writer commits only while it still holds the lease
        self.files.write_parquet(schema.conform(sources), f"sources/part-{batch_id}.parquet")

    def _partitions(self, schema: TableSchema, data: pa.Table) -> list[tuple[str, pa.Table]]:
        """(directory relative to the root, rows) per partition of ``data``."""
        if not schema.partition:
            return [(schema.name, data)]
        combos = data.group_by(list(schema.partition), use_threads=False).aggregate([]).to_pylist()
        out = []
        for combo in combos:
            directory = schema.name
            mask = None
            for column in schema.partition:
                value = combo[column]
                directory = f"{directory}/{column}={_partition_dir(value)}"
                if len(combos) > 1:
                    test = pc.is_null(data[column]) if value is None else pc.equal(data[column], value)
                    mask = test if mask is None else pc.and_(mask, test)
            out.append((directory, data if mask is None else data.filter(mask)))
        return out

    def _write_table(self, batch_id: str, schema: TableSchema, data: pa.Table) -> None:
        data = schema.conform(data)
        for n, (directory, part) in enumerate(self._partitions(schema, data)):
            self.files.write_parquet(part, f"{directory}/part-{batch_id}-{n}.parquet")

    # --- reading ----------------------------------------------------------------------

    def connect(self, *, with_queries: bool = True) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with one view per table (committed data only)."""
        import duckdb  # here: ingest reads the store without DuckDB when nothing changed

        self.check_version()
        con = duckdb.connect(":memory:")
        batches = self.committed_batches()
        without_files = []
        for name in TABLES:
            schema = table_schema(name)
            files = self.committed_files(name, batches)
            if not files:
                without_files.append(name)
            if files:
                source = self.files.scan(con, name, files, schema.arrow_schema())
                if isinstance(self.files, LocalRoot):
                    columns = _select_list(schema, self.files, files)
                else:  # the dataset's schema already gives a missing column as null
                    columns = _all_columns(schema)
                con.execute(f"CREATE VIEW {_raw_view(schema.view)} AS SELECT {columns} FROM {source}")
            else:
                con.execute(f"CREATE VIEW {_raw_view(schema.view)} AS {schema.empty_select()}")
        _check_files_kept(con, self, without_files)
        _one_record_per_request(con)
        _cut_records_read_whole(con)
        _engines_named_later(con)
        from hybridtrace.attach import engine_models

        con.register("_engine_models_table", engine_models(con))
        con.execute("CREATE VIEW engine_models AS SELECT * FROM _engine_models_table")
        if with_queries:
            from hybridtrace.analyze.thresholds import install as install_thresholds
            from hybridtrace.queries_loader import install_views

            install_thresholds(con)
            install_views(con)
        return con

    def existing_keys(self, table: str, data: pa.Table) -> pa.Table | None:
        """Key columns the store already holds that could collide with ``data``'s keys.

        Only files in ``data``'s partitions are read, and only rows within its range of
        the key's time (or line) column, so the cost follows the batch, not the store.
        """
        schema = table_schema(table)
        directories = {d + "/" for d, _ in self._partitions(schema, data)}
        files = [f for f in self.committed_files(table) if any(f.startswith(d) for d in directories)]
        if not files or not schema.key:
            return None
        where = ""
        ranged = next((c for c in ("ts", "end_ts", "line_number") if c in schema.key), None)
        if ranged is not None:
            low, high = pc.min(data[ranged]).as_py(), pc.max(data[ranged]).as_py()
            if low is not None:
                where = f" WHERE {ranged} BETWEEN {low!r} AND {high!r}"
                if pc.any(pc.is_null(data[ranged])).as_py():
                    where += f" OR {ranged} IS NULL"
        import duckdb

        con = duckdb.connect(":memory:")
        try:
            source = self.files.scan(con, table, files, schema.arrow_schema())
            try:
                return con.sql(f"SELECT {', '.join(schema.key)} FROM {source}{where}").to_arrow_table()
            except duckdb.BinderException:
                # files written before a key column existed (engines.rank): it reads as null
                present = {row[0] for row in con.sql(f"DESCRIBE SELECT * FROM {source}").fetchall()}
                types = {c.name: c.duckdb_type for c in schema.columns}
                keys = [k if k in present else f"CAST(NULL AS {types[k]}) AS {k}" for k in schema.key]
                return con.sql(f"SELECT {', '.join(keys)} FROM {source}{where}").to_arrow_table()
        finally:
            con.close()

    def sources_frame(self) -> pa.Table:
        files = self.committed_files("sources")
        schema = table_schema("sources")
        if not files:
            return schema.arrow_schema().empty_table()
        return pa.concat_tables([schema.conform(self.files.read_table(f)) for f in files])


def _all_columns(schema: TableSchema) -> str:
    return ", ".join(column.name for column in schema.columns)


def _select_list(schema: TableSchema, root: LocalRoot, files: list[str]) -> str:
    """Columns of ``schema``; one that older files lack reads as NULL, so old stores open."""
    present: set[str] = set()
    for rel in files:
        present.update(root.parquet_schema(rel).names)
    parts = []
    for column in schema.columns:
        if column.name in present:
            parts.append(column.name)
        else:
            parts.append(f"CAST(NULL AS {column.duckdb_type}) AS {column.name}")
    return ", ".join(parts)


# Views that hold every record as read, under another name: the table's own name is a
# view that keeps one record per entity (see _one_record_per_request).
_RAW_VIEWS = {
    "requests": "request_records",
    "engines": "_engines_as_read",
    "log_events": "_log_events_as_read",
    "_intervals_log": "_intervals_log_as_read",
    "rejects": "_rejects_as_read",
}


def _raw_view(view: str) -> str:
    return _RAW_VIEWS.get(view, view)


def _check_files_kept(con: duckdb.DuckDBPyConnection, store: Store, tables: list[str]) -> None:
    """Refuse a store whose manifest counts rows of a table that has no file left.

    A folder deleted by hand would otherwise read as a table with no rows, and every
    analysis would report "nothing matched" where there was data.
    """
    tables = [t for t in tables if t != "sources"]
    if not tables:
        return
    sums = ", ".join(f"sum(TRY_CAST(json_extract_string(rows, '$.{t}') AS BIGINT))" for t in tables)
    listed = con.sql(f"SELECT {sums} FROM sources WHERE status IS DISTINCT FROM 'error'").fetchall()[0]
    lost = [(t, n) for t, n in zip(tables, listed, strict=True) if n]
    if lost:
        what = ", ".join(f"{n:,} rows of {t}" for t, n in lost)
        tables_left = "that table" if len(lost) == 1 else "those tables"
        raise StoreDamagedError(
            f"{store}: the manifest lists {what}, but no file of {tables_left} is left; the store was"
            " changed by hand. Ingest again into a new store"
        )


def _engines_named_later(con: duckdb.DuckDBPyConnection) -> None:
    """``engines``, ``log_events`` and the log intervals, under the engine a later read named.

    A log read before its `Initializing NIXL worker` line files what it found under its
    folder's name; once a read of the same instance folder finds the engine's id (and
    finds only one), those rows are that engine's too, not a second engine's. Checking
    first keeps the common case a plain view.
    """
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _engine_renames AS
        WITH reads AS (
            SELECT source_id, engine_id,
                   regexp_extract(uri, '^(.*)/[^/]+$', 1) AS instance,
                   regexp_extract(uri, '([^/]+)/[^/]+$', 1) AS folder
            FROM sources
            WHERE format = 'vllm_log' AND engine_id IS NOT NULL
        ),
        named AS (
            SELECT instance, any_value(engine_id) AS engine_id FROM reads
            WHERE engine_id <> folder
            GROUP BY instance HAVING count(DISTINCT engine_id) = 1
        )
        SELECT r.source_id, r.engine_id AS fallback, n.engine_id
        FROM reads r JOIN named n USING (instance)
        WHERE r.engine_id = r.folder
        """
    )
    renamed = con.sql("SELECT count(*) FROM _engine_renames").fetchall()[0][0]
    for view in ("engines", "log_events", "_intervals_log"):
        stored = _raw_view(view)
        if renamed:
            con.execute(
                f"CREATE VIEW {view} AS SELECT t.* REPLACE (coalesce(n.engine_id, t.engine_id) AS engine_id) "
                f"FROM {stored} t LEFT JOIN _engine_renames n "
                "ON n.source_id = t.source_id AND n.fallback = t.engine_id"
            )
        else:
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM {stored}")


def _cut_records_read_whole(con: duckdb.DuckDBPyConnection) -> None:
    """``rejects``, less the cut last records a later read of their object took whole.

    A trace whose last record had no newline and could no longer grow rejected that record
    (CUT_RECORD) and stopped before it; if the object grew after all, a later read went on
    from that line and got past it. The reject is then superseded, not a second count of
    the line. Checking first keeps the common case a plain view.
    """
    cut = con.execute("SELECT count(*) FROM _rejects_as_read WHERE reason = ?", [CUT_RECORD]).fetchall()[0][0]
    if not cut:
        con.execute("CREATE VIEW rejects AS SELECT * FROM _rejects_as_read")
        return
    reason = CUT_RECORD.replace("'", "''")
    con.execute(
        f"""
        CREATE VIEW rejects AS SELECT r.* FROM _rejects_as_read r
        WHERE r.reason <> '{reason}' OR NOT EXISTS (
            SELECT 1 FROM sources s
            WHERE s.uri = r.uri AND s.end_line >= r.line_number AND s.ingested_at > r.ingested_at
        )
        """
    )


def _one_record_per_request(con: duckdb.DuckDBPyConnection) -> None:
    """``requests``: one row per request, the latest record when a connector wrote several.

    The trace writes a request once; one written twice, at two times, is two rows by the
    store's key, and every view joining a read to its request would count the read twice.
    The latest record stands (its status is the final one); ``request_records`` keeps all.
    Checking first keeps the common case (no repeats) a plain view.
    """
    repeated = con.sql(
        "SELECT count(*) FROM (SELECT 1 FROM request_records "
        "GROUP BY engine_id, request_id HAVING count(*) > 1)"
    ).fetchall()[0][0]
    latest = " QUALIFY row_number() OVER (PARTITION BY engine_id, request_id ORDER BY ts DESC) = 1"
    con.execute(f"CREATE VIEW requests AS SELECT * FROM request_records{latest if repeated else ''}")


def dedupe(store: Store, table: str, data: pa.Table) -> tuple[pa.Table, int]:
    """Drop rows of ``data`` whose key the store (or an earlier row of ``data``) already holds.

    Duplicates are the same record read twice, so which copy stays does not matter; NULL
    keys compare equal.
    """
    import polars as pl

    schema = table_schema(table)
    if not schema.key or data.num_rows == 0:
        return data, 0
    key = list(schema.key)
    frame = pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    # A cheap hash first: most batches have no duplicate at all.
    if frame.select(pl.struct(key).hash(seed=7).is_duplicated().any()).item():
        frame = frame.unique(subset=key, keep="first", maintain_order=True)
    existing = store.existing_keys(table, data)
    if existing is not None and existing.num_rows:
        old = pl.from_arrow(existing)
        assert isinstance(old, pl.DataFrame)
        frame = frame.join(old.unique(), on=key, how="anti", nulls_equal=True)
    kept = frame.to_arrow().cast(data.schema) if frame.height != data.num_rows else data
    return kept, data.num_rows - kept.num_rows


def concat(tables: Iterable[pa.Table], schema: TableSchema) -> pa.Table:
    parts = [schema.conform(t) for t in tables if t is not None and t.num_rows]
    if not parts:
        return schema.arrow_schema().empty_table()
    return pa.concat_tables(parts)
