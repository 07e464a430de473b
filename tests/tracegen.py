"""Connector-trace fixtures, generated: a small P/D deployment's records as JSON lines.

Records are built by ``record``, which takes field names from the trace v1 definition
(``schemas/trace_v1.toml``) and puts them in its order, so a fixture cannot carry a
field the format does not have.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from hybridtrace import trace_v1

_GROUP_KEYS = tuple(g.name for g in trace_v1.GROUP_FIELDS)


def record(record_type: str, **fields: object) -> dict:
    """One ``record_type`` record with ``fields`` in the definition's order (None: left out)."""
    names = trace_v1.record_type(record_type).names
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ValueError(f"trace v1 {record_type} records have no field {', '.join(unknown)}")
    return {"type": record_type, "v": 1, **{n: fields[n] for n in names if fields.get(n) is not None}}


def group(**keys: object) -> dict:
    """One KV-cache group entry, keys in the definition's order."""
    unknown = sorted(set(keys) - set(_GROUP_KEYS))
    if unknown:
        raise ValueError(f"trace v1 group entries have no key {', '.join(unknown)}")
    return {k: keys[k] for k in _GROUP_KEYS if k in keys}


def engine_record(engine_id: str, role: str, tp: int, ts: float = 1764400000.0, **extra: object) -> dict:
    """An engine's record; ``extra`` sets other fields (e.g. the extensions rank, pid, agent_name)."""
    fields: dict[str, object] = {
        "ts": ts,
        "engine_id": engine_id,
        "role": role,
        "model": "nvidia/NVIDIA-Nemotron-Nano-12B-v2",
        "tp_size": tp,
        "kv_cache_dtype": "bfloat16",
        "kv_buffer_device": "cuda",
        "groups": [
            group(group=0, kind="attention", layers=6, block_tokens=672, page_bytes=688128),
            group(group=1, kind="mamba", layers=6, padding_layers=0, page_bytes=688128, state_bytes=673792),
        ],
    }
    return record("engine", **{**fields, **extra})


def transfer_records(
    n_requests: int, tp: int = 2, seed: int = 0, start_ts: float = 1764400100.0
) -> list[dict]:
    rng = random.Random(seed)
    records: list[dict] = []
    for i in range(n_requests):
        ts = start_ts + i * 0.5
        rid = f"cmpl-{seed}-{i}"
        missing = rng.randint(100, 8000)
        for rank in range(tp):
            records.append(
                record(
                    "transfer",
                    ts=ts + rank * 1e-4,
                    request_id=rid,
                    remote_request_id=f"p-{rid}",
                    engine_id="decode-0",
                    remote_engine_id="prefill-0",
                    rank=rank,
                    tp_size=tp,
                    remote_rank=rank,
                    remote_tp_size=tp,
                    status="ok",
                    post_s=0.0005,
                    xfer_s=0.002 + rng.random() * 0.01,
                    bytes=missing * 3072 + 9433088,
                    descriptors=100,
                    staging_bytes=0,
                    link="rdma:mlx5_0",
                )
            )
        records.append(
            record(
                "request",
                ts=ts + 0.05,
                request_id=rid,
                remote_request_id=f"p-{rid}",
                engine_id="decode-0",
                remote_engine_id="prefill-0",
                prompt_tokens=missing + 1,
                cached_tokens=0,
                missing_tokens=missing,
                transferred_tokens=missing,
                reused_tokens=missing,
                recomputed_tokens=1,
                state_blocks=1,
                boundary_tokens=missing,
                status="ok",
            )
        )
    return records


def release_record(engine_id: str, request_id: str, ts: float, **extra: object) -> dict:
    """A prefill engine's blocks of ``request_id`` (its own id) released when the lease expired."""
    return record("release", ts=ts, engine_id=engine_id, request_id=request_id, reason="expired", **extra)


def dropped_record(engine_id: str, records: int, ts: float, **extra: object) -> dict:
    """A trace writer's count of records it dropped since its previous count."""
    return record("dropped", ts=ts, engine_id=engine_id, records=records, **extra)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
