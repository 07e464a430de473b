"""The documentation of the public views of ``queries/``, read from their comments: ``docs/views.md``.

Every public view (a name without a leading ``_``, in a module without one) carries a
comment block directly above its ``CREATE OR REPLACE VIEW``::

    -- transfer_bytes: one row per read with a sized engine and a matching request.
    --
    -- (more prose)
    --
    -- @column engine_id      decode engine
    -- @column excess_bytes   transported − expected (positive: more than a correct
    --                        connector moves)

``-- @columns-of <table>`` stands for every column of a store table, documented in its
schema; a ``finding_*`` view returns the ten finding columns
(``hybridtrace.analyze.rules.FINDING_COLUMNS``) and lists none. ``tests/test_views.py``
compares each block with ``DESCRIBE`` of the view on an empty store and ``docs/views.md``
with ``markdown()``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridtrace.analyze.rules import FINDING_COLUMNS, RULES
from hybridtrace.queries_loader import SqlModule, sql_modules

_CREATE_VIEW = re.compile(r"^CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)\s+AS\b", re.M | re.I)
_COLUMN = re.compile(r"^--\s@column\s+(\w+)\s+(\S.*)$")
_COLUMNS_OF = re.compile(r"^--\s@columns-of\s+(\w+)\s*$")


class ViewDocError(ValueError):
    """A public view whose comment block is missing or malformed."""


@dataclass(frozen=True)
class ViewDoc:
    name: str
    module: str
    summary: str  # the text after "name:" (its first line and what continues it)
    prose: tuple[str, ...]  # further paragraphs
    columns: tuple[tuple[str, str], ...]  # (name, doc), in the view's order

    @property
    def finding(self) -> bool:
        return self.name.startswith("finding_")


def public(name: str) -> bool:
    return not name.startswith("_")


def _comment_block(lines: list[str], end: int) -> list[str]:
    """The comment lines directly above line ``end``, in order."""
    start = end
    while start > 0 and lines[start - 1].startswith("--"):
        start -= 1
    return lines[start:end]


def _paragraphs(lines: list[str]) -> list[str]:
    paragraphs, current = [], []
    for line in lines:
        text = line[2:].strip()
        if text:
            current.append(text)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def parse_view_docs(module: SqlModule) -> list[ViewDoc]:
    """The documented public views of ``module`` (none for a private module)."""
    if module.private:
        return []
    from hybridtrace.schema import table_schema

    lines = module.text.splitlines()
    starts = {i for i, line in enumerate(lines) if _CREATE_VIEW.match(line)}
    docs = []
    for index in sorted(starts):
        name = _CREATE_VIEW.match(lines[index]).group(1)
        if not public(name):
            continue
        where = f"queries/{module.name}.sql, view {name}"
        block = _comment_block(lines, index)
        heads = [i for i, line in enumerate(block) if line.startswith(f"-- {name}:")]
        if not heads:
            raise ViewDocError(f"{where}: no `-- {name}: …` comment directly above it")
        block = [line for line in block[heads[-1] :] if not line.startswith("-- include:")]
        text, columns = [], []
        for line in block:
            column, table = _COLUMN.match(line), _COLUMNS_OF.match(line)
            if column:
                columns.append([column.group(1), column.group(2).strip()])
            elif table:
                columns += [[c.name, c.doc] for c in table_schema(table.group(1)).columns]
            elif columns and line.startswith("--  "):  # continues the column above
                columns[-1][1] += " " + line[2:].strip()
            elif columns and line.strip() != "--":
                raise ViewDocError(f"{where}: prose after its @column lines: {line!r}")
            elif not columns:
                text.append(line)
        paragraphs = _paragraphs(text)
        summary = paragraphs[0].removeprefix(f"{name}:").strip()
        if name.startswith("finding_"):
            if columns:
                raise ViewDocError(f"{where}: a finding view lists no @column (it has the finding columns)")
            columns = [[c, doc] for c, _, doc in FINDING_COLUMNS]
        elif not columns:
            raise ViewDocError(f"{where}: no `-- @column name  doc` lines")
        names = [c for c, _ in columns]
        if len(set(names)) != len(names):
            raise ViewDocError(f"{where}: a column documented twice")
        docs.append(ViewDoc(name, module.name, summary, tuple(paragraphs[1:]),
                            tuple((c, d) for c, d in columns)))  # fmt: skip
    return docs


def view_docs(modules: list[SqlModule] | None = None) -> list[ViewDoc]:
    """Every public view's documentation, module by module."""
    modules = sql_modules() if modules is None else modules
    return [doc for module in modules for doc in parse_view_docs(module)]


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(modules: list[SqlModule] | None = None) -> str:
    """``docs/views.md``: the finding columns, then each public module's views and their columns."""
    modules = sql_modules() if modules is None else modules
    out = [
        "# Views",
        "",
        "The public views of `queries/` (`hybridtrace query` reads them; the analyzer and the report",
        "are built on them). Generated from the views' comment blocks by `hybridtrace.view_docs.markdown()`;",
        "a test compares each block with the view's columns. Modules and views whose names start with `_`",
        "are private helpers and are not listed. Store tables are in [tables.md](tables.md).",
        "",
        "## Finding columns",
        "",
        "Every `finding_*` view returns these ten columns, in this order.",
        "",
        "| column | type | meaning |",
        "|---|---|---|",
        *[f"| `{name}` | {kind} | {_cell(doc)} |" for name, kind, doc in FINDING_COLUMNS],
        "",
    ]
    for module in modules:
        docs = parse_view_docs(module)
        if not docs:
            continue
        first = module.text.splitlines()[0].removeprefix("--").strip()
        summary = _sentence(first.removeprefix(f"{module.name}:"))
        out += [f"## `queries/{module.name}.sql`", "", _cell(summary), ""]
        if module.includes:
            out += ["Includes " + ", ".join(f"`{i}`" for i in module.includes) + ".", ""]
        for doc in docs:
            out += [f"### `{doc.name}`", "", _sentence(doc.summary), ""]
            for paragraph in doc.prose:
                out += [paragraph, ""]
            if doc.finding:
                rule = next((r for r in RULES if r.view == doc.name), None)
                kinds = rule.kinds if rule else ()
                raises = ", ".join(f"[{k}](findings/{k}.md)" for k in kinds) or "no registered kind"
                out += [f"Raises {raises}. Columns: the [finding columns](#finding-columns).", ""]
                continue
            out += ["| column | meaning |", "|---|---|"]
            out += [f"| `{name}` | {_cell(text)} |" for name, text in doc.columns]
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # python -m hybridtrace.view_docs > docs/views.md
    print(markdown(), end="")
