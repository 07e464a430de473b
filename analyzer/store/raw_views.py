"""The store's raw views: one DuckDB view per table over its committed files, nothing more.

``raw_connection`` opens an in-memory DuckDB connection on a store and creates, for each
table of ``schemas/``, a view over the files of committed batches only (a column older
files lack reads as NULL). A few tables get a view that keeps one record per entity,
their records as read staying under another name (``request_records``, ``_rejects_as_read``,
...). Beside them come two store-level helpers the rest builds on: ``_instance_folders``
(which engine an instance folder is, ``instances.py``) and ``_engine_newest`` (an engine's
newest settings, ``engine_settings.py``). Sizing engines, thresholds and the SQL of
``queries/`` come on top, in ``analysis.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hybridtrace.errors import StoreDamagedError
from hybridtrace.schema import TABLES, TableSchema, table_schema
from hybridtrace.store.engine_settings import install_engine_newest
from hybridtrace.store.instances import LOG_READS_SQL, install_instance_folders
from hybridtrace.store.roots import LocalRoot

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from hybridtrace.store.commit import Store

# The reason of a reject for a trace's last record cut short in an object that could no
# longer grow. Should it grow after all, a later read takes the whole line: that read's
# `sources` row reaches past the line, and the `rejects` view drops this reject from then on.
CUT_RECORD = "not valid JSON: last record cut short (no newline after it)"


def raw_connection(
    store: Store,
    files_of: Mapping[str, list[str]] | None = None,
    *,
    con: duckdb.DuckDBPyConnection | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per table (committed data only).

    ``files_of`` gives, for every table, the committed files to read instead of listing the
    store: a part of it (a Spark executor's partition, ``hybridtrace.spark.analysis``),
    listed and checked whole by whoever cut it, so it is not checked against the manifest.
    ``con`` is a connection to make the views in instead (``catalog.py``'s own file).
    """
    import duckdb  # here: ingest reads the store without DuckDB when nothing changed

    store.check_version()
    if con is None:
        con = duckdb.connect(":memory:")
    # every part file is written once under a name of its own and never changed: the footers
    # an analysis reads again and again (each scan, each view bound) can be kept
    con.execute("SET parquet_metadata_cache = true")
    batches = store.committed_batches() if files_of is None else set()
    without_files = []
    record_files: list[str] = []
    for name in TABLES:
        schema = table_schema(name)
        files = store.committed_files(name, batches) if files_of is None else list(files_of.get(name, ()))
        if name == "requests":  # its raw view is request_records
            record_files = files
        if not files:
            without_files.append(name)
        if files:
            if isinstance(store.files, LocalRoot):
                footers = [store.files.parquet_schema(rel) for rel in files]
                columns = _select_list(schema, footers)
                if _one_schema(footers):
                    source = _plain_scan(store.files, files)
                else:
                    source = store.files.scan(con, name, files, schema.arrow_schema())
            else:  # the dataset's schema already gives a missing column as null
                source = store.files.scan(con, name, files, schema.arrow_schema())
                columns = _all_columns(schema)
            con.execute(f"CREATE VIEW {_raw_view(schema.view)} AS SELECT {columns} FROM {source}")
        else:
            con.execute(f"CREATE VIEW {_raw_view(schema.view)} AS {schema.empty_select()}")
    if files_of is None:
        _check_files_kept(con, store, without_files)
    # a part of a store (files_of) is counted, not looked up: it is not the store's state
    _one_record_per_request(con, (store.location, record_files) if files_of is None else None)
    _cut_records_read_whole(con)
    install_instance_folders(con)
    _engines_named_later(con)
    install_engine_newest(con)
    return con


def _all_columns(schema: TableSchema) -> str:
    return ", ".join(column.name for column in schema.columns)


def _one_schema(footers: list[pa.Schema]) -> bool:
    """Whether every file has the schema of the first (names, order and types)."""
    return all(footer.equals(footers[0], check_metadata=False) for footer in footers[1:])


def _plain_scan(root: LocalRoot, files: list[str]) -> str:
    """The FROM clause over local ``files`` of one schema: ``LocalRoot.scan`` less ``union_by_name``.

    ``union_by_name`` matches columns by name across files whose columns differ (a store
    older files of which lack a column), but it makes DuckDB open and read the schema of
    every file each time a view over the table is bound, and every view of ``queries/`` binds
    the raw views it reads again: on a store of a million requests, half the time of
    installing them. Where every file has one schema (what one version of hybridtrace
    writes), the first file's columns are every file's, so the plain scan reads the same rows.
    """
    listing = ", ".join("'" + root.full(rel).replace("'", "''") + "'" for rel in files)
    return f"read_parquet([{listing}], hive_partitioning = false)"


def _select_list(schema: TableSchema, footers: list[pa.Schema]) -> str:
    """Columns of ``schema``; one that older files lack reads as NULL, so old stores open."""
    present: set[str] = set()
    for footer in footers:
        present.update(footer.names)
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
    listed = con.execute(f"SELECT {sums} FROM sources WHERE status IS DISTINCT FROM 'error'").fetchall()[0]
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
    finds only one), those rows are that engine's too, not a second engine's. Which engine
    a folder is comes from ``instances.py``. Checking first keeps the common case a plain view.
    """
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _engine_renames AS
        SELECT r.source_id, r.engine_id AS fallback, f.engine_id
        FROM ({LOG_READS_SQL}) r JOIN _instance_folders f USING (instance)
        WHERE r.engine_id = r.folder AND f.engines_named = 1
        """
    )
    renamed = con.execute("SELECT count(*) FROM _engine_renames").fetchall()[0][0]
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


# Grouping on one 64-bit hash of the key is cheaper than on the two strings (a third of the
# time on a million requests). Equal keys hash equal, so no repeat is missed; only a hash
# collision counts one that is not there, so a count above zero is confirmed on the key itself.
_REPEATED_SQL = "SELECT count(*) - count(DISTINCT hash(engine_id, request_id)) FROM request_records"
_REPEATED_CONFIRM_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM request_records GROUP BY engine_id, request_id HAVING count(*) > 1)"
)


# What keeps the latest record of each request (``requests``, when some are repeated).
LATEST_RECORD = " QUALIFY row_number() OVER (PARTITION BY engine_id, request_id ORDER BY ts DESC) = 1"


def _repeated_records(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """How many (engine, request) keys ``request_records`` holds more than once, as a table of one row."""
    import pyarrow as pa

    repeated = con.execute(_REPEATED_SQL).fetchall()[0][0]
    if repeated:
        repeated = con.execute(_REPEATED_CONFIRM_SQL).fetchall()[0][0]
    return pa.table({"repeated": pa.array([repeated], pa.int64())})


def _one_record_per_request(con: duckdb.DuckDBPyConnection, state: tuple[str, list[str]] | None) -> None:
    """``requests``: one row per request, the latest record when a connector wrote several.

    The trace writes a request once; one written twice, at two times, is two rows by the
    store's key, and every view joining a read to its request would count the read twice.
    The latest record stands (its status is the final one); ``request_records`` keeps all.
    Checking first keeps the common case (no repeats) a plain view.

    ``state`` is the store's location and its committed files of request records; with it the
    count is kept for the next connection on the same files.
    """
    if state is None:
        repeated = _repeated_records(con).column(0)[0].as_py()
    else:
        from hybridtrace.store.catalog import derived_table

        # Counting costs most of opening a large store (a tenth of a second on a million
        # requests), and its answer is fixed for the files read (written once, under names of
        # their own): kept beside the link fits, so that commands run one after another on a
        # store count once. The files are named in the key: a bucket's views do not name them.
        location, files = state
        code = "\n".join([_REPEATED_SQL, _REPEATED_CONFIRM_SQL, str(location), *files])
        found = derived_table("repeats", con, code, lambda: _repeated_records(con), of_views=False)
        repeated = found.column(0)[0].as_py()
    con.execute(f"CREATE VIEW requests AS SELECT * FROM request_records{LATEST_RECORD if repeated else ''}")
