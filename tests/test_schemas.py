"""The schema files are the one source of truth: writers, views and docs agree with them."""

from pathlib import Path

from hybridtrace.schema import TABLES, markdown, table_schema
from hybridtrace.store import Store

DOCS = Path(__file__).resolve().parent.parent / "docs" / "tables.md"


def test_every_contract_table_has_a_schema_with_documented_columns():
    for name in ("transfers", "requests", "engines", "intervals", "log_events", "rejects", "sources"):
        assert name in TABLES
        schema = table_schema(name)
        assert schema.columns and all(c.doc for c in schema.columns)
        assert set(schema.key) <= set(schema.column_names)


def test_docs_are_generated_from_schemas():
    assert DOCS.read_text() == markdown(), "regenerate docs/tables.md from hybridtrace.schema.markdown()"


def test_empty_store_has_every_view_with_schema_columns(tmp_path):
    store = Store(tmp_path / "s")
    store.init()
    con = store.connect()
    for name in TABLES:
        relation = con.sql(f"SELECT * FROM {name}")
        assert relation.columns == table_schema(name).column_names
        assert relation.fetchall() == []


def test_store_written_before_a_column_existed_still_opens(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = Store(tmp_path / "s")
    store.init()
    batch = "0" * 32
    # an older writer: transfers without the `link` and `groups` columns
    old = table_schema("transfers").arrow_schema()
    old = pa.schema([f for f in old if f.name not in ("link", "groups")])
    row = {f.name: None for f in old}
    row.update(request_id="r1", engine_id="d0", rank=0, transported_bytes=10)
    (tmp_path / "s" / "transfers").mkdir()
    pq.write_table(
        pa.Table.from_pylist([row], schema=old), tmp_path / "s" / "transfers" / f"part-{batch}.parquet"
    )
    empty_sources = table_schema("sources").arrow_schema().empty_table()
    store.write_batch(batch, {}, empty_sources)
    got = store.connect().sql("SELECT request_id, transported_bytes, link, groups FROM transfers").fetchall()
    assert got == [("r1", 10, None, None)]


def test_store_from_a_newer_version_is_refused(tmp_path):
    import json

    import pytest

    from hybridtrace.errors import UsageError

    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "_meta.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(UsageError, match="newer hybridtrace"):
        Store(tmp_path / "s").connect()
