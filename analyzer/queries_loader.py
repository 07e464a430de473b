"""Install the SQL modules of ``queries/`` as DuckDB views, in the order their includes give.

Each ``.sql`` file is one module of ``CREATE VIEW`` and ``CREATE MACRO`` statements. Its
opening comment block declares the modules whose views or macros it uses, on one line::

    -- include: _macros, accounting

(``-- include:`` with nothing after it: the module uses only the store's tables). Modules
are installed so that every module comes after what it includes; among modules free to go,
by name. A module that includes one that does not exist, or modules that include each
other, are refused before anything is installed. DuckDB binds a view when it is created,
so a module that uses a view it does not include fails with the module named; the tests
install every module with only what it includes to keep the declarations complete.

Files whose names start with ``_`` are private helpers; so are views and macros whose
names do (``docs/views.md`` documents the others).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

import duckdb

_INCLUDE = re.compile(r"^--\s*include:(.*)$")
_DEFINES = re.compile(r"^CREATE\s+OR\s+REPLACE\s+(?:TEMP\s+)?(?:VIEW|MACRO|TABLE)\s+(\w+)", re.M | re.I)
_MISSING = re.compile(r"with name (\w+) does not exist")

# The statements of each module text, parsed once per process: DuckDB's parser takes a
# tenth of installing the views, and a process that opens several connections (the
# scheduled job, the demo, the tests) would parse the same text for each. A parsed
# statement runs on any connection; keyed by the text, an edited file is parsed anew.
_PARSED: dict[str, tuple[duckdb.Statement, ...]] = {}
_PARSED_MAX = 256  # texts kept: far more than queries/ holds, a bound for callers' own modules


class QueryModuleError(RuntimeError):
    """A module of ``queries/`` that cannot be installed: its includes, or a statement of it."""


@dataclass(frozen=True)
class SqlModule:
    """One ``queries/<name>.sql`` file: its text and the modules it declares it includes."""

    name: str
    text: str
    includes: tuple[str, ...]

    @property
    def private(self) -> bool:
        return self.name.startswith("_")

    @property
    def defines(self) -> tuple[str, ...]:
        """The views and macros it creates."""
        return tuple(_DEFINES.findall(self.text))


def parse_module(name: str, text: str) -> SqlModule:
    """The module ``name`` holding ``text``; its ``-- include:`` line is required."""
    includes: tuple[str, ...] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("--"):
            break  # the opening comment block is over
        found = _INCLUDE.match(stripped)
        if found:
            if includes is not None:
                raise QueryModuleError(f"queries/{name}.sql: more than one `-- include:` line")
            includes = tuple(part.strip() for part in found.group(1).split(",") if part.strip())
    if includes is None:
        raise QueryModuleError(
            f"queries/{name}.sql: no `-- include:` line in its opening comment (list the modules whose "
            "views or macros it uses, or leave the line empty when it reads only the store's tables)"
        )
    if name in includes:
        raise QueryModuleError(f"queries/{name}.sql: includes itself")
    return SqlModule(name, text, includes)


def sql_modules() -> list[SqlModule]:
    """Every module of the packaged ``queries/``, by name."""
    root = resources.files("hybridtrace.queries")
    files = sorted((p for p in root.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [parse_module(p.name.removesuffix(".sql"), p.read_text(encoding="utf-8")) for p in files]


def install_order(modules: Iterable[SqlModule], wanted: Iterable[str] | None = None) -> list[SqlModule]:
    """``wanted`` (default: all) and everything they include, each after its includes.

    A missing include or a cycle is a ``QueryModuleError`` naming the modules involved.
    """
    by_name = {m.name: m for m in modules}
    for module in by_name.values():
        missing = [i for i in module.includes if i not in by_name]
        if missing:
            raise QueryModuleError(
                f"queries/{module.name}.sql includes {', '.join(missing)}, which no file of queries/ holds"
            )
    needed: set[str] = set()
    stack = list(by_name if wanted is None else wanted)
    while stack:
        name = stack.pop()
        if name not in by_name:
            raise QueryModuleError(f"no module queries/{name}.sql")
        if name not in needed:
            needed.add(name)
            stack.extend(by_name[name].includes)
    order: list[SqlModule] = []
    placed: set[str] = set()
    while len(placed) < len(needed):
        ready = sorted(n for n in needed - placed if set(by_name[n].includes) <= placed)
        if not ready:
            raise QueryModuleError(f"queries/ modules include each other: {_cycle(by_name, needed - placed)}")
        placed.add(ready[0])  # one at a time, by name: the order does not depend on set order
        order.append(by_name[ready[0]])
    return order


def _cycle(by_name: Mapping[str, SqlModule], left: set[str]) -> str:
    """One cycle among ``left`` (every module there waits on another one there), as a → b → a."""
    path = [min(left)]
    while True:
        following = min(i for i in by_name[path[-1]].includes if i in left)
        if following in path:
            cycle = [*path[path.index(following) :], following]
            return " → ".join(cycle)
        path.append(following)


def install_views(
    con: duckdb.DuckDBPyConnection,
    modules: Iterable[SqlModule] | None = None,
    *,
    only: Iterable[str] | None = None,
) -> None:
    """Create the views and macros of every module (or of ``only`` and what they include)."""
    modules = list(sql_modules() if modules is None else modules)
    owners = {name: m.name for m in modules for name in m.defines}
    for module in install_order(modules, only):
        for statement in _statements(con, module):
            try:
                con.execute(statement)
            except duckdb.Error as exc:
                why = _explained(exc, module, owners)
                raise QueryModuleError(f"queries/{module.name}.sql: {why}") from exc


def _statements(con: duckdb.DuckDBPyConnection, module: SqlModule) -> tuple[duckdb.Statement, ...]:
    """The statements of ``module``, parsed on ``con`` the first time this process sees its text."""
    parsed = _PARSED.get(module.text)
    if parsed is None:
        parsed = tuple(con.extract_statements(module.text))
        if len(_PARSED) < _PARSED_MAX:
            _PARSED[module.text] = parsed
    return parsed


def _explained(exc: duckdb.Error, module: SqlModule, owners: dict[str, str]) -> str:
    """The error's first line, and which module holds the name it misses, when one does."""
    message = str(exc).splitlines()[0]
    missing = _MISSING.search(message)
    owner = owners.get(missing.group(1)) if missing else None
    if owner and owner != module.name:
        name = missing.group(1)
        return f"{message} ({name} is in queries/{owner}.sql: add {owner} to the `-- include:` line)"
    return message
