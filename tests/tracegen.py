"""Connector-trace fixtures, generated: a small P/D deployment's records as JSON lines."""

from __future__ import annotations

import json
import random
from pathlib import Path


def engine_record(engine_id: str, role: str, tp: int, ts: float = 1764400000.0) -> dict:
    return {
        "type": "engine",
        "v": 1,
        "ts": ts,
        "engine_id": engine_id,
        "role": role,
        "model": "nvidia/NVIDIA-Nemotron-Nano-12B-v2",
        "tp_size": tp,
        "kv_cache_dtype": "bfloat16",
        "kv_buffer_device": "cuda",
        "groups": [
            {"group": 0, "kind": "attention", "layers": 6, "block_tokens": 672, "page_bytes": 688128},
            {
                "group": 1,
                "kind": "mamba",
                "layers": 6,
                "padding_layers": 0,
                "page_bytes": 688128,
                "state_bytes": 673792,
            },
        ],
    }


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
                {
                    "type": "transfer",
                    "v": 1,
                    "ts": ts + rank * 1e-4,
                    "request_id": rid,
                    "remote_request_id": f"p-{rid}",
                    "engine_id": "decode-0",
                    "remote_engine_id": "prefill-0",
                    "rank": rank,
                    "tp_size": tp,
                    "remote_rank": rank,
                    "remote_tp_size": tp,
                    "status": "ok",
                    "post_s": 0.0005,
                    "xfer_s": 0.002 + rng.random() * 0.01,
                    "bytes": missing * 3072 + 9433088,
                    "descriptors": 100,
                    "staging_bytes": 0,
                    "link": "rdma:mlx5_0",
                }
            )
        records.append(
            {
                "type": "request",
                "v": 1,
                "ts": ts + 0.05,
                "request_id": rid,
                "remote_request_id": f"p-{rid}",
                "engine_id": "decode-0",
                "remote_engine_id": "prefill-0",
                "prompt_tokens": missing + 1,
                "cached_tokens": 0,
                "missing_tokens": missing,
                "transferred_tokens": missing,
                "reused_tokens": missing,
                "recomputed_tokens": 1,
                "state_blocks": 1,
                "boundary_tokens": missing,
                "status": "ok",
            }
        )
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
