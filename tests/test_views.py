"""The SQL library of queries/: includes decide the install order, and every public view's
columns are documented, one line each, as DESCRIBE gives them (docs/views.md is generated)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from hybridtrace.analyze.thresholds import install as install_thresholds
from hybridtrace.queries_loader import (
    QueryModuleError,
    install_order,
    install_views,
    parse_module,
    sql_modules,
)
from hybridtrace.store import Store
from hybridtrace.view_docs import ViewDocError, markdown, parse_view_docs, public, view_docs

DOCS = Path(__file__).resolve().parent.parent / "docs" / "views.md"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Store:
    store = Store(tmp_path_factory.mktemp("views") / "s")
    store.init()
    return store


@pytest.fixture(scope="module")
def con(empty_store) -> duckdb.DuckDBPyConnection:
    return empty_store.connect()


def bare(store: Store) -> duckdb.DuckDBPyConnection:
    """The store's tables and thresholds, no module installed."""
    con = store.connect(with_queries=False)
    install_thresholds(con)
    return con


@pytest.mark.parametrize("name", [m.name for m in sql_modules()])
def test_every_module_installs_with_only_what_it_includes(empty_store, name):
    # DuckDB binds a view when it is created: a view or macro used but not included fails here
    con = bare(empty_store)
    install_views(con, only=[name])
    created = views_of(con)
    module = next(m for m in sql_modules() if m.name == name)
    assert {d.name for d in parse_view_docs(module)} <= created


def test_modules_come_after_what_they_include():
    order = [m.name for m in install_order(sql_modules())]
    assert sorted(order) == sorted(m.name for m in sql_modules())
    for position, module in enumerate(install_order(sql_modules())):
        assert set(module.includes) <= set(order[:position]), module.name


def test_a_missing_include_or_a_cycle_is_refused_before_anything_is_installed():
    a = parse_module("a", "-- a: one\n-- include: b\nCREATE OR REPLACE VIEW a AS SELECT * FROM b;\n")
    b = parse_module("b", "-- b: two\n-- include: c\nCREATE OR REPLACE VIEW b AS SELECT * FROM c;\n")
    c = parse_module("c", "-- c: three\n-- include: a\nCREATE OR REPLACE VIEW c AS SELECT 1 AS x;\n")
    with pytest.raises(QueryModuleError, match="include each other: a → b → c → a"):
        install_order([a, b, c])
    with pytest.raises(QueryModuleError, match=r"queries/b.sql includes c, which no file of queries/ holds"):
        install_order([a, b])
    con = duckdb.connect()
    with pytest.raises(QueryModuleError):
        install_views(con, [a, b, c])
    assert con.sql("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall() == [(0,)]


def test_a_module_must_declare_its_includes():
    with pytest.raises(QueryModuleError, match="no `-- include:` line"):
        parse_module("x", "-- x: no header\nCREATE OR REPLACE VIEW x AS SELECT 1 AS y;\n")
    with pytest.raises(QueryModuleError, match="includes itself"):
        parse_module("x", "-- x\n-- include: x\n")
    # the line counts in the opening comment only, not in a later one
    with pytest.raises(QueryModuleError, match="no `-- include:` line"):
        parse_module("x", "CREATE OR REPLACE VIEW x AS SELECT 1 AS y;\n-- include: _macros\n")
    assert parse_module("x", "-- x: reads tables only\n-- include:\n").includes == ()


def test_a_view_using_a_module_it_does_not_include_names_its_module():
    a = parse_module("a", "-- a: one\n-- include:\nCREATE OR REPLACE VIEW a AS SELECT 1 AS x;\n")
    b = parse_module("b", "-- b: two\n-- include:\nCREATE OR REPLACE VIEW b AS SELECT * FROM a;\n")
    why = r"queries/b.sql: .* a .*\(a is in queries/a.sql: add a to the `-- include:` line\)"
    with pytest.raises(QueryModuleError, match=why):
        install_views(duckdb.connect(), [a, b], only=["b"])
    install_views(duckdb.connect(), [a, b])  # all of them: a comes first by name, and b binds


def views_of(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def test_every_public_view_documents_its_columns_as_describe_gives_them(con, empty_store):
    documented = {d.name: d for d in view_docs()}
    for doc in documented.values():
        described = [row[0] for row in con.sql(f"DESCRIBE {doc.name}").fetchall()]
        listed = [name for name, _ in doc.columns]
        missing = [c for c in described if c not in listed]
        extra = [c for c in listed if c not in described]
        assert not missing and not extra, f"{doc.name}: undocumented {missing}, not in the view {extra}"
        assert listed == described, f"{doc.name}: documented in another order than the view's"
        assert all(text for _, text in doc.columns), doc.name
    # every public view the modules create is documented (the store's own views, over its
    # tables, are in tables.md)
    created = views_of(con) - views_of(empty_store.connect(with_queries=False))
    assert {v for v in created if public(v)} - set(documented) == set()
    assert set(documented) <= created


def test_docs_are_generated_from_the_view_comments():
    assert DOCS.read_text() == markdown(), "regenerate: python -m hybridtrace.view_docs > docs/views.md"


def test_a_malformed_doc_block_is_refused():
    def module(text: str):
        return parse_module("m", "-- m: a module\n-- include:\n\n" + text)

    with pytest.raises(ViewDocError, match="no `-- v: …` comment"):
        parse_view_docs(module("CREATE OR REPLACE VIEW v AS SELECT 1 AS x;\n"))
    with pytest.raises(ViewDocError, match="no `-- @column"):
        parse_view_docs(module("-- v: a view\nCREATE OR REPLACE VIEW v AS SELECT 1 AS x;\n"))
    with pytest.raises(ViewDocError, match="documented twice"):
        parse_view_docs(module("-- v: a view\n-- @column x  one\n-- @column x  two\n"
                               "CREATE OR REPLACE VIEW v AS SELECT 1 AS x;\n"))  # fmt: skip
    with pytest.raises(ViewDocError, match="finding view lists no @column"):
        parse_view_docs(module("-- finding_v: a rule\n-- @column x  one\n"
                               "CREATE OR REPLACE VIEW finding_v AS SELECT 1 AS x;\n"))  # fmt: skip
    (doc,) = parse_view_docs(module("-- v: a view\n--\n-- @column x  one\n--           and more\n"
                                    "CREATE OR REPLACE VIEW v AS SELECT 1 AS x;\n"))  # fmt: skip
    assert doc.columns == (("x", "one and more"),)
    # private views and private modules need no block
    assert parse_view_docs(module("CREATE OR REPLACE VIEW _v AS SELECT 1 AS x;\n")) == []


def test_a_module_text_parsed_before_installs_alike_and_an_edited_one_is_parsed_anew(empty_store):
    first = parse_module("a", "-- a: one\n-- include:\nCREATE OR REPLACE VIEW a AS SELECT 1 AS x;\n")
    edited = parse_module("a", "-- a: one\n-- include:\nCREATE OR REPLACE VIEW a AS SELECT 2 AS x;\n")
    for module, value in [(first, 1), (first, 1), (edited, 2), (first, 1)]:
        con = duckdb.connect()
        install_views(con, [module])
        assert con.sql("SELECT x FROM a").fetchall() == [(value,)]
    # the packaged modules, installed twice in one process, define the same views
    texts = []
    for _ in range(2):
        con = bare(empty_store)
        install_views(con)
        texts.append(con.sql("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal "
                             "AND view_name <> '_engine_models_table' ORDER BY 1").fetchall())  # fmt: skip
    assert texts[0] == texts[1]
    assert len(texts[0]) > 50


def test_no_view_excludes_columns_by_a_list_duckdb_prints_in_no_fixed_order(con):
    """A view's text keys the tables connections keep (store/catalog.py); DuckDB prints a
    `* EXCLUDE (...)` list in no fixed order, so a view holding one would be computed again by
    connections that print it otherwise. Macros are not part of that key."""
    found = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND sql ILIKE '%EXCLUDE (%' ORDER BY 1"
    ).fetchall()
    assert found == []
