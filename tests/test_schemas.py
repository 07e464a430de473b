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
