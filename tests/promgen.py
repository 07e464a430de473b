"""Prometheus exposition fixtures: vLLM's NIXL histograms and counters, as scraped."""

from __future__ import annotations

XFER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
POST_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
BYTE_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]
DESC_BUCKETS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000]


def _histogram(name: str, bounds: list[float], values: list[float], labels: str) -> list[str]:
    lines = [f"# HELP {name} histogram", f"# TYPE {name} histogram"]
    for bound in bounds:
        count = sum(1 for v in values if v <= bound)
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(len(values))}')
    lines.append(f"{name}_count{{{labels}}} {float(len(values))}")
    lines.append(f"{name}_sum{{{labels}}} {float(sum(values))}")
    return lines


def scrape(transfers: list[tuple[float, float, int, int]], failed: int = 0, expired: int = 0,
           timestamp_ms: int | None = None) -> str:  # fmt: skip
    """A cumulative snapshot of every (xfer_s, post_s, bytes, descriptors) so far."""
    labels = 'engine="0",model_name="nemotron-nano"'
    lines = ["# a vLLM /metrics scrape", 'python_gc_objects_collected_total{generation="0"} 123.0']
    lines += _histogram("vllm:nixl_xfer_time_seconds", XFER_BUCKETS, [t[0] for t in transfers], labels)
    lines += _histogram("vllm:nixl_post_time_seconds", POST_BUCKETS, [t[1] for t in transfers], labels)
    lines += _histogram("vllm:nixl_bytes_transferred", BYTE_BUCKETS, [t[2] for t in transfers], labels)
    lines += _histogram("vllm:nixl_num_descriptors", DESC_BUCKETS, [t[3] for t in transfers], labels)
    lines.append(f"vllm:nixl_num_failed_transfers_total{{{labels}}} {float(failed)}")
    lines.append(f"vllm:nixl_num_kv_expired_reqs_total{{{labels}}} {float(expired)}")
    lines.append(f'vllm:prompt_tokens_by_source_total{{{labels},source="external_kv_transfer"}} 35988.0')
    if timestamp_ms is not None:
        lines = [f"{line} {timestamp_ms}" if line and not line.startswith("#") else line for line in lines]
    return "\n".join(lines) + "\n"
