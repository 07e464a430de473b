"""One handoff, in full: ``hybridtrace explain REQUEST_ID``.

Everything the store knows about a request — its tokens, every read with its timing and
byte counts, the bytes by cache type, the log lines that name it, and its findings —
gathered from the views. The id may be the decode-side or the prefill-side one.
"""

from __future__ import annotations

import json

import duckdb

from hybridtrace.analyze import KINDS
from hybridtrace.analyze.thresholds import install as install_thresholds
from hybridtrace.analyze.thresholds import load as load_thresholds
from hybridtrace.errors import UsageError


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    relation = con.execute(sql, params)
    columns = [d[0] for d in relation.description]
    return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]


def explain(con: duckdb.DuckDBPyConnection, request_id: str, *, config: str | None = None) -> dict:
    install_thresholds(con, load_thresholds(config))
    requests = _rows(
        con,
        "SELECT * EXCLUDE (source_id, line_number, day) FROM requests "
        "WHERE request_id = ? OR remote_request_id = ?",
        [request_id, request_id],
    )
    reads = _rows(
        con,
        """
        SELECT t.rank, t.remote_rank, t.remote_engine_id, t.status, t.ts AS post_ts,
               t.post_s, t.xfer_s,
               t.ts + t.xfer_s AS done_ts, t.descriptors, t.transported_bytes, b.expected_bytes,
               b.logical_bytes, b.reserved_bytes, b.excess_bytes, t.staging_bytes, t.link,
               t.transported_bytes / nullif(t.xfer_s, 0) / 1e9 AS effective_gb_s
        FROM transfers t
        LEFT JOIN transfer_bytes b USING (engine_id, request_id, rank, remote_engine_id, remote_rank, ts)
        WHERE t.request_id = ? OR t.remote_request_id = ?
        ORDER BY t.rank, t.remote_rank
        """,
        [request_id, request_id],
    )
    if not requests and not reads:
        events = _rows(con, "SELECT count(*) AS n FROM log_events WHERE request_id = ?", [request_id])
        if not events[0]["n"]:
            raise UsageError(
                f"no request {request_id!r} in the store (give a decode-side or prefill-side id)"
            )
    decode_id = requests[0]["request_id"] if requests else request_id
    remote_id = requests[0]["remote_request_id"] if requests else None
    by_type = _rows(
        con,
        """
        SELECT sum(logical_attention_bytes) AS logical_attention,
               sum(logical_state_bytes) AS logical_state,
               sum(expected_attention_bytes) AS expected_attention,
               sum(expected_state_bytes) AS expected_state,
               sum(expected_attention_bytes) AS reserved_attention,
               sum(reserved_state_bytes) AS reserved_state,
               sum(attention_transported_bytes) AS transported_attention,
               sum(state_transported_bytes) AS transported_state
        FROM transfer_bytes WHERE request_id = ?
        """,
        [decode_id],
    )
    events = _rows(
        con,
        "SELECT ts, engine_id, process, level, kind, message FROM log_events "
        "WHERE request_id IN (?, ?) ORDER BY ts",
        [decode_id, remote_id or decode_id],
    )
    findings = []
    for kind in KINDS:
        for row in _rows(con, f"SELECT * FROM finding_{kind} WHERE request_id = ?", [decode_id]):
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else {}
            findings.append(row)
    critical = max((r["xfer_s"] for r in reads if r["status"] == "ok"), default=None)
    return {
        "request": requests[0] if requests else {"request_id": request_id},
        "critical_path_s": critical,
        "reads": reads,
        "bytes_by_cache_type": by_type[0] if by_type else {},
        "log_events": events,
        "findings": findings,
    }
