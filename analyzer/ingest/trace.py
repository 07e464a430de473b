"""Connector trace v1 (JSON Lines) → ``transfers``, ``requests``, ``engines`` and ``log_events`` rows.

What the format is (record types, fields, types, checks, the table each type fills) is
read from its one definition, ``hybridtrace.trace_v1``; this module only reads it fast.
Two vectorised paths. A chunk of clean lines (the usual case) is read by polars'
NDJSON reader against a fixed schema and checked in bulk. A chunk that fails any check
goes through DuckDB line by line-in-bulk: every line is decoded and parsed once, and the
bad ones are diagnosed. A record is rejected (never dropped) when its bytes are not
UTF-8, it is not a JSON object, its ``type``/``v`` is unknown, a required field is
missing, a field has the wrong type, a number is not finite (NaN, Infinity, 1e999), an
enum has another value, or a value is out of its range (a TP size below 1, a rank
outside its TP, a time that is not epoch seconds, a count below zero). Unknown extra
fields are ignored; an id given as a number is read as its text. ``release`` and
``dropped`` records become ``log_events`` rows, as the log lines they stand for do. Both
paths give the same rows.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace import trace_v1
from hybridtrace.ingest.limits import LINE_LIMIT
from hybridtrace.schema import table_schema
from hybridtrace.trace_v1 import Field, RecordType

if TYPE_CHECKING:
    # only the careful path uses DuckDB, and its caller opens the connection: a clean trace
    # (the usual case) never loads it
    import duckdb

RAW_LIMIT = 512

# Every record type, its fields, their checks and the table they fill come from the one
# definition (schemas/trace_v1.toml), which the connector and the docs read too.
RECORD_TYPES: dict[str, RecordType] = dict(trace_v1.RECORD_TYPES)
_SQL_TYPES = {
    "float64": "DOUBLE",
    "int64": "BIGINT",
    "int32": "INTEGER",
    "string": "VARCHAR",
    "bool": "BOOLEAN",
    "groups": "JSON",
}
_TABLES = tuple(dict.fromkeys(rtype.table for rtype in RECORD_TYPES.values()))


def _range_sql(f: Field) -> str:
    """The range of ``f`` as an SQL condition on the typed values (``v_<field>``)."""
    value = f"v_{f.name}"
    if f.range == "non_negative":
        return f"{value} >= 0"
    if f.range == "epoch":
        low, high = trace_v1.EPOCH_RANGE
        return f"{value} BETWEEN {low} AND {high}"
    if f.range == "tp_size":
        return f"{value} >= 1"
    return f"{value} BETWEEN 0 AND v_{f.within} - 1"


def _range_polars(f: Field) -> pl.Expr:
    """The same range on the fast path's frame; a missing value passes (a required one is
    caught by its own check)."""
    value = pl.col(f.name)
    if f.range == "non_negative":
        held = value >= 0
    elif f.range == "epoch":
        held = value.is_between(*trace_v1.EPOCH_RANGE)
    elif f.range == "tp_size":
        held = value >= 1
    else:  # a TP size below 1 or a rank outside its TP would divide by zero or count a rank twice
        held = value.is_between(0, pl.col(f.within) - 1)
    return value.is_null() | held


# One JSON token: a string, a structural character, or a bare scalar (number, true, null).
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]|[^\s"\[\]{},:]+')


def _top_level(line: bytes) -> bytes:
    """``line`` with every value nested below its top level replaced by null.

    Read token by token, without recursion, so any depth is fine. A record's ``v`` and
    ``type`` sit at the top level: what is below them cannot make a line a record or not.
    """
    out: list[bytes] = []
    depth = 0
    for token in _JSON_TOKEN.findall(line):
        if token in (b"[", b"{"):
            depth += 1
            if depth == 1:
                out.append(token)  # the top level opens
            elif depth == 2:
                out.append(b"null")  # a nested value: null stands in for all of it
        elif token in (b"]", b"}"):
            if depth == 1:
                out.append(token)  # the top level closes
            depth -= 1
        elif depth <= 1:
            out.append(token)
    return b" ".join(out)


def _top_level_record(line: bytes) -> object:
    """A line too deep for Python's parser, parsed down to its top level (None: no JSON)."""
    try:
        return json.loads(_top_level(line))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def looks_like_trace(head: bytes, lines: int = 8) -> bool:
    """True when one of the first ``lines`` non-blank lines is a v1 trace record.

    Not only the first: a rotated or copied trace can begin with the cut end of a record,
    or with a record type a later version added; those lines become rejects, and the
    records after them are read.
    """
    seen = 0
    for line in head.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            record = None
        except RecursionError:
            # Python's parser recurses once per level: a line nested deeper than it goes is
            # judged by its top level, where a record's `v` and `type` sit
            record = _top_level_record(line)
        if isinstance(record, dict) and record.get("v") == 1 and record.get("type") in RECORD_TYPES:
            return True
        seen += 1
        if seen == lines:
            break
    return False


# Keys a KV-cache group may carry, in trace `engine` and `transfer` records, in the order
# the store's JSON text of `groups` has them.
GROUP_FIELDS = {g.name: _SQL_TYPES[g.type] for g in trace_v1.GROUP_FIELDS}
_GROUPS_SQL = json.dumps([GROUP_FIELDS])
_POLARS = {
    "DOUBLE": pl.Float64,
    "BIGINT": pl.Int64,
    "INTEGER": pl.Int32,
    "VARCHAR": pl.String,
    "BOOLEAN": pl.Boolean,
}
_GROUP_STRUCT = pl.List(pl.Struct({k: _POLARS[v] for k, v in GROUP_FIELDS.items()}))


def _polars_schema() -> dict[str, pl.DataType]:
    schema: dict[str, pl.DataType] = {"type": pl.String, "v": pl.Int64}
    for rtype in RECORD_TYPES.values():
        for f in rtype.fields:
            wanted = _GROUP_STRUCT if f.type == "groups" else _POLARS[_SQL_TYPES[f.type]]
            if schema.get(f.name, wanted) != wanted:
                raise ValueError(f"trace field {f.name} has two types")
            schema[f.name] = wanted
    return schema


_SCHEMA: dict[str, pl.DataType] | None = None
_TYPE_SCHEMAS: dict[frozenset[str], dict[str, pl.DataType]] = {}


def _schema_for(types: frozenset[str] | None) -> dict[str, pl.DataType]:
    """The reader's schema for records of ``types`` (None: every type).

    The reader's time grows with the columns it builds, and a trace's chunks mostly hold
    the same few record types; fields of other types are not read (the careful path
    ignores them on a record of another type too).
    """
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = _polars_schema()
    if types is None:
        return _SCHEMA
    if types not in _TYPE_SCHEMAS:
        names = {"type", "v"} | {f.name for t in types for f in RECORD_TYPES[t].fields}
        _TYPE_SCHEMAS[types] = {name: dtype for name, dtype in _SCHEMA.items() if name in names}
    return _TYPE_SCHEMAS[types]


_EMPTY: dict[str, pa.Table] = {}


def _empty_tables() -> dict[str, pa.Table]:
    """An empty table per table the trace fills (made once: Arrow tables do not change)."""
    if not _EMPTY:
        _EMPTY.update((table, table_schema(table).arrow_schema().empty_table()) for table in _TABLES)
    return dict(_EMPTY)


def _has_long_line(block: bytes, limit: int = LINE_LIMIT) -> bool:
    """Whether a line of ``block`` is longer than ``limit`` bytes.

    Jumps a window of ``limit`` bytes at a time to the last newline inside it: a few steps
    per chunk, each finding a newline within a line's length from the window's end.
    """
    position, size = 0, len(block)
    while size - position > limit:
        cut = block.rfind(b"\n", position, position + limit + 1)
        if cut < 0:
            return True
        position = cut + 1
    return False


def _checks(frame: pl.DataFrame, counts: dict[str | None, int], filled: frozenset[str]) -> list[pl.Expr]:
    """One boolean aggregate per check the careful path makes, on the columns that hold values
    (``filled``).

    A column with no value passes every check but "required" (a missing value passes the
    others), so only the columns and record types the chunk has are checked: the cost
    follows what the chunk holds, not how many fields the format has. Each check fills
    its undecidable rows with false before ``all()``, which would skip them. The checks of
    one shape of chunk (its filled columns and their types, its record types) are built once.
    """
    height = frame.height
    types = frozenset((t, n == height) for t, n in counts.items())
    schema = frame.schema
    key = (filled, types, tuple(schema[name] for name in sorted(filled)))
    checks = _CHECKS.get(key)
    if checks is None:
        checks = _build_checks(schema, counts, filled, height)
        if len(_CHECKS) > 256:
            _CHECKS.clear()  # shapes are few; a trace that keeps changing shape is not kept
        _CHECKS[key] = checks
    return checks


_CHECKS: dict[tuple, list[pl.Expr]] = {}


def _judged_by_enum(name: str, counts: dict[str | None, int]) -> bool:
    """Whether every record type of the chunk that has field ``name`` allows it a few words
    only, none of which reads like an object, a list or a boolean: the enum check then
    refuses those too, and the text check is not needed. (`type` is judged by check 0.)"""
    if name == "type":
        return True
    judged = False
    for rtype in RECORD_TYPES.values():
        if not counts.get(rtype.name):
            continue
        field = next((f for f in rtype.fields if f.name == name), None)
        if field is None:
            continue
        if not field.enum or any(v[:1] in "{[" or v in ("true", "false") for v in field.enum):
            return False
        judged = True
    return judged


def _build_checks(schema: pl.Schema, counts: dict[str | None, int], filled: frozenset[str],
                  height: int) -> list[pl.Expr]:  # fmt: skip
    checks = [((pl.col("v") == 1) & pl.col("type").is_in(list(RECORD_TYPES))).fill_null(False)]
    for name in sorted(filled):
        dtype = schema[name]
        if dtype == pl.Float64:
            # polars refuses NaN, Infinity and 1e999 today, so this never fails; should a later
            # reader take them, they still go to the careful path, which rejects them
            checks.append(pl.col(name).is_finite().fill_null(True))
        elif dtype == pl.String and not _judged_by_enum(name, counts):
            # The reader turns an object, a list or a boolean into text for a string field: a
            # wrong type. A text that reads like one goes to the careful path, which tells them apart.
            text = pl.col(name).str
            boolean = pl.col(name).is_in(["true", "false"])
            looks_wrong = text.starts_with("{") | text.starts_with("[") | boolean
            checks.append(~looks_wrong.fill_null(False))
    for rtype in RECORD_TYPES.values():
        present = counts.get(rtype.name, 0)
        if not present:
            continue  # no record of this type: every check on it holds
        # a chunk of one record type (the usual case) needs no test of each row's type
        of_type = pl.lit(True) if present == height else pl.col("type") == rtype.name
        for f in rtype.fields:
            if f.required:
                if f.name not in filled:
                    return [pl.lit(False)]  # a required field no record of the type has
                checks.append((~of_type | pl.col(f.name).is_not_null()).fill_null(False))
        for f in rtype.enums:
            if f.name in filled:
                allowed = pl.col(f.name).is_in(list(f.enum or ())) | pl.col(f.name).is_null()
                checks.append((~of_type | allowed).fill_null(False))
        for f in rtype.ranged:
            if f.name in filled:
                checks.append((~of_type | _range_polars(f).fill_null(False)).fill_null(False))
    return checks


def fast_parse(block: bytes, first_line: int, n_lines: int, source_id: str) -> dict[str, pa.Table] | None:
    """Rows per table when every line of ``block`` is a clean record, else None."""
    return FastReader().parse(block, first_line, n_lines, source_id)


class FastReader:
    """The fast path over the chunks of one object.

    It reads each chunk with the fields of the record types the chunk before it held, and
    again with every field when the chunk holds another type, so its rows never depend on
    the guess. Of those fields, the ones no chunk of the object has given a value yet are
    read as polars' Null type: the reader then skips building their columns, and it refuses
    a chunk that has a value for one of them, which is read again with the types' fields
    typed (a field seen once stays typed for the rest of the object).
    """

    def __init__(self) -> None:
        self.types: frozenset[str] | None = None  # the record types of the last clean chunk
        self.filled: frozenset[str] = frozenset()  # the fields with a value in a clean chunk so far

    def parse(
        self, block: bytes, first_line: int, n_lines: int, source_id: str
    ) -> dict[str, pa.Table] | None:
        """Rows per table when every line of ``block`` is a clean record, else None."""
        if len(block) > LINE_LIMIT and _has_long_line(block):
            return None  # a line too long to be a record: the careful path rejects it
        frame = None
        if self.types is not None:
            # None here: a value in a field read as Null, or a chunk that is not clean
            frame = self._read(block, self.types, self.filled)
        if frame is None:
            frame = self._read(block, self.types)
        if frame is None:
            return None
        counts: dict[str | None, int] = dict(frame["type"].value_counts().iter_rows())
        if self.types is not None and not set(counts) <= self.types:
            # a type the guess left out: read every field (the type column, and so the
            # counts, are the same whatever the schema)
            frame = self._read(block, None)
            if frame is None:
                return None
        known = frozenset(t for t in counts if t in RECORD_TYPES)
        if frame.height != n_lines:
            return None  # blank lines: line numbers would not follow rows
        height = frame.height
        nulls = frame.null_count().row(0)
        filled = frozenset(name for name, n in zip(frame.columns, nulls, strict=True) if n < height)
        checks = _checks(frame, counts, filled)
        if not all(frame.select([c.all().alias(f"c{i}") for i, c in enumerate(checks)]).row(0)):
            return None
        self.types = known
        self.filled |= filled
        return _tables(frame, counts, first_line, source_id)

    @staticmethod
    def _read(
        block: bytes, types: frozenset[str] | None, filled: frozenset[str] | None = None
    ) -> pl.DataFrame | None:
        """``block`` read with the fields of ``types``; with ``filled``, the others read as Null
        (and then given their types back, all null, as a read that found no value types them)."""
        schema = _schema_for(types)
        nulls: dict[str, pl.DataType] = {}
        if filled is not None:
            nulls = {name: dtype for name, dtype in schema.items() if name not in filled}
            if nulls:
                schema = {name: pl.Null() if name in nulls else dtype for name, dtype in schema.items()}
        try:
            frame = pl.read_ndjson(block, schema=schema)
        except Exception:
            return None
        if nulls:
            frame = frame.with_columns(_typed_nulls(nulls))
        return frame


_TYPED_NULLS: dict[frozenset[str], list[pl.Expr]] = {}


def _typed_nulls(nulls: dict[str, pl.DataType]) -> list[pl.Expr]:
    """Columns of nulls of their types, for fields read as Null (made once per set of fields)."""
    key = frozenset(nulls)
    if key not in _TYPED_NULLS:
        _TYPED_NULLS[key] = [pl.lit(None, dtype).alias(name) for name, dtype in nulls.items()]
    return _TYPED_NULLS[key]


def _tables(frame: pl.DataFrame, counts: dict[str | None, int], first_line: int,
            source_id: str) -> dict[str, pa.Table]:  # fmt: skip
    """Rows per table of a chunk whose every record passed its checks."""
    frame = frame.with_columns(
        pl.int_range(first_line, first_line + frame.height, dtype=pl.Int64).alias("line_number")
    )
    tables = _empty_tables()
    events: list[pa.Table] = []
    for rtype in RECORD_TYPES.values():
        if not counts.get(rtype.name):
            continue
        part = frame if counts[rtype.name] == frame.height else frame.filter(pl.col("type") == rtype.name)
        if rtype.is_event:
            typed = part.select(*[pl.col(f.name) for f in rtype.fields], pl.col("line_number"))
            events.append(_event_rows(rtype, typed.to_arrow(), source_id))
            continue
        table = rtype.table
        groups_filled = any(
            f.type == "groups" and part[f.name].null_count() < part.height for f in rtype.fields
        )
        out = part.select([*_table_select(rtype, groups_filled), pl.lit(source_id).alias("source_id")])
        tables[table] = table_schema(table).conform(out.to_arrow())
    if events:
        tables["log_events"] = pa.concat_tables(events)
    return tables


_SELECTS: dict[tuple[str, bool], list[pl.Expr]] = {}


def _table_select(rtype: RecordType, groups_filled: bool) -> list[pl.Expr]:
    """The columns of a clean chunk's records of ``rtype`` as its table has them, in one select
    (built once per record type): the fields under their column names, the groups as JSON
    text (``groups_filled``: some record has them), a read's bytes by cache type, the day."""
    key = (rtype.name, groups_filled)
    if key not in _SELECTS:
        exprs = []
        for f in rtype.fields:
            column = f.column or f.name
            if f.type != "groups":
                exprs.append(pl.col(f.name).alias(column))
            elif groups_filled:
                encoded = (
                    pl.struct(pl.col(f.name).alias("g"))
                    .struct.json_encode()
                    .str.slice(5)
                    .str.strip_suffix("}")
                )
                exprs.append(pl.when(pl.col(f.name).is_null()).then(None).otherwise(encoded).alias(column))
            else:
                exprs.append(pl.lit(None, pl.String).alias(column))
        exprs.append(pl.col("line_number"))
        if rtype.table == "transfers":
            exprs += _group_bytes_polars()
        if "ts" in rtype.names:
            exprs.append(
                (pl.col("ts") * 1000).cast(pl.Int64).cast(pl.Datetime("ms", "UTC")).dt.date().alias("day")
            )
        if rtype.table == "engines":
            exprs.append(pl.lit("trace").alias("source_kind"))
        _SELECTS[key] = exprs
    return _SELECTS[key]


# Records read as log_events rows say in one line what happened, like the log line they stand for.
def _event_message(rtype: RecordType, fields: dict) -> str:
    if rtype.kind == "kv_expired":
        blocks = f"{fields['blocks']} KV blocks" if fields.get("blocks") is not None else "the KV blocks"
        return (
            f"released {blocks} of request {fields.get('request_id')} ({fields.get('reason', 'expired')}): "
            "the lease ran out before the decoder read them"
        )
    if rtype.kind == "trace_dropped":
        return f"the trace writer dropped {fields.get('records')} records"
    return f"trace {rtype.name} record"


def _event_rows(rtype: RecordType, typed: pa.Table, source_id: str) -> pa.Table:
    """``log_events`` rows of records of an event type, from their typed fields.

    Both paths call this with the same typed values, so both give the same rows. The hash
    names the record by its content, not by where it was read: the same record read twice
    is a duplicate, as the same log line is.
    """
    rows = []
    for record in typed.to_pylist():
        line = record.pop("line_number")
        fields = {name: value for name, value in record.items() if value is not None}
        details = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
        row = {f.column: fields.get(f.name) for f in rtype.fields if f.column}
        row.update(
            process="trace",
            level=rtype.level,
            kind=rtype.kind,
            message=_event_message(rtype, fields),
            details=details,
            event_hash=hashlib.md5(f"{rtype.name}|{details}".encode()).hexdigest(),
            source_id=source_id,
            line_number=line,
        )
        rows.append(row)
    schema = table_schema("log_events")
    table = schema.conform(pa.Table.from_pylist(rows)) if rows else schema.arrow_schema().empty_table()
    # the day as the other trace rows compute it: the millisecond of ts, truncated, in UTC
    millis = pc.cast(pc.multiply(table["ts"], 1000.0), pa.int64(), safe=False)
    day = pc.cast(pc.cast(millis, pa.timestamp("ms", tz="UTC")), pa.date32())
    return table.set_column(table.schema.get_field_index("day"), "day", day)


# A read's bytes by cache type, summed over its groups: recurrent state is the `mamba`
# groups (vLLM sizes linear-attention state with the same spec), attention every other
# kind. Null when the read has no group breakdown.
STATE_GROUP_KINDS = ("mamba",)


def _group_bytes_polars(groups: pl.Expr | None = None) -> list[pl.Expr]:
    """(attention, state) bytes of each read from its groups (a list of structs)."""
    groups = pl.col("groups") if groups is None else groups
    state = pl.element().struct.field("kind").is_in(list(STATE_GROUP_KINDS))
    has_groups = groups.list.len() > 0
    return [
        pl.when(has_groups)
        .then(groups.list.eval(pl.element().filter(~state).struct.field("bytes")).list.sum())
        .alias("attention_transported_bytes"),
        pl.when(has_groups)
        .then(groups.list.eval(pl.element().filter(state).struct.field("bytes")).list.sum())
        .alias("state_transported_bytes"),
    ]


def _with_group_bytes(rows: pa.Table) -> pa.Table:
    """Transfer rows whose groups are JSON text, with their bytes by cache type added."""
    groups = pl.col("groups").str.json_decode(pl.List(pl.Struct({"kind": pl.String, "bytes": pl.Int64})))
    frame = pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    return frame.with_columns(_group_bytes_polars(groups)).to_arrow()


def _structure() -> str:
    """One json_transform structure for every field of every record type, each kept as JSON."""
    spec: dict[str, str] = {"type": "VARCHAR", "v": "JSON"}
    for rtype in RECORD_TYPES.values():
        for f in rtype.fields:
            spec[f.name] = "JSON"
    return json.dumps(spec)


_NUMBER = "('UBIGINT', 'BIGINT', 'DOUBLE')"
_INTEGER = "('UBIGINT', 'BIGINT')"


def _typed(name: str, kind: str) -> str:
    """SQL typing one JSON field; NULL when the JSON value has another type."""
    field = f"j.{name}"
    if kind == "DOUBLE":
        return f"CASE WHEN json_type({field}) IN {_NUMBER} THEN CAST({field} AS DOUBLE) END"
    if kind in ("BIGINT", "INTEGER"):
        return f"CASE WHEN json_type({field}) IN {_INTEGER} THEN TRY_CAST({field} AS {kind}) END"
    if kind == "VARCHAR":  # ids given as numbers read as their text, as on the fast path
        return f"CASE WHEN json_type({field}) IN ('VARCHAR', {_NUMBER[1:-1]}) THEN {field} ->> '$' END"
    if kind == "BOOLEAN":
        return f"CASE WHEN json_type({field}) = 'BOOLEAN' THEN CAST({field} AS BOOLEAN) END"
    typed = f"json_transform({field}, '{_GROUPS_SQL}')"
    return f"CASE WHEN json_type({field}) = 'ARRAY' THEN CAST(to_json({typed}) AS VARCHAR) END"


def _lines_table(lines: list[bytes], first_line: int) -> pa.Table:
    return pa.table(
        {
            "line_number": pa.array(range(first_line, first_line + len(lines)), type=pa.int64()),
            "raw": pa.array(lines, type=pa.binary()),
        }
    )


# A line of JSON whitespace alone is blank, whatever ends it: a blank line of a CRLF file is
# "\r", which polars' reader skips as well.
_BLANK = "' ' || chr(9) || chr(13)"
# "v" is the number 1 (the fast path reads it as an integer; "1" as text is not v1)
_V1 = f"(json_type(j.v) IN {_NUMBER} AND TRY_CAST(j.v AS DOUBLE) = 1)"
_KNOWN = ", ".join(f"'{name}'" for name in RECORD_TYPES)
_VALID = f"text IS NOT NULL AND j.type IN ({_KNOWN}) AND {_V1}"


def parse_trace(
    con: duckdb.DuckDBPyConnection, lines: list[bytes], first_line: int, source_id: str
) -> tuple[dict[str, pa.Table], pa.Table]:
    """Rows per table and the rejects of ``lines`` (line ``first_line`` is the first).

    Each line is parsed once (``json_transform`` into a struct of JSON fields); only the
    rare bad lines are parsed again, to say what is wrong with them.
    """
    structure = _structure().replace("'", "''")
    long = [i for i, line in enumerate(lines) if len(line) > LINE_LIMIT]
    too_long = {
        "line_number": [first_line + i for i in long],
        "reason": [f"line longer than {LINE_LIMIT} bytes"] * len(long),
        "raw": [lines[i][: RAW_LIMIT * 4].decode("utf-8", "replace")[:RAW_LIMIT] for i in long],
    }
    if long:
        # No record comes near this size: the line is a reject before DuckDB copies it
        # (a blank line in its place keeps the numbering)
        lines = list(lines)
        for i in long:
            lines[i] = b""
    con.register("_lines", _lines_table(lines, first_line))
    try:
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _parsed AS
            SELECT line_number, text, try(json_transform(text, '{structure}')) AS j
            FROM (SELECT line_number, try(decode(raw)) AS text FROM _lines WHERE octet_length(raw) > 0)
            WHERE text IS NULL OR trim(text, {_BLANK}) <> ''
            """
        )
        rejects = [
            con.sql(
                f"""
                SELECT line_number,
                       CASE WHEN text IS NULL THEN 'invalid UTF-8'
                            WHEN j IS NULL OR NOT json_valid(text) THEN 'not valid JSON'
                            WHEN json_type(text) <> 'OBJECT' THEN 'not a JSON object'
                            WHEN j.v IS NULL THEN 'no "v" field'
                            WHEN NOT {_V1}
                                 THEN 'unsupported trace version ' || CAST(j.v AS VARCHAR)
                            WHEN j.type IS NULL THEN 'no "type" field'
                            ELSE 'unknown record type ' || j.type
                       END AS reason,
                       left(coalesce(text, '(undecodable bytes)'), {RAW_LIMIT}) AS raw
                FROM _parsed WHERE NOT coalesce({_VALID}, false)
                """
            ).to_arrow_table()
        ]
        tables = _empty_tables()
        events: list[pa.Table] = []
        for rtype in RECORD_TYPES.values():
            rows, bad = _project(con, rtype, source_id)
            rejects.append(bad)
            if rtype.is_event:
                events.append(rows)
            else:
                tables[rtype.table] = rows
        if any(e.num_rows for e in events):
            tables["log_events"] = pa.concat_tables(events)
    finally:
        con.unregister("_lines")
    if long:
        rejects.append(pa.table(too_long).cast(rejects[0].schema))
    return tables, pa.concat_tables(rejects)


def _reason(rtype: RecordType) -> str:
    """The first problem of a record of ``rtype`` as SQL (NULL: none), checked in the order
    hybridtrace.trace_v1.validate names them: fields in order (missing, wrong type), enums,
    ranges. Typed values are the ``v_<field>`` columns."""
    checks = []
    for f in rtype.fields:
        if f.required:
            checks.append(f"WHEN j.{f.name} IS NULL THEN 'missing field {f.name}'")
        want = trace_v1.TYPES[f.type]
        checks.append(
            f"WHEN j.{f.name} IS NOT NULL AND v_{f.name} IS NULL THEN 'wrong type for {f.name} (want {want})'"
        )
        if f.type == "float64":  # NaN, Infinity and 1e999 read as numbers that measure nothing
            reason = f"'{f.name} is not a finite number: ' || v_{f.name}"
            checks.append(f"WHEN NOT isfinite(v_{f.name}) THEN {reason}")
    for f in rtype.enums:
        listing = ", ".join(f"'{v}'" for v in f.enum or ())
        checks.append(f"WHEN v_{f.name} NOT IN ({listing}) THEN 'unknown {f.name} ' || v_{f.name}")
    for f in rtype.ranged:
        label = f"{f.name} (epoch seconds)" if f.range == "epoch" else f.name
        checks.append(f"WHEN NOT ({_range_sql(f)}) THEN '{label} out of range: ' || v_{f.name}")
    return "CASE " + " ".join(checks) + " END"


def _project(con: duckdb.DuckDBPyConnection, rtype: RecordType, source_id: str) -> tuple[pa.Table, pa.Table]:
    values = ", ".join(f"{_typed(f.name, _SQL_TYPES[f.type])} AS v_{f.name}" for f in rtype.fields)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _typed AS
        SELECT *, {_reason(rtype)} AS _reason
        FROM (SELECT line_number, text, j, {values}
              FROM _parsed WHERE {_VALID} AND j.type = '{rtype.name}')
        """
    )
    bad = con.sql(
        f"SELECT line_number, _reason AS reason, left(text, {RAW_LIMIT}) AS raw "
        "FROM _typed WHERE _reason IS NOT NULL"
    ).to_arrow_table()
    if rtype.is_event:
        fields = ", ".join(f"v_{f.name} AS {f.name}" for f in rtype.fields)
        typed = con.sql(
            f"SELECT {fields}, line_number FROM _typed WHERE _reason IS NULL ORDER BY line_number"
        ).to_arrow_table()
        return _event_rows(rtype, typed, source_id), bad
    columns = ", ".join(f"v_{f.name} AS {f.column}" for f in rtype.fields)
    day = ", CAST(to_timestamp(v_ts) AT TIME ZONE 'UTC' AS DATE) AS day" if "ts" in rtype.names else ""
    if rtype.table == "engines":
        day += ", 'trace' AS source_kind"
    rows = con.sql(
        f"""
        SELECT {columns}{day}, '{source_id}' AS source_id, line_number
        FROM _typed WHERE _reason IS NULL ORDER BY line_number
        """
    ).to_arrow_table()
    if rtype.table == "transfers":  # the same sums as the fast path, from the same expressions
        rows = _with_group_bytes(rows)
    return table_schema(rtype.table).conform(rows), bad
