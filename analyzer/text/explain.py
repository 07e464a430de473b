"""``hybridtrace explain``: one handoff (request, reads, bytes by cache type, log lines, findings) as text."""

from __future__ import annotations

from hybridtrace.output import bytes_cell, to_pairs, to_table
from hybridtrace.units import format_duration

_TOKEN_FIELDS = ("prompt_tokens", "cached_tokens", "missing_tokens", "transferred_tokens", "reused_tokens",
                 "recomputed_tokens", "boundary_tokens", "state_blocks")  # fmt: skip
_READ_BYTES = ("transported", "expected", "excess")
_CACHE_BYTES = ("logical", "expected", "reserved", "transported")


def explain_text(result: dict) -> str:
    """What ``explain --format json`` holds, as label/value lines and tables."""
    request = result["request"]
    if request.get("engine_id") is not None:
        pairs = [
            (
                "request",
                f"{request.get('request_id')} on {request.get('engine_id')} (prefill "
                f"{request.get('remote_engine_id') or '?'}: {request.get('remote_request_id') or '?'})",
            ),
            ("status", str(request.get("status"))),
            (
                "tokens",
                ", ".join(f"{k.replace('_tokens', '')} {request[k]}" for k in _TOKEN_FIELDS if k in request),
            ),
        ]
    else:  # only log lines name it: say so rather than print empty fields
        pairs = [("request", f"{request.get('request_id')} (no request record: only the log lines below)")]
    if result["critical_path_s"] is not None:
        prefill = request.get("prefill_s")
        vs = f" (prefill here: {format_duration(prefill)})" if prefill is not None else ""
        pairs.append(("critical path", f"{format_duration(result['critical_path_s'])}{vs}"))
    parts = [to_pairs(pairs)]
    reads = [
        {
            "rank": r["rank"],
            "from": f"{r['remote_engine_id']}:{r['remote_rank']}",
            "status": r["status"],
            "post": format_duration(r["post_s"]),
            "xfer": format_duration(r["xfer_s"]),
            "descs": r["descriptors"],
            "transported": bytes_cell(r["transported_bytes"]),
            "expected": bytes_cell(r["expected_bytes"]),
            "excess": bytes_cell(r["excess_bytes"]),
            "GB/s": round(r["effective_gb_s"], 2) if r["effective_gb_s"] else None,
        }
        for r in result["reads"]
    ]
    if reads:
        numbers = ["rank", "descs", *_READ_BYTES, "GB/s"]
        parts.append("\nReads\n\n" + to_table(reads, right_align=numbers))
    types = result["bytes_by_cache_type"]
    if types and types.get("logical_attention") is not None:
        rows = [
            {"cache": name, **{k: bytes_cell(types[f"{k}_{name}"]) for k in _CACHE_BYTES}}
            for name in ("attention", "state")
        ]
        title = "\nBytes by cache type (successful reads)\n\n"
        parts.append(title + to_table(rows, right_align=_CACHE_BYTES))
    if result["log_events"]:
        parts.append("\nLog lines\n\n" + to_table(
            [{k: e[k] for k in ("engine_id", "level", "kind", "message")} for e in result["log_events"]]
        ))  # fmt: skip
    findings = [
        {"kind": f["kind"], "severity": f["severity"], "message": f["message"]} for f in result["findings"]
    ]
    parts.append("\nFindings\n\n" + (to_table(findings) if findings else "none"))
    return "\n".join(parts)
