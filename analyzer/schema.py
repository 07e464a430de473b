"""Table definitions, read from ``schemas/*.toml``: the one source of truth.

The Parquet writers, the DuckDB views and the docs all come from these definitions, so a
column is added in one place.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources

import pyarrow as pa

SCHEMA_VERSION = 1

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "json": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "date": pa.date32(),
}

_DUCKDB_TYPES: dict[str, str] = {
    "string": "VARCHAR",
    "json": "VARCHAR",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "float64": "DOUBLE",
    "bool": "BOOLEAN",
    "date": "DATE",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    doc: str

    @property
    def arrow_type(self) -> pa.DataType:
        return _ARROW_TYPES[self.type]

    @property
    def duckdb_type(self) -> str:
        return _DUCKDB_TYPES[self.type]


@dataclass(frozen=True)
class TableSchema:
    name: str
    doc: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    partition: tuple[str, ...]
    view: str  # name of the DuckDB view over the table's Parquet files
    derived: bool = False  # computed when the store is opened; no Parquet files

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @cached_property
    def _arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type) for c in self.columns])

    def arrow_schema(self) -> pa.Schema:
        return self._arrow_schema

    def conform(self, table: pa.Table) -> pa.Table:
        """``table`` with exactly this schema's columns, in order and types; absent ones null."""
        schema = self._arrow_schema
        present = set(table.column_names)
        arrays = []
        for field in schema:
            if field.name in present:
                array = table.column(field.name)
                arrays.append(array if array.type == field.type else array.cast(field.type))
            else:
                arrays.append(pa.nulls(table.num_rows, field.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def empty_select(self) -> str:
        """SQL for an empty relation with this schema, for a table with no data yet."""
        cols = ", ".join(f"CAST(NULL AS {c.duckdb_type}) AS {c.name}" for c in self.columns)
        return f"SELECT {cols} WHERE false"


TABLES = (
    "transfers",
    "requests",
    "engines",
    "intervals",
    "log_events",
    "rejects",
    "sources",
    "models",
    "prom_samples",
    "verifications",
    "nixl_transfers",
    "nixl_rings",
    "nixlbench_points",
    "agent_map",
    # the incremental analysis' state (analyze/incremental.py), written as batches too
    "analysis_runs",
    "analysis_requests",
    "analysis_findings",
    "analysis_run_findings",
    "analysis_rank_windows",
    "analysis_counts",
    "analysis_scrapes",
    "analysis_scrape_series",
)
DERIVED = ("engine_models",)


@cache
def table_schema(name: str) -> TableSchema:
    text = resources.files("hybridtrace.schemas").joinpath(f"{name}.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    columns = tuple(Column(c["name"], c["type"], c["doc"]) for c in raw["columns"])
    for column in columns:
        if column.type not in _ARROW_TYPES:
            raise ValueError(f"schemas/{name}.toml: unknown type {column.type!r} for {column.name}")
    return TableSchema(
        name=raw["name"],
        doc=raw["doc"],
        columns=columns,
        key=tuple(raw.get("key", ())),
        partition=tuple(raw.get("partition", ())),
        view=raw.get("view", raw["name"]),
        derived=bool(raw.get("derived", False)),
    )


def all_schemas() -> list[TableSchema]:
    return [table_schema(name) for name in (*TABLES, *DERIVED)]


def markdown() -> str:
    """The table reference (docs/tables.md), generated from the schema files."""
    out = [
        "# Store tables",
        "",
        f"Generated from `schemas/*.toml` (schema version {SCHEMA_VERSION}); do not edit by hand.",
        "",
    ]
    for schema in all_schemas():
        out += [f"## `{schema.name}`", "", schema.doc, ""]
        if schema.key:
            out += [f"Unique on: {', '.join(f'`{k}`' for k in schema.key)}.", ""]
        if schema.partition:
            out += [f"Partitioned by: {', '.join(f'`{k}`' for k in schema.partition)}.", ""]
        out += ["| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in schema.columns]
        out.append("")
    return "\n".join(out)
