"""Diff tests of the views: every folder tests/cases/<view>/<case>/ is one test.

A case holds its inputs, a ``query.sql`` and the rows it must give (``expected.json``, a
list of objects, in the query's order); tests/cases/README.md describes the layout. Inputs
are either files ingested as they are (``inputs/``: a connector trace, logs, scrapes) or
small tables (``tables/<table>.csv``) that stand in for a store table or view. A query may
read ``analysis``: the findings ``analyze()`` gives for the case, sorted as it sorts them.

Cases whose query reads ``analysis`` alone, whose inputs are ingested with the same
options and whose case.toml gives the same ``share`` label (or none) share one store and
one analysis per session (a store and an analysis cost about a second each): each case
sees the findings on the engines its own files name, and no two of them may name one
engine (a fault and its clean twin name the same ones: the twins carry a label of their own).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from hybridtrace.analyze import analyze
from hybridtrace.analyze.rules import KINDS_BY_NAME
from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

CASES_ROOT = Path(__file__).resolve().parent / "cases"
CASES = sorted(p.parent for p in CASES_ROOT.glob("*/*/query.sql"))


def case_id(case: Path) -> str:
    return f"{case.parent.name}/{case.name}"


def load_tables(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """Each ``<table>.csv`` replaces the view ``<table>`` with its rows, typed as the view is;
    a column the file leaves out is null."""
    for path in sorted(folder.glob("*.csv")):
        name = path.stem
        types = con.sql(f"DESCRIBE {name}").fetchall()
        csv = con.sql("SELECT * FROM read_csv(?, header = true, all_varchar = true)", params=[str(path)])
        given = set(csv.columns)
        unknown = given - {column for column, *_ in types}
        assert not unknown, f"{path}: {name} has no columns {sorted(unknown)}"
        columns = ", ".join(
            f"CAST({column if column in given else 'NULL'} AS {kind}) AS {column}"
            for column, kind, *_ in types
        )
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _case_{name} AS SELECT {columns} "
            f"FROM read_csv('{path}', header = true, all_varchar = true)"
        )
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _case_{name}")


def open_case(case: Path, tmp_path: Path) -> duckdb.DuckDBPyConnection:
    options = _options(case)
    store = tmp_path / "store"
    if (case / "inputs").is_dir():
        ingest([case / "inputs"], store, **options.get("ingest", {}))
    else:
        Store(store).init()
    con = Store(store).connect()
    if (case / "tables").is_dir():
        load_tables(con, case / "tables")
    return con


_TARGETS = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)", re.I)


def _options(case: Path) -> dict:
    return tomllib.loads((case / "case.toml").read_text()) if (case / "case.toml").exists() else {}


def shares_a_store(case: Path) -> bool:
    sql = re.sub(r"--[^\n]*", "", (case / "query.sql").read_text())
    return (case / "inputs").is_dir() and not (case / "tables").exists() and set(_TARGETS.findall(sql)) == {
        "analysis"
    }


class SharedStores:
    """The findings of every store-sharing case, each case's on its own engines; a group's
    store is ingested and analysed when the first of its cases asks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.groups: dict[str, list[Path]] = {}
        for case in CASES:
            if shares_a_store(case):
                self.groups.setdefault(json.dumps(_options(case), sort_keys=True), []).append(case)
        self.found: dict[Path, pa.Table] = {}

    def __contains__(self, case: Path) -> bool:
        return shares_a_store(case)

    def __getitem__(self, case: Path) -> pa.Table:
        if case not in self.found:
            self._build(json.dumps(_options(case), sort_keys=True))
        return self.found[case]

    def _build(self, options: str) -> None:
        cases = self.groups[options]
        store = self.root / f"store-{len(self.found)}"
        ingest([case / "inputs" for case in cases], store, **json.loads(options).get("ingest", {}))
        con = Store(store).connect()
        table = analyze(con).table
        owners: dict[str, Path] = {}
        for case in cases:
            pattern = f"%/{case.parent.name}/{case.name}/inputs/%"
            engines = {row[0] for row in con.execute(_CASE_ENGINES, [pattern]).fetchall()}
            clash = {e: case_id(owners[e]) for e in engines if e in owners}
            assert not clash, f"{case_id(case)} names engines of other cases: {clash}"
            owners.update(dict.fromkeys(engines, case))
            names = pa.array(sorted(engines), pa.string())
            mine = pc.or_kleene(pc.is_in(table["engine_id"], names),
                                pc.is_in(table["remote_engine_id"], names))  # fmt: skip
            self.found[case] = table.filter(pc.fill_null(mine, False))


@pytest.fixture(scope="session")
def shared_findings(tmp_path_factory) -> SharedStores:
    return SharedStores(tmp_path_factory.mktemp("cases"))


# the engines a case's own files name, by the sources they were read from
_CASE_ENGINES = """
SELECT DISTINCT named.engine FROM (
    SELECT engine_id AS engine, source_id FROM transfers
    UNION ALL SELECT remote_engine_id, source_id FROM transfers
    UNION ALL SELECT engine_id, source_id FROM requests
    UNION ALL SELECT remote_engine_id, source_id FROM requests
    UNION ALL SELECT engine_id, source_id FROM engines
    UNION ALL SELECT engine_id, source_id FROM log_events
) named JOIN sources s USING (source_id)
WHERE named.engine IS NOT NULL AND replace(s.uri, '\\', '/') LIKE ?
"""


def rows_of(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    relation = con.sql(sql)
    json_columns = {name for name, kind in zip(relation.columns, relation.types, strict=True)
                    if str(kind) == "JSON" or name == "evidence"}  # fmt: skip
    rows = [dict(zip(relation.columns, row, strict=True)) for row in relation.fetchall()]
    for row in rows:
        for name in json_columns:
            if isinstance(row[name], str):
                row[name] = json.loads(row[name])
    return rows


def same(got, want) -> bool:
    """Equal, floats up to 1e-12 relative (seconds and GB/s are computed, bytes are exact)."""
    def number(x) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool)

    if number(want) and number(got):  # 4096 and 4096.0 are one number; JSON does not tell them apart
        return math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15)
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(same(got[k], want[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(same(g, w) for g, w in zip(got, want, strict=True))
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_view_case(case: Path, tmp_path: Path, shared_findings):
    sql = (case / "query.sql").read_text()
    if case in shared_findings:
        con = duckdb.connect()
        con.register("analysis", shared_findings[case])
    else:
        con = open_case(case, tmp_path)
        if re.search(r"\banalysis\b", sql):
            con.register("analysis", analyze(con).table)
    got = rows_of(con, sql)
    want = json.loads((case / "expected.json").read_text())
    assert same(got, want), (
        f"{case_id(case)}: the query gave\n{json.dumps(got, indent=1, default=str)}\n"
        f"expected\n{json.dumps(want, indent=1)}"
    )
    # a finding says the severity its kind is declared with
    for row in got:
        if "kind" in row and "severity" in row:
            assert row["severity"] == KINDS_BY_NAME[row["kind"]].severity, row


def test_every_case_is_complete():
    assert CASES, "no case under tests/cases"
    for case in CASES:
        assert (case / "expected.json").is_file(), f"{case_id(case)}: no expected.json"
        assert (case / "inputs").is_dir() or (case / "tables").is_dir(), f"{case_id(case)}: no inputs"
    # every folder under tests/cases/<view>/ is a case: a misnamed query file is not skipped silently
    for folder in CASES_ROOT.glob("*/*"):
        if folder.is_dir():
            assert (folder / "query.sql").is_file(), f"{folder}: no query.sql"
