"""The raw views over a store's part files: the plain scan where the files share one schema,
``union_by_name`` where they do not, the same rows either way."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from hybridtrace.schema import TABLES, table_schema
from hybridtrace.store import Store
from hybridtrace.store.raw_views import _raw_view, raw_connection


def _view_sql(con: duckdb.DuckDBPyConnection, view: str) -> str:
    return con.execute("SELECT sql FROM duckdb_views() WHERE view_name = ?", [view]).fetchall()[0][0]


def _rows_by_name(con: duckdb.DuckDBPyConnection, store: Store, name: str) -> list[tuple]:
    """The table's rows as ``union_by_name`` reads them from its committed files, sorted."""
    files = [store.files.full(rel) for rel in store.committed_files(name)]
    columns = ", ".join(c.name for c in table_schema(name).columns)
    scan = f"read_parquet({files!r}, union_by_name = true, hive_partitioning = false)"
    return sorted(con.sql(f"SELECT {columns} FROM {scan}").fetchall(), key=repr)


def test_files_of_one_schema_are_read_without_union_by_name_and_give_the_same_rows(demo_store):
    store = Store(demo_store)
    con = raw_connection(store)
    several = 0
    for name in TABLES:
        if not store.committed_files(name):
            continue
        view = _raw_view(table_schema(name).view)
        several += len(store.committed_files(name)) > 1
        assert "union_by_name" not in _view_sql(con, view), view
        read = sorted(con.sql(f"SELECT * FROM {view}").fetchall(), key=repr)
        assert read == _rows_by_name(con, store, name), view
    assert several  # the demo's store has tables of more than one file


def test_a_file_lacking_a_column_is_read_by_name_the_column_null(demo_store, tmp_path):
    copy = Path(shutil.copytree(demo_store, tmp_path / "store"))
    store = Store(copy)
    name = next(n for n in TABLES if len(store.committed_files(n)) > 1)
    schema = table_schema(name)
    dropped = next(c.name for c in schema.columns if c.name not in schema.key)
    older = copy / store.committed_files(name)[0]
    table = pq.read_table(older)
    pq.write_table(table.drop_columns([dropped]), older)  # as a version before the column wrote it
    con = raw_connection(store)
    view = _raw_view(schema.view)
    assert "union_by_name = true" in _view_sql(con, view)
    nulls = con.sql(f"SELECT count(*) FROM {view} WHERE {dropped} IS NULL").fetchall()[0][0]
    assert nulls >= table.num_rows > 0
    read = sorted(con.sql(f"SELECT * FROM {view}").fetchall(), key=repr)
    assert read == _rows_by_name(con, store, name)
