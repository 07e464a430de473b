"""One handoff, in full: ``hybridtrace explain REQUEST_ID``.

Everything the store knows about a request — its tokens, every read with its timing and
byte counts, the bytes by cache type, the log lines that name it, its findings, and the
output checks it served —
gathered from the views. The id may be the decode-side or the prefill-side one.
"""

from __future__ import annotations

import json

import duckdb

from hybridtrace.analyze.rules import request_rules
from hybridtrace.analyze.thresholds import install as install_thresholds
from hybridtrace.analyze.thresholds import load as load_thresholds
from hybridtrace.errors import UsageError


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    relation = con.execute(sql, params)
    columns = [d[0] for d in relation.description]
    return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]


# the asked engine, when one is given (the parameter twice: once to test it for null)
_ON_ENGINE = "(CAST(? AS VARCHAR) IS NULL OR {a}engine_id = ?)"


def _matching(alias: str = "") -> str:
    """The rows of the asked request id (either side's), on the asked engine if one is given."""
    a = f"{alias}." if alias else ""
    return f"({a}request_id = ? OR {a}remote_request_id = ?) AND " + _ON_ENGINE.format(a=a)


def explain(
    con: duckdb.DuckDBPyConnection,
    request_id: str,
    *,
    engine_id: str | None = None,
    config: str | None = None,
) -> dict:
    """Everything about one request. An id that several decode engines used (ids are only
    unique per engine) needs ``engine_id``: two engines' handoffs are never summed."""
    install_thresholds(con, load_thresholds(config))
    matches = _matching()
    params = [request_id, request_id, engine_id, engine_id]
    engines = [
        row[0]
        for row in con.execute(
            f"SELECT engine_id FROM requests WHERE {matches} "
            f"UNION SELECT engine_id FROM transfers WHERE {matches} ORDER BY 1",
            params + params,
        ).fetchall()
    ]
    if len(engines) > 1:
        raise UsageError(
            f"request {request_id!r} is on {len(engines)} decode engines ({', '.join(map(str, engines))}): "
            "say which with --engine"
        )
    engine_id = engines[0] if engines else engine_id
    params = [request_id, request_id, engine_id, engine_id]
    requests = _rows(
        con, f"SELECT * EXCLUDE (source_id, line_number, day) FROM requests WHERE {matches}", params
    )
    reads = _rows(
        con,
        f"""
        SELECT t.rank, t.remote_rank, t.remote_engine_id, t.status, t.ts AS post_ts,
               t.post_s, t.xfer_s,
               t.ts + t.xfer_s AS done_ts, t.descriptors, t.transported_bytes, b.expected_bytes,
               b.logical_bytes, b.reserved_bytes, b.excess_bytes, t.staging_bytes, t.link,
               t.transported_bytes / nullif(t.xfer_s, 0) / 1e9 AS effective_gb_s
        FROM transfers t
        LEFT JOIN transfer_bytes b USING (engine_id, request_id, rank, remote_engine_id, remote_rank, ts)
        WHERE {_matching("t")}
        ORDER BY t.rank, t.remote_rank, t.ts
        """,
        params,
    )
    if not requests and not reads:
        # a failure line names both sides' ids: the prefill-side id finds it too
        events = _rows(
            con,
            "SELECT count(*) AS n FROM log_events WHERE request_id = ? "
            "OR json_extract_string(details, '$.remote_request_id') = ?",
            [request_id, request_id],
        )
        if not events[0]["n"]:
            where = f" on {engine_id}" if engine_id else ""
            raise UsageError(
                f"no request {request_id!r}{where} in the store (give a decode-side or prefill-side id)"
            )
    decode_id = requests[0]["request_id"] if requests else request_id
    remote_id = requests[0]["remote_request_id"] if requests else None
    # The bytes of the successful reads, as request_bytes sums them: a failed read moved
    # nothing the handoff needed.
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
        FROM transfer_bytes
        WHERE request_id = ? AND status = 'ok' AND """ + _ON_ENGINE.format(a="") + """
        """,
        [decode_id, engine_id, engine_id],
    )
    events = _rows(
        con,
        "SELECT ts, engine_id, process, level, kind, message FROM log_events "
        "WHERE request_id IN (?, ?) OR json_extract_string(details, '$.remote_request_id') IN (?, ?) "
        "ORDER BY ts",
        [decode_id, remote_id or decode_id, request_id, remote_id or request_id],
    )
    findings = []
    scoped = "request_id = ? AND " + _ON_ENGINE.format(a="")
    # the rules whose findings name a request: the others' never name this one
    for rule in request_rules():
        hits = _rows(con, f"SELECT * FROM {rule.view} WHERE {scoped}", [decode_id, engine_id, engine_id])
        for row in hits:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else {}
            findings.append(row)
    # the output checks that this handoff served (hybridtrace verify), by their P/D answer id
    checks = _rows(
        con,
        "SELECT run_id, prompt_index, prompt_id, status, first_divergence, tokens_compared, control_top_gap, "
        "max_logprob_diff, pd_response_id, ts FROM verification_handoffs WHERE request_id = ? AND "
        + _ON_ENGINE.format(a="") + " ORDER BY ts",
        [decode_id, engine_id, engine_id],
    )
    critical = max((r["xfer_s"] for r in reads if r["status"] == "ok"), default=None)
    return {
        "request": requests[0] if requests else {"request_id": request_id},
        "critical_path_s": critical,
        "reads": reads,
        "bytes_by_cache_type": by_type[0] if by_type else {},
        "log_events": events,
        "findings": findings,
        "verifications": checks,
    }
