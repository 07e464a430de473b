"""Connector trace v1 (JSON Lines) → ``transfers``, ``requests``, ``engines`` rows.

Two vectorised paths. A chunk of clean lines (the usual case) is read by polars'
NDJSON reader against a fixed schema and checked in bulk. A chunk that fails any check
goes through DuckDB line by line-in-bulk: every line is decoded and parsed once, and the
bad ones are diagnosed. A record is rejected (never dropped) when its bytes are not
UTF-8, it is not a JSON object, its ``type``/``v`` is unknown, a required field is
missing, a field has the wrong type, or a TP size or rank is out of range. Unknown extra
fields are ignored; an id given as a number is read as its text. Both paths give the
same rows.
"""

from __future__ import annotations

import json

import duckdb
import polars as pl
import pyarrow as pa

from hybridtrace.schema import table_schema
from hybridtrace.units import EPOCH_RANGE

RAW_LIMIT = 512

# Field specs per record type: (trace field, column, DuckDB type, required).
_TRANSFER = (
    ("ts", "ts", "DOUBLE", True),
    ("request_id", "request_id", "VARCHAR", True),
    ("remote_request_id", "remote_request_id", "VARCHAR", False),
    ("engine_id", "engine_id", "VARCHAR", True),
    ("remote_engine_id", "remote_engine_id", "VARCHAR", True),
    ("rank", "rank", "INTEGER", True),
    ("tp_size", "tp_size", "INTEGER", True),
    ("remote_rank", "remote_rank", "INTEGER", True),
    ("remote_tp_size", "remote_tp_size", "INTEGER", True),
    ("status", "status", "VARCHAR", True),
    ("post_s", "post_s", "DOUBLE", False),
    ("xfer_s", "xfer_s", "DOUBLE", True),
    ("bytes", "transported_bytes", "BIGINT", True),
    ("descriptors", "descriptors", "BIGINT", False),
    ("staging_bytes", "staging_bytes", "BIGINT", False),
    ("link", "link", "VARCHAR", False),
    ("groups", "groups", "JSON", False),
)
_REQUEST = (
    ("ts", "ts", "DOUBLE", True),
    ("request_id", "request_id", "VARCHAR", True),
    ("remote_request_id", "remote_request_id", "VARCHAR", False),
    ("engine_id", "engine_id", "VARCHAR", True),
    ("remote_engine_id", "remote_engine_id", "VARCHAR", False),
    ("prompt_tokens", "prompt_tokens", "BIGINT", False),
    ("cached_tokens", "cached_tokens", "BIGINT", False),
    ("missing_tokens", "missing_tokens", "BIGINT", True),
    ("transferred_tokens", "transferred_tokens", "BIGINT", False),
    ("reused_tokens", "reused_tokens", "BIGINT", False),
    ("recomputed_tokens", "recomputed_tokens", "BIGINT", False),
    ("state_blocks", "state_blocks", "BIGINT", False),
    ("boundary_tokens", "boundary_tokens", "BIGINT", False),
    ("prefill_s", "prefill_s", "DOUBLE", False),
    ("status", "status", "VARCHAR", False),
)
_ENGINE = (
    ("ts", "ts", "DOUBLE", False),
    ("engine_id", "engine_id", "VARCHAR", True),
    ("role", "role", "VARCHAR", True),
    ("model", "model", "VARCHAR", False),
    ("tp_size", "tp_size", "INTEGER", True),
    ("kv_cache_dtype", "kv_cache_dtype", "VARCHAR", False),
    ("kv_buffer_device", "kv_buffer_device", "VARCHAR", False),
    ("kv_layout", "kv_layout", "VARCHAR", False),
    ("mamba_cache_dtype", "mamba_cache_dtype", "VARCHAR", False),
    ("mamba_ssm_cache_dtype", "mamba_ssm_cache_dtype", "VARCHAR", False),
    ("mamba_cache_mode", "mamba_cache_mode", "VARCHAR", False),
    ("hybrid_allocator", "hybrid_allocator", "BOOLEAN", False),
    ("conv_layout", "conv_layout", "VARCHAR", False),
    ("vllm_version", "vllm_version", "VARCHAR", False),
    ("groups", "groups", "JSON", False),
)
RECORD_TYPES = {
    "transfer": ("transfers", _TRANSFER),
    "request": ("requests", _REQUEST),
    "engine": ("engines", _ENGINE),
}


def _epoch() -> tuple[str, str, pl.Expr]:
    low, high = EPOCH_RANGE
    return ("ts", f"ts BETWEEN {low} AND {high}", pl.col("ts").is_null() | pl.col("ts").is_between(low, high))


def _not_negative(*fields: tuple[str, str]) -> tuple[tuple[str, str, pl.Expr], ...]:
    """Counts, bytes and times below zero: (trace field, column) pairs; a missing value passes."""
    return tuple(
        (name, f"{column} >= 0", pl.col(name).is_null() | (pl.col(name) >= 0)) for name, column in fields
    )


# Values a field's type allows but a deployment cannot have, per record type:
# (trace field, SQL condition on table columns, polars condition on trace fields). A
# TP size below 1 or a rank outside its TP would divide by zero or count a rank twice.
_RANGES = {
    "transfer": (
        ("tp_size", "tp_size >= 1", pl.col("tp_size") >= 1),
        ("remote_tp_size", "remote_tp_size >= 1", pl.col("remote_tp_size") >= 1),
        ("rank", "rank BETWEEN 0 AND tp_size - 1", pl.col("rank").is_between(0, pl.col("tp_size") - 1)),
        ("remote_rank", "remote_rank BETWEEN 0 AND remote_tp_size - 1",
         pl.col("remote_rank").is_between(0, pl.col("remote_tp_size") - 1)),
        _epoch(),
        *_not_negative(("post_s", "post_s"), ("xfer_s", "xfer_s"), ("bytes", "transported_bytes"),
                       ("descriptors", "descriptors"), ("staging_bytes", "staging_bytes")),
    ),
    "request": (
        _epoch(),
        *_not_negative(*((name, name) for name in (
            "prompt_tokens", "cached_tokens", "missing_tokens", "transferred_tokens", "reused_tokens",
            "recomputed_tokens", "state_blocks", "boundary_tokens", "prefill_s"))),
    ),
    "engine": (("tp_size", "tp_size >= 1", pl.col("tp_size") >= 1), _epoch()),
}  # fmt: skip
_ENUMS = {
    "transfer": {"status": ("ok", "failed", "expired")},
    "request": {"status": ("ok", "failed", "expired", "recomputed")},
    "engine": {"role": ("prefill", "decode")},
}


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
        if isinstance(record, dict) and record.get("v") == 1 and record.get("type") in RECORD_TYPES:
            return True
        seen += 1
        if seen == lines:
            break
    return False


# Keys a KV-cache group may carry, in trace `engine` and `transfer` records.
GROUP_FIELDS = {
    "group": "BIGINT",
    "kind": "VARCHAR",
    "layers": "BIGINT",
    "padding_layers": "BIGINT",
    "block_tokens": "BIGINT",
    "page_bytes": "BIGINT",
    "state_bytes": "BIGINT",
    "blocks": "BIGINT",
    "bytes": "BIGINT",
    "descriptors": "BIGINT",
}
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
    for _, fields in RECORD_TYPES.values():
        for name, _, kind, _ in fields:
            wanted = _GROUP_STRUCT if kind == "JSON" else _POLARS[kind]
            if schema.get(name, wanted) != wanted:
                raise ValueError(f"trace field {name} has two types")
            schema[name] = wanted
    return schema


_SCHEMA = None


def fast_parse(block: bytes, first_line: int, n_lines: int, source_id: str) -> dict[str, pa.Table] | None:
    """Rows per table when every line of ``block`` is a clean record, else None."""
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = _polars_schema()
    try:
        frame = pl.read_ndjson(block, schema=_SCHEMA)
    except Exception:
        return None
    if frame.height != n_lines:
        return None  # blank lines: line numbers would not follow rows
    checks = [(pl.col("v") == 1) & pl.col("type").is_in(list(RECORD_TYPES))]
    # The reader turns an object or list into text for a string field: a wrong type.
    for name, dtype in _SCHEMA.items():
        if dtype == pl.String:
            text = pl.col(name).str
            checks.append(~(text.starts_with("{") | text.starts_with("[")).fill_null(False))
    for rtype, (_, fields) in RECORD_TYPES.items():
        of_type = pl.col("type") == rtype
        for name, _, _, required in fields:
            if required:
                checks.append(~of_type | pl.col(name).is_not_null())
        for column, allowed in _ENUMS.get(rtype, {}).items():
            name = next(n for n, c, _, _ in fields if c == column)
            checks.append(~of_type | pl.col(name).is_in(list(allowed)) | pl.col(name).is_null())
        for _, _, allowed in _RANGES.get(rtype, ()):
            checks.append(~of_type | allowed.fill_null(False))
    if not frame.select(pl.all_horizontal(checks).all()).item():
        return None
    frame = frame.with_columns(
        pl.int_range(first_line, first_line + frame.height, dtype=pl.Int64).alias("line_number")
    )
    tables: dict[str, pa.Table] = {}
    counts = dict(frame["type"].value_counts().iter_rows())
    for rtype, (table, fields) in RECORD_TYPES.items():
        schema = table_schema(table)
        if not counts.get(rtype):
            tables[table] = schema.arrow_schema().empty_table()
            continue
        part = frame if counts[rtype] == frame.height else frame.filter(pl.col("type") == rtype)
        columns = [pl.col(name).alias(column) for name, column, _, _ in fields]
        out = part.select([*columns, pl.col("line_number"), pl.lit(source_id).alias("source_id")])
        if table == "transfers":
            out = out.with_columns(_group_bytes_polars())
        for _, column, kind, _ in fields:
            if kind == "JSON" and out[column].null_count() < out.height:
                encoded = (
                    pl.struct(pl.col(column).alias("g"))
                    .struct.json_encode()
                    .str.slice(5)
                    .str.strip_suffix("}")
                )
                out = out.with_columns(
                    pl.when(pl.col(column).is_null()).then(None).otherwise(encoded).alias(column)
                )
            elif kind == "JSON":
                out = out.with_columns(pl.lit(None, pl.String).alias(column))
        if any(column == "ts" for _, column, _, _ in fields):
            day = (pl.col("ts") * 1000).cast(pl.Int64).cast(pl.Datetime("ms", "UTC")).dt.date()
            out = out.with_columns(day.alias("day"))
        if table == "engines":
            out = out.with_columns(pl.lit("trace").alias("source_kind"))
        tables[table] = schema.conform(out.to_arrow())
    return tables


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
    for _, fields in RECORD_TYPES.values():
        for name, _, _, _ in fields:
            spec[name] = "JSON"
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


# "v" is the number 1 (the fast path reads it as an integer; "1" as text is not v1)
_V1 = f"(json_type(j.v) IN {_NUMBER} AND TRY_CAST(j.v AS DOUBLE) = 1)"
_VALID = f"text IS NOT NULL AND j.type IN ('transfer', 'request', 'engine') AND {_V1}"


def parse_trace(
    con: duckdb.DuckDBPyConnection, lines: list[bytes], first_line: int, source_id: str
) -> tuple[dict[str, pa.Table], pa.Table]:
    """Rows per table and the rejects of ``lines`` (line ``first_line`` is the first).

    Each line is parsed once (``json_transform`` into a struct of JSON fields); only the
    rare bad lines are parsed again, to say what is wrong with them.
    """
    structure = _structure().replace("'", "''")
    con.register("_lines", _lines_table(lines, first_line))
    try:
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE _parsed AS
            SELECT line_number, text, try(json_transform(text, '{structure}')) AS j
            FROM (SELECT line_number, try(decode(raw)) AS text FROM _lines WHERE octet_length(raw) > 0)
            WHERE text IS NULL OR trim(text) <> ''
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
        tables: dict[str, pa.Table] = {}
        for rtype, (table, fields) in RECORD_TYPES.items():
            rows, bad = _project(con, rtype, table, fields, source_id)
            tables[table] = rows
            rejects.append(bad)
    finally:
        con.unregister("_lines")
    return tables, pa.concat_tables(rejects)


def _project(
    con: duckdb.DuckDBPyConnection, rtype: str, table: str, fields: tuple, source_id: str
) -> tuple[pa.Table, pa.Table]:
    values = ", ".join(f"{_typed(name, kind)} AS {column}" for name, column, kind, _ in fields)
    checks = []
    for name, column, kind, required in fields:
        if required:
            checks.append(f"WHEN j.{name} IS NULL THEN 'missing field {name}'")
        want = {"JSON": "list"}.get(kind, kind.lower())
        checks.append(
            f"WHEN j.{name} IS NOT NULL AND {column} IS NULL THEN 'wrong type for {name} (want {want})'"
        )
    for column, allowed in _ENUMS.get(rtype, {}).items():
        listing = ", ".join(f"'{v}'" for v in allowed)
        checks.append(f"WHEN {column} NOT IN ({listing}) THEN 'unknown {column} ' || {column}")
    for name, condition, _ in _RANGES.get(rtype, ()):
        column = next(c for n, c, _, _ in fields if n == name)
        label = "ts (epoch seconds)" if name == "ts" else name
        checks.append(f"WHEN NOT ({condition}) THEN '{label} out of range: ' || {column}")
    reason = "CASE " + " ".join(checks) + " END"
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _typed AS
        SELECT *, {reason} AS reason
        FROM (SELECT line_number, text, j, {values} FROM _parsed WHERE {_VALID} AND j.type = '{rtype}')
        """
    )
    columns = [column for _, column, _, _ in fields]
    day = ", CAST(to_timestamp(ts) AT TIME ZONE 'UTC' AS DATE) AS day" if "ts" in columns else ""
    if table == "engines":
        day += ", 'trace' AS source_kind"
    rows = con.sql(
        f"""
        SELECT {", ".join(columns)}{day}, '{source_id}' AS source_id, line_number
        FROM _typed WHERE reason IS NULL ORDER BY line_number
        """
    ).to_arrow_table()
    if table == "transfers":  # the same sums as the fast path, from the same expressions
        rows = _with_group_bytes(rows)
    bad = con.sql(
        f"SELECT line_number, reason, left(text, {RAW_LIMIT}) AS raw FROM _typed WHERE reason IS NOT NULL"
    ).to_arrow_table()
    return table_schema(table).conform(rows), bad
