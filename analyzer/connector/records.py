"""Trace v1 record builders: plain facts in, one record (a dict) out.

They run on the writer's thread, never on the engine's. Each takes only values a
connector saw (no vLLM objects), so they are tested without vLLM. A fact the connector
could not see is null, never guessed; the fields and
their rules are those of ``schemas/trace_v1.toml``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

V = 1


def _record(kind: str, fields: dict) -> dict:
    # An unknown fact is written as null (which trace v1 reads as absent): filtering the
    # Nones out costs more than building the record, on the writer's one thread.
    return {"type": kind, "v": V, **fields}


def engine_record(
    *,
    ts: float,
    engine_id: str,
    role: str,
    tp_size: int,
    rank: int | None,
    model: str | None,
    kv_cache_dtype: str | None,
    kv_buffer_device: str | None,
    use_host_buffer: bool | None,
    agent_name: str | None,
    groups: list[dict],
    **optional: object,
) -> dict:
    """One process's ``engine`` record: identity, cache settings and KV-cache groups."""
    return _record(
        "engine",
        {
            "ts": ts,
            "engine_id": engine_id,
            "role": role,
            "model": model,
            "tp_size": tp_size,
            "rank": rank,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "agent_name": agent_name,
            "kv_cache_dtype": kv_cache_dtype,
            "kv_buffer_device": kv_buffer_device,
            "use_host_buffer": use_host_buffer,
            "groups": groups,
            **optional,
        },
    )


def group_split(
    per_group: dict[int, tuple[int, int, int]],
    unplaced: int,
    groups: Iterable[tuple[int, str, int]],
    total_bytes: int | None,
) -> tuple[list[dict], bool]:
    """A read's blocks, bytes and descriptors per KV-cache group.

    ``per_group`` maps a group to (distinct physical blocks, bytes, descriptors) of the
    descriptors the read posted in it; ``unplaced`` counts those no group of the request
    holds; ``groups`` lists (group, kind, physical blocks per logical block). The split is
    exact when every descriptor was placed and the bytes add up to what NIXL reported.
    """
    out = []
    for group, kind, per_logical in groups:
        if group not in per_group:
            continue
        physical, nbytes, descriptors = per_group[group]
        out.append({"group": group, "kind": kind, "blocks": -(-physical // max(per_logical, 1)),
                    "bytes": nbytes, "descriptors": descriptors})
    exact = (unplaced == 0 and total_bytes is not None
             and sum(nbytes for _, nbytes, _ in per_group.values()) == total_bytes)
    return out, exact


def transfer_record(
    *,
    ts: float,
    request_id: str | None,
    remote_request_id: str | None,
    engine_id: str,
    remote_engine_id: str | None,
    rank: int,
    tp_size: int,
    remote_rank: int | None,
    remote_tp_size: int | None,
    status: str,
    post_s: float | None,
    xfer_s: float | None,
    transported_bytes: int | None,
    descriptors: int | None,
    staging_bytes: int | None,
    groups: list[dict] | None = None,
    groups_exact: bool | None = None,
    remote_agent_name: str | None = None,
    link: str | None = None,
) -> dict:
    """One NIXL read of one decode rank from one prefill rank."""
    # the busiest record: built as one literal (no second dict), on the writer's thread
    return {
        "type": "transfer",
        "v": V,
        "ts": ts,
        "request_id": request_id,
        "remote_request_id": remote_request_id,
        "engine_id": engine_id,
        "remote_engine_id": remote_engine_id,
        "rank": rank,
        "tp_size": tp_size,
        "remote_rank": remote_rank,
        "remote_tp_size": remote_tp_size,
        "status": status,
        "post_s": post_s,
        "xfer_s": xfer_s,
        "bytes": transported_bytes,
        "descriptors": descriptors,
        "staging_bytes": staging_bytes,
        "groups": groups or None,
        "groups_exact": groups_exact if groups else None,
        "remote_agent_name": remote_agent_name,
        "link": link,
    }


def request_record(**fields: object) -> dict:
    """One decode-side request once its KV arrived or failed (fields as trace v1 names them)."""
    return _record("request", fields)


def release_record(
    *, ts: float, engine_id: str, rank: int | None, request_id: str, reason: str = "expired"
) -> dict:
    """Prefill side: a request's blocks released because the decoder's lease ran out."""
    fields = {"ts": ts, "engine_id": engine_id, "rank": rank, "request_id": request_id, "reason": reason}
    return _record("release", fields)


def dropped_record(engine_id: str, rank: int | None, pid: int, records: int) -> dict:
    """How many records the writer dropped (its queue was full) since its last such record."""
    import time

    return _record(
        "dropped", {"ts": time.time(), "engine_id": engine_id, "rank": rank, "pid": pid, "records": records}
    )
