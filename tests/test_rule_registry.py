"""The finding-rule registry (hybridtrace.analyze.rules) is complete: every rule has its view,
returning the ten finding columns, its docs page and a test; every kind, threshold and view
it names exists, and the lists derived from it (docs/findings.md, _handoff_findings) agree.

These are the checks behind the "Adding a finding kind" checklist of docs/architecture.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hybridtrace.analyze import analyze
from hybridtrace.analyze.rules import (
    ALL_KINDS,
    FINDING_COLUMNS,
    KIND_LIST,
    RULES,
    SEVERITIES,
    request_rules,
    with_generated_tables,
)
from hybridtrace.analyze.thresholds import THRESHOLDS
from hybridtrace.queries_loader import sql_modules
from hybridtrace.store import Store

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases"
RULE_IDS = [r.name for r in RULES]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("rules") / "s")
    store.init()
    return store.connect()


def module_text(name: str) -> str:
    return next(m.text for m in sql_modules() if m.name == name)


def view_body(module: str, view: str) -> str:
    """The statement that creates ``view`` in ``module``, up to the next one."""
    return module_text(module).split(f"VIEW {view} AS", 1)[1].split("CREATE OR REPLACE", 1)[0]


def test_names_are_unique_and_every_kind_is_raised_by_a_rule():
    assert len({r.name for r in RULES}) == len(RULES)
    assert len(set(ALL_KINDS)) == len(ALL_KINDS)
    raised = {kind for r in RULES for kind in r.kinds}
    assert raised <= set(ALL_KINDS), f"rules raise undeclared kinds {sorted(raised - set(ALL_KINDS))}"
    assert set(ALL_KINDS) <= raised, f"kinds no rule raises: {sorted(set(ALL_KINDS) - raised)}"
    assert all(k.severity in SEVERITIES and k.origin in ("contract", "native", "verify") for k in KIND_LIST)


@pytest.mark.parametrize("name", RULE_IDS)
def test_every_rule_has_its_view_in_its_module_with_the_finding_columns(con, name):
    rule = next(r for r in RULES if r.name == name)
    module = next((m for m in sql_modules() if m.name == rule.module), None)
    assert module is not None, f"{name}: no queries/{rule.module}.sql"
    assert rule.view in module.defines, f"{name}: queries/{rule.module}.sql does not create {rule.view}"
    described = [(row[0], row[1]) for row in con.sql(f"DESCRIBE {rule.view}").fetchall()]
    assert described == [(c, t) for c, t, _ in FINDING_COLUMNS], f"{rule.view} returns {described}"
    # the view says the kinds it raises, and nothing else
    said = set(re.findall(r"'([a-z_]+)'", view_body(rule.module, rule.view))) & set(ALL_KINDS)
    assert said == set(rule.kinds), f"{rule.view} names kinds {sorted(said)}, the registry {rule.kinds}"


@pytest.mark.parametrize("name", RULE_IDS)
def test_every_rule_counts_its_inputs_and_reads_known_thresholds(con, name):
    rule = next(r for r in RULES if r.name == name)
    assert con.sql(rule.inputs).fetchall() == [(0,)], f"{name}: its inputs on an empty store"
    assert rule.inputs_doc
    known = {t.name for t in THRESHOLDS}
    assert set(rule.thresholds) <= known, f"{name}: unknown thresholds {set(rule.thresholds) - known}"


def test_every_threshold_is_read_by_a_rule_that_declares_it():
    used = {t for r in RULES for t in r.thresholds}
    assert {t.name for t in THRESHOLDS} <= used
    # a rule that reads a threshold in its module's SQL declares it (the view, or what it reads there)
    for rule in RULES:
        read = set(re.findall(r"_t\('(\w+)'\)", view_body(rule.module, rule.view)))
        assert read <= set(rule.thresholds), f"{rule.view} reads {sorted(read - set(rule.thresholds))}"


def test_every_finding_view_is_a_registered_rule():
    views = {name for m in sql_modules() for name in m.defines if name.startswith("finding_")}
    assert views == {r.view for r in RULES}


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_kind_has_its_docs_page(kind):
    page = ROOT / next(k.doc for k in KIND_LIST if k.name == kind)
    assert page.is_file(), f"{kind}: no {page.relative_to(ROOT)}"
    assert page.read_text().strip(), f"{page} is empty"


def test_every_docs_page_is_a_kind():
    pages = {p.stem for p in (ROOT / "docs" / "findings").glob("*.md")}
    assert pages == set(ALL_KINDS)


@pytest.mark.parametrize("name", RULE_IDS)
def test_every_rule_has_a_case_or_a_named_test(name):
    rule = next(r for r in RULES if r.name == name)
    cases = sorted(p.parent.name for p in (CASES / rule.view).glob("*/query.sql"))
    assert cases or rule.tests, f"{name}: no case under tests/cases/{rule.view}/ and no named test"
    for test in rule.tests:
        path, _, function = test.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert function in names, f"{name}: {test} does not exist"


def test_the_handoff_findings_union_every_request_rule():
    unioned = set(re.findall(r"\bFROM (finding_\w+)", view_body("verifications", "_handoff_findings")))
    assert unioned == {r.view for r in request_rules(after_others=False)}


def test_the_findings_docs_tables_are_generated_from_the_registry():
    docs = ROOT / "docs" / "findings.md"
    text = docs.read_text()
    assert with_generated_tables(text) == text, (
        "regenerate: python -c 'from pathlib import Path; from hybridtrace.analyze.rules import "
        "with_generated_tables as g; p = Path(\"docs/findings.md\"); p.write_text(g(p.read_text()))'"
    )


def test_the_simulator_injects_the_contract_kinds_with_their_declared_severity():
    # the simulator writes its truth with a severity per kind, taken from the registry
    from hybridtrace.analyze.rules import CONTRACT_KINDS, KINDS_BY_NAME
    from hybridtrace.simulate.scenario import INJECTABLE
    from hybridtrace.simulate.workload import _MESSAGES, REQUEST_KINDS, _finding

    assert tuple(INJECTABLE) == CONTRACT_KINDS
    assert set(REQUEST_KINDS) <= set(KINDS_BY_NAME) and set(_MESSAGES) == set(REQUEST_KINDS)
    for kind in (*REQUEST_KINDS, "slow_rank"):
        assert _finding(kind, "e")["severity"] == KINDS_BY_NAME[kind].severity, kind


@pytest.mark.parametrize("name", [r.name for r in RULES if r.needs_inputs])
def test_a_rule_not_run_without_inputs_raises_nothing_without_them(con, name):
    # the analysis skips such a rule when it counts no inputs: on a store with none, its view
    # gives no finding either, so the skip changes no result
    rule = next(r for r in RULES if r.name == name)
    assert rule.after_others  # the analysis counts them before running the later rules only
    assert con.sql(rule.inputs).fetchall()[0][0] == 0
    assert con.sql(f"SELECT count(*) FROM {rule.view}").fetchall()[0][0] == 0


@pytest.mark.parametrize("name", [r.name for r in RULES if r.requires])
def test_a_rule_not_run_without_what_it_requires_raises_nothing_without_it(demo_store, name):
    # the analysis skips such a rule when its `requires` counts nothing: on a store of reads
    # (the demo's, vLLM engines only) its view then gives no finding, so the skip changes no
    # result, and the analysis counts the rule's inputs as 0
    rule = next(r for r in RULES if r.name == name)
    con = Store(demo_store).connect()
    assert con.sql("SELECT count(*) FROM transfers").fetchall()[0][0] > 0
    assert con.sql(rule.requires).fetchall()[0][0] == 0
    assert con.sql(f"SELECT count(*) FROM {rule.view}").fetchall()[0][0] == 0
    assert analyze(con).summary["rules"][name] == {"inputs": 0, "findings": 0, "kinds": list(rule.kinds)}
