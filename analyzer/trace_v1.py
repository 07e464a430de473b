"""The connector trace v1, as ``schemas/trace_v1.toml`` defines it: record types, fields, checks.

One definition serves every side of the format: the ingester builds its field specs and
checks from it, the simulator and the test generator their record shapes, the docs
their page (``docs/trace-format.md``), and the connector inside vLLM checks what it
writes with ``validate``. That last use is why this module imports the standard library
only: it runs inside the engine's processes, where the analysis stack is not loaded.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

__all__ = [
    "EPOCH_RANGE",
    "GROUP_FIELDS",
    "RECORD_TYPES",
    "TYPES",
    "VERSION",
    "Field",
    "GroupField",
    "RecordType",
    "markdown",
    "record_type",
    "validate",
]

# Field types: what the ingester calls each in a reject reason ("wrong type for rank (want
# integer)"), and the range an integer type holds (a value beyond it is a wrong type).
TYPES: dict[str, str] = {
    "float64": "double",
    "int64": "bigint",
    "int32": "integer",
    "string": "varchar",
    "bool": "boolean",
    "groups": "list",
}
_INT_LIMITS = {"int64": 2**63, "int32": 2**31}
RANGES = ("non_negative", "epoch", "tp_size", "rank")
# The order the ingester checks ranges in, so the first problem found is the one it names:
# TP sizes, then ranks within them, then times, then counts below zero.
_RANGE_ORDER = {"tp_size": 0, "rank": 1, "epoch": 2, "non_negative": 3}
# How the docs name each type
_TYPE_WORDS = {
    "float64": "number",
    "int64": "integer",
    "int32": "integer (32-bit)",
    "string": "text",
    "bool": "true/false",
    "groups": "list of groups",
}


@dataclass(frozen=True)
class Field:
    """One field of a record type."""

    name: str  # as the trace spells it
    column: str | None  # the store column it fills; None: kept only in an event's details
    type: str  # a key of TYPES
    required: bool
    doc: str
    range: str | None = None  # one of RANGES
    within: str | None = None  # for range "rank": the field holding the TP size
    enum: tuple[str, ...] | None = None
    extension: bool = False  # added by hybridtrace to the contract's v1


@dataclass(frozen=True)
class RecordType:
    """One record type: the table it fills and its fields, in the order they are written."""

    name: str
    table: str
    written: str  # when a connector writes one
    doc: str
    fields: tuple[Field, ...]
    kind: str | None = None  # records read as log_events rows: the event kind
    level: str | None = None  # and the level
    extension: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    @property
    def is_event(self) -> bool:
        """Whether records of this type are read as ``log_events`` rows."""
        return self.kind is not None

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"trace {self.name} records have no field {name!r}")

    @property
    def enums(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.enum)

    @property
    def ranged(self) -> tuple[Field, ...]:
        """Fields with a range, in the order they are checked."""
        return tuple(sorted((f for f in self.fields if f.range), key=lambda f: _RANGE_ORDER[f.range]))


@dataclass(frozen=True)
class GroupField:
    """One key a KV-cache group entry may carry."""

    name: str
    type: str
    doc: str
    records: tuple[str, ...]  # the record types whose entries fill it


@dataclass(frozen=True)
class _Definition:
    version: int
    title: str
    preamble: str
    epoch_range: tuple[float, float]
    records: dict[str, RecordType]
    group_fields: tuple[GroupField, ...]


def _text(value: str) -> str:
    return value.strip()


def _load() -> _Definition:
    text = resources.files("hybridtrace.schemas").joinpath("trace_v1.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    low, high = raw["epoch_range"]
    records: dict[str, RecordType] = {}
    for entry in raw["record"]:
        fields = tuple(
            Field(
                name=f["name"],
                column=f.get("column"),
                type=f["type"],
                required=bool(f.get("required", False)),
                doc=_text(f["doc"]),
                range=f.get("range"),
                within=f.get("within"),
                enum=tuple(f["enum"]) if "enum" in f else None,
                extension=bool(f.get("extension", entry.get("extension", False))),
            )
            for f in entry["field"]
        )
        rtype = RecordType(
            name=entry["type"],
            table=entry["table"],
            written=_text(entry["written"]),
            doc=_text(entry["doc"]),
            fields=fields,
            kind=entry.get("kind"),
            level=entry.get("level"),
            extension=bool(entry.get("extension", False)),
        )
        _check(rtype)
        records[rtype.name] = rtype
    groups = tuple(
        GroupField(g["name"], g["type"], _text(g["doc"]), tuple(g["in"])) for g in raw["group_field"]
    )
    for g in groups:
        if g.type not in ("int64", "string"):
            raise ValueError(f"trace_v1.toml: group key {g.name} has type {g.type!r}")
    return _Definition(
        version=raw["version"],
        title=raw["title"],
        preamble=_text(raw["preamble"]),
        epoch_range=(float(low), float(high)),
        records=records,
        group_fields=groups,
    )


def _check(rtype: RecordType) -> None:
    """Refuse a definition the readers could not follow (a typo would fail far from here)."""
    where = f"trace_v1.toml: {rtype.name}"
    if len(set(rtype.names)) != len(rtype.fields):
        raise ValueError(f"{where}: a field is listed twice")
    if rtype.is_event != (rtype.table == "log_events") or rtype.is_event != (rtype.level is not None):
        raise ValueError(f"{where}: records read as log_events need a kind and a level")
    for f in rtype.fields:
        if f.type not in TYPES:
            raise ValueError(f"{where}.{f.name}: unknown type {f.type!r}")
        if f.column is None and not rtype.is_event:
            raise ValueError(f"{where}.{f.name}: no store column")
        if f.range is not None and f.range not in RANGES:
            raise ValueError(f"{where}.{f.name}: unknown range {f.range!r}")
        if (f.range == "rank") != (f.within is not None):
            raise ValueError(f"{where}.{f.name}: a rank range names the TP size it lies within")
        if f.within is not None and f.within not in rtype.names:
            raise ValueError(f"{where}.{f.name}: {f.within} is not a field")
        if f.enum is not None and f.type != "string":
            raise ValueError(f"{where}.{f.name}: an enum is text")


_DEFINITION = _load()

VERSION: int = _DEFINITION.version
EPOCH_RANGE: tuple[float, float] = _DEFINITION.epoch_range
# Record types in the order the definition lists them (the ingester reads them in it too).
RECORD_TYPES: Mapping[str, RecordType] = _DEFINITION.records
GROUP_FIELDS: tuple[GroupField, ...] = _DEFINITION.group_fields


def record_type(name: str) -> RecordType:
    """The record type called ``name`` (KeyError for a type v1 does not have)."""
    return RECORD_TYPES[name]


# --- validate ---------------------------------------------------------------------------


def _json(value: object) -> str:
    """A value as JSON text, as the ingester quotes a field's raw value in a reason."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _number_text(value: object) -> str:
    """A number as the ingester's SQL prints it (a double as Python's repr does)."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def _typed(kind: str, value: object) -> object | None:
    """``value`` as the ingester reads it into a column of type ``kind``; None for a wrong type.

    JSON types are strict: no fraction, boolean or quoted number for an integer, no text
    for a number; only text fields take a number (an id written as a number is its text).
    """
    if isinstance(value, bool):
        return value if kind == "bool" else None
    if kind == "float64":
        if not isinstance(value, int | float):
            return None
        try:
            return float(value)
        except OverflowError:  # an integer beyond any double reads as infinity, as JSON's does
            return math.inf if value > 0 else -math.inf
    if kind in _INT_LIMITS:
        limit = _INT_LIMITS[kind]
        return value if isinstance(value, int) and -limit <= value < limit else None
    if kind == "string":
        if isinstance(value, str):
            return value
        return _number_text(value) if isinstance(value, int | float) else None
    if kind == "groups":
        return value if isinstance(value, list) else None
    return None


def _ordered(value: object) -> object:
    """A number as the ingester's SQL orders it: NaN above every other number."""
    return math.inf if isinstance(value, float) and math.isnan(value) else value


def _in_range(f: Field, value: object, typed: dict[str, object]) -> bool:
    value = _ordered(value)
    if f.range == "non_negative":
        return value >= 0  # type: ignore[operator]
    if f.range == "epoch":
        return EPOCH_RANGE[0] <= value <= EPOCH_RANGE[1]  # type: ignore[operator]
    if f.range == "tp_size":
        return value >= 1  # type: ignore[operator]
    tp = typed.get(f.within or "")
    return tp is None or 0 <= value <= tp - 1  # type: ignore[operator]


def validate(record: object) -> list[str]:
    """The problems ``record`` has as a trace v1 line, by the ingester's rules.

    An empty list means the ingester accepts the record; otherwise the first reason is the
    one its reject would give, and the rest follow in the order it checks them. Unknown
    fields are no problem: readers ignore them.
    """
    if not isinstance(record, dict):
        return ["not a JSON object"]
    v = record.get("v")
    if v is None:
        return ['no "v" field']
    if isinstance(v, bool) or not isinstance(v, int | float) or v != 1:
        return [f"unsupported trace version {_json(v)}"]
    kind = record.get("type")
    if kind is None:
        return ['no "type" field']
    rtype = RECORD_TYPES.get(kind) if isinstance(kind, str) else None
    if rtype is None:
        return [f"unknown record type {kind if isinstance(kind, str) else _json(kind)}"]
    problems: list[str] = []
    typed: dict[str, object] = {}
    for f in rtype.fields:
        value = record.get(f.name)
        if value is None:
            if f.required:
                problems.append(f"missing field {f.name}")
            continue
        got = _typed(f.type, value)
        if got is None:
            problems.append(f"wrong type for {f.name} (want {TYPES[f.type]})")
            continue
        if isinstance(got, float) and not math.isfinite(got):
            # json.dumps writes NaN and Infinity, and the reader takes them, but they measure
            # nothing: the ingester rejects them (and 1e999, which reads as infinity)
            problems.append(f"{f.name} is not a finite number: {_number_text(got)}")
            continue
        typed[f.name] = got
    for f in rtype.enums:
        value = typed.get(f.name)
        if value is not None and value not in (f.enum or ()):
            problems.append(f"unknown {f.name} {value}")
    for f in rtype.ranged:
        value = typed.get(f.name)
        if value is not None and not _in_range(f, value, typed):
            label = f"{f.name} (epoch seconds)" if f.range == "epoch" else f.name
            problems.append(f"{label} out of range: {_number_text(value)}")
    return problems


# --- the docs page ----------------------------------------------------------------------


def _range_words(f: Field) -> str:
    if f.range == "non_negative":
        return "At least 0."
    if f.range == "epoch":
        low, high = (datetime.fromtimestamp(x, UTC).strftime("%Y-%m-%d") for x in EPOCH_RANGE)
        return f"Epoch seconds, {low} to {high} UTC."
    if f.range == "tp_size":
        return "At least 1."
    if f.range == "rank":
        return f"From 0 to `{f.within}` − 1."
    return ""


def _meaning(f: Field, rtype: RecordType) -> str:
    words = [f.doc]
    if f.enum:
        listed = ", ".join(f"`{e}`" for e in f.enum)
        words.append(f"One of {listed}." if len(f.enum) > 1 else f"Only {listed}.")
    if f.range:
        words.append(_range_words(f))
    if f.extension and not rtype.extension:  # a whole added record type is marked once
        words.append("*Extension.*")
    return " ".join(words)


def _goes_to(rtype: RecordType) -> str:
    if rtype.is_event:
        return (
            f"Read as one `log_events` row: kind `{rtype.kind}`, level `{rtype.level}`, process "
            "`trace`; `details` holds the record's fields as JSON, and the fields with a column "
            "fill it too."
        )
    return f"Read into `{rtype.table}`, one row per record."


def markdown() -> str:
    """The trace-format page (docs/trace-format.md), generated from the definition."""
    d = _DEFINITION
    out = [
        f"# {d.title}",
        "",
        "Generated from `schemas/trace_v1.toml` (read by `hybridtrace.trace_v1`); do not edit by hand.",
        "",
        d.preamble,
        "",
    ]
    for rtype in RECORD_TYPES.values():
        mark = " (*extension*)" if rtype.extension else ""
        out += [f"## `{rtype.name}` — {rtype.written}{mark}", "", rtype.doc, "", _goes_to(rtype), ""]
        out += ["| field | type | required | column | meaning |", "|---|---|---|---|---|"]
        for f in rtype.fields:
            column = f"`{f.column}`" if f.column else "(details)"
            required = "yes" if f.required else ""
            meaning = _meaning(f, rtype)
            out.append(f"| `{f.name}` | {_TYPE_WORDS[f.type]} | {required} | {column} | {meaning} |")
        out.append("")
    out += [
        "## Group entries",
        "",
        "`groups` lists the KV-cache groups (an `engine` record) or a read's share of each "
        "(a `transfer` record). A group is one of vLLM's KV-cache groups, layers sharing one "
        "page shape; several groups may share a kind. The store keeps `groups` as JSON text "
        "with exactly these keys, in this order; a key of another type reads as null.",
        "",
        "| key | type | in | meaning |",
        "|---|---|---|---|",
    ]
    for g in GROUP_FIELDS:
        where = ", ".join(f"`{r}`" for r in g.records)
        out.append(f"| `{g.name}` | {_TYPE_WORDS[g.type]} | {where} | {g.doc} |")
    out += [
        "",
        "## Rejects",
        "",
        'A line is read when it is a JSON object with `"v": 1` and a known `type`, every '
        "required field is there, every field has its type, and enums and ranges hold. "
        "Otherwise it is a reject, with the reason: `not valid JSON`, `invalid UTF-8`, "
        '`no "v" field`, `unsupported trace version 2`, `unknown record type header`, '
        "`missing field rank`, `wrong type for xfer_s (want double)`, `unknown status maybe`, "
        "`rank out of range: 4`, `xfer_s is not a finite number: nan`, … Types are strict: a "
        "number field takes any finite JSON number (not `NaN`, `Infinity` or a number too "
        "large for a double, such as `1e999`, which some JSON writers emit); "
        "an integer field no fraction, boolean or quoted number; a true/false field only "
        "`true` or `false`; a text field text, or a number, read as its text. "
        "`hybridtrace.trace_v1.validate(record)` lists a record's problems by these rules "
        "(none: the ingester reads it).",
        "",
        "## Extensions to the contract's v1",
        "",
        "hybridtrace adds these to the contract's trace v1. Every added field is optional.",
        "",
    ]
    for rtype in RECORD_TYPES.values():
        if rtype.extension:
            out.append(f"- record type `{rtype.name}`: {rtype.written}.")
            continue
        for f in rtype.fields:
            if f.extension:
                column = f" → `{rtype.table}.{f.column}`" if f.column else ""
                out.append(f"- `{rtype.name}.{f.name}`{column}: {f.doc}")
    out.append("")
    return "\n".join(out)
