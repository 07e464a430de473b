"""Connector trace v1 (JSON Lines) → ``transfers``, ``requests``, ``engines`` rows.

Parsing is vectorised in DuckDB: lines arrive as one binary column, are decoded and
validated as JSON in bulk, and each record type is projected with ``json_transform``.
A record is rejected (never dropped) when its bytes are not UTF-8, it is not a JSON
object, its ``type``/``v`` is unknown, a required field is missing, or a field has the
wrong type. Unknown extra fields are ignored.
"""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from hybridtrace.schema import table_schema

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
_ENUMS = {
    "transfer": {"status": ("ok", "failed", "expired")},
    "request": {"status": ("ok", "failed", "expired", "recomputed")},
    "engine": {"role": ("prefill", "decode")},
}


def looks_like_trace(head: bytes) -> bool:
    """True when the first non-blank line is a v1 trace record."""
    for line in head.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return False
        return isinstance(record, dict) and record.get("v") == 1 and record.get("type") in RECORD_TYPES
    return False


def _structure(fields: tuple) -> str:
    spec = {name: ("JSON" if kind == "JSON" else kind) for name, _, kind, _ in fields}
    return json.dumps(spec)


def _lines_table(lines: list[bytes], first_line: int) -> pa.Table:
    return pa.table(
        {
            "line_number": pa.array(range(first_line, first_line + len(lines)), type=pa.int64()),
            "raw": pa.array(lines, type=pa.binary()),
        }
    )


def parse_trace(
    con: duckdb.DuckDBPyConnection, lines: list[bytes], first_line: int, source_id: str
) -> tuple[dict[str, pa.Table], pa.Table]:
    """Rows per table and the rejects of ``lines`` (line ``first_line`` is the first)."""
    con.register("_lines", _lines_table(lines, first_line))
    try:
        con.sql(
            """
            CREATE OR REPLACE TEMP TABLE _decoded AS
            SELECT line_number, raw, try(decode(raw)) AS text
            FROM _lines
            WHERE length(trim(CAST(raw AS VARCHAR))) > 0
            """
        )
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _records AS
            SELECT line_number, raw, text,
                   CASE WHEN text IS NULL THEN 'invalid UTF-8'
                        WHEN NOT json_valid(text) THEN 'not valid JSON'
                        WHEN json_type(text) <> 'OBJECT' THEN 'not a JSON object'
                        WHEN json_extract(text, '$.v') IS NULL THEN 'no "v" field'
                        WHEN try_cast(json_extract_string(text, '$.v') AS INTEGER) IS DISTINCT FROM 1
                             THEN 'unsupported trace version ' || json_extract_string(text, '$.v')
                        WHEN json_extract_string(text, '$.type') IS NULL THEN 'no "type" field'
                        WHEN json_extract_string(text, '$.type') NOT IN ('transfer', 'request', 'engine')
                             THEN 'unknown record type ' || json_extract_string(text, '$.type')
                   END AS reason,
                   CASE WHEN text IS NOT NULL AND json_valid(text) AND json_type(text) = 'OBJECT'
                        THEN json_extract_string(text, '$.type') END AS rtype
            FROM _decoded
            """
        )
        rejects = [
            con.sql(
                f"""
                SELECT line_number, reason, left(coalesce(text, CAST(raw AS VARCHAR)), {RAW_LIMIT}) AS raw
                FROM _records WHERE reason IS NOT NULL
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
    structure = _structure(fields).replace("'", "''")
    checks = []
    for name, _, kind, required in fields:
        present = f"(json_extract(text, '$.{name}') IS NOT NULL AND json_type(text, '$.{name}') <> 'NULL')"
        if required:
            checks.append(f"WHEN NOT {present} THEN 'missing field {name}'")
        if kind != "JSON":
            checks.append(
                f"WHEN {present} AND {name} IS NULL THEN 'wrong type for {name} (want {kind.lower()})'"
            )
        else:
            not_list = f"json_type(text, '$.{name}') <> 'ARRAY'"
            checks.append(f"WHEN {present} AND {not_list} THEN 'wrong type for {name} (want list)'")
    for column, allowed in _ENUMS.get(rtype, {}).items():
        listing = ", ".join(f"'{v}'" for v in allowed)
        checks.append(
            f"WHEN {column} IS NOT NULL AND {column} NOT IN ({listing}) THEN 'unknown {column} ' || {column}"
        )
    reason = "CASE " + " ".join(checks) + " END"
    con.sql(
        f"""
        CREATE OR REPLACE TEMP TABLE _typed AS
        SELECT *, {reason} AS reason
        FROM (SELECT line_number, text, unnest(json_transform(text, '{structure}'))
              FROM _records WHERE reason IS NULL AND rtype = '{rtype}')
        """
    )
    selects = []
    for name, column, kind, _ in fields:
        expr = f"CAST({name} AS VARCHAR)" if kind == "JSON" else name
        selects.append(f"{expr} AS {column}")
    if any(f[1] == "ts" for f in fields):
        selects.append("CAST(to_timestamp(ts) AT TIME ZONE 'UTC' AS DATE) AS day")
    rows = con.sql(
        f"""
        SELECT {", ".join(selects)}, '{source_id}' AS source_id, line_number
        FROM _typed WHERE reason IS NULL ORDER BY line_number
        """
    ).to_arrow_table()
    bad = con.sql(
        f"SELECT line_number, reason, left(text, {RAW_LIMIT}) AS raw FROM _typed WHERE reason IS NOT NULL"
    ).to_arrow_table()
    return table_schema(table).conform(rows), bad
