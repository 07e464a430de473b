"""vLLM server-log fixtures, generated line by line in the exact shapes vLLM prints.

``vllm_line`` builds one line the way vLLM's formatter does: optional process prefix
(cyan when coloured), the level (coloured by level), the ``MM-DD HH:MM:SS`` stamp and
``[file:line]`` (grey), with the older shape that lacks the opening bracket. A
multi-line message repeats the prefix on every line and ends each but the last with
``\\r``, as vLLM's NewLineFormatter does.
"""

from __future__ import annotations

LEVEL_COLOURS = {"DEBUG": "37", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "35"}
ENGINE_ID = "5b1c9f0e-2a44-4c1e-9d2b-7f3e8a6c1d20"
REMOTE_ID = "a0e3c6d9-81f2-4b57-b0c4-3d9e2f1a6b88"


def vllm_line(
    message: str,
    *,
    level: str = "INFO",
    stamp: str = "04-21 10:02:11",
    where: str = "worker.py:100",
    process: str | None = "Worker_TP0 pid=305",
    colour: bool = False,
    old_shape: bool = False,
) -> str:
    """One log record; a message with newlines becomes several \\r-joined lines."""
    file_part = f"{where}]" if old_shape else f"[{where}]"
    if colour:
        head = (
            f"\x1b[{LEVEL_COLOURS[level]}m{level}\x1b[0m \x1b[90m{stamp}\x1b[0m \x1b[90m{file_part}\x1b[0m "
        )
        prefix = f"\x1b[0;36m({process})\x1b[0;0m " if process else ""
    else:
        head = f"{level} {stamp} {file_part} "
        prefix = f"({process}) " if process else ""
    parts = message.split("\n")
    return "\r\n".join(prefix + head + part for part in parts)


def kv_metrics(n: int, avg_ms: float, mib: float, stamp: str, **kwargs) -> str:
    if n == 0:  # vLLM prints every key as 0 when an interval had failures only
        keys = ("Num successful transfers", "Avg xfer time (ms)", "P90 xfer time (ms)", "Avg post time (ms)",
                "P90 post time (ms)", "Avg MB per transfer", "Throughput (MB/s)", "Avg number of descriptors")  # fmt: skip
        message = "KV Transfer metrics: " + ", ".join(f"{k}=0" for k in keys)
        return vllm_line(message, stamp=stamp, where="metrics.py:103", process="APIServer pid=1", **kwargs)
    message = (
        f"KV Transfer metrics: Num successful transfers={n}, Avg xfer time (ms)={avg_ms}, "
        f"P90 xfer time (ms)={avg_ms * 1.3:.3f}, Avg post time (ms)=0.942, P90 post time (ms)=1.307, "
        f"Avg MB per transfer={mib}, Throughput (MB/s)={mib / avg_ms * 1000:.3f}, Avg number of descriptors=2496.0"
    )
    return vllm_line(message, stamp=stamp, where="metrics.py:103", process="APIServer pid=1", **kwargs)


def decode_log(*, colour: bool = False, era: str = "abort", stamp_day: str = "04-21") -> str:
    """A decode instance's log: startup facts, intervals, a failure with a traceback."""
    d = stamp_day
    lines = [
        vllm_line(
            "Setting attention block size to 400 tokens to ensure that attention page size is >= mamba page size.",
            process="APIServer pid=1",
            where="config.py:281",
            stamp=f"{d} 10:02:11",
            colour=colour,
        ),
        vllm_line(
            "Padding mamba page size by 1.78% to ensure that mamba page size and attention page size are exactly equal.",
            process="APIServer pid=1",
            where="config.py:312",
            stamp=f"{d} 10:02:11",
            colour=colour,
        ),
        vllm_line(f"Initializing NIXL worker {ENGINE_ID}", stamp=f"{d} 10:02:30", colour=colour),
        vllm_line(
            "Add 1 padding layers, may waste at most 4.35% KV cache memory",
            level="WARNING",
            process="EngineCore_DP0 pid=212",
            where="kv_cache_utils.py:1152",
            stamp=f"{d} 10:03:05",
            colour=colour,
        ),
        vllm_line(
            "GPU KV cache size: 4,543,600 tokens, Maximum concurrency for 8,192 tokens per request: 454.36x",
            process="EngineCore_DP0 pid=212",
            where="kv_cache_utils.py:1882",
            stamp=f"{d} 10:03:06",
            colour=colour,
        ),
        vllm_line(
            "Registering KV_Caches. use_mla: False, kv_buffer_device: cpu, use_host_buffer: True",
            stamp=f"{d} 10:03:07",
            colour=colour,
        ),
        vllm_line(
            "Hybrid SSM registration: num_blocks=283975, logical_num_blocks=11359, ratio=25, num_regions=12, "
            "num_descs=3407700, mamba_ssm_size=(18432, 786432), block_len_per_layer={32768}",
            stamp=f"{d} 10:03:07",
            colour=colour,
            old_shape=True,
        ),
        vllm_line("Detected kv cache layout HND", stamp=f"{d} 10:03:07", colour=colour),
        vllm_line("this INFO line is of no interest", stamp=f"{d} 10:03:08", colour=colour),
        vllm_line(
            "NIXL compatibility check passed (hash: 9c4e1f0b7a2d53e8)",
            process="Worker_TP1 pid=306",
            stamp=f"{d} 10:05:12",
            colour=colour,
        ),
        vllm_line(
            "Engine 000: Avg prompt throughput: 1520.5 tokens/s, Avg generation throughput: 412.7 tokens/s, "
            "Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.9%, Prefix cache hit rate: 0.0%",
            process="APIServer pid=1",
            where="loggers.py:236",
            stamp=f"{d} 10:05:21",
            colour=colour,
        ),
        kv_metrics(24, 12.4, 55.922, f"{d} 10:05:21", colour=colour),
        vllm_line(
            "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
            "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%",
            process="APIServer pid=1",
            where="loggers.py:236",
            stamp=f"{d} 10:05:31",
            colour=colour,
        ),
        kv_metrics(0, 0, 0, f"{d} 10:05:31", colour=colour),
        vllm_line(
            "NIXL transfer failure: transfer_failed. Marking blocks as invalid | Context: {'failure_type': "
            "'transfer_failed', 'request_id': 'cmpl-7f2d-0-5e9a0c21', "
            f"'engine_id': '{ENGINE_ID}', 'remote_engine_id': '{REMOTE_ID}', 'remote_request_id': 'cmpl-7f2d-0-c47d', "
            "'remote_host': '10.0.12.7', 'remote_port': 5600, 'num_local_blocks': 12, 'num_remote_blocks': 12, "
            "'local_block_ids_sample': [1021, 1022], 'xfer_state': 'ERR'}\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3/site-packages/vllm/worker.py", line 505, in _pop_done\n'
            "    raise RuntimeError('transfer failed')\n"
            "RuntimeError: transfer failed",
            level="ERROR",
            where="worker.py:505",
            stamp=f"{d} 10:07:44",
            colour=colour,
        ),
        vllm_line(
            "Failing 2 request(s) due to KV load failure (failure_policy=fail, 1024 tokens affected). "
            "Request IDs: {'cmpl-a-0', 'cmpl-b-0'}",
            level="ERROR",
            process="EngineCore_DP0 pid=212",
            where="scheduler.py:900",
            stamp=f"{d} 10:07:45",
            colour=colour,
        ),
        vllm_line(
            "Recovered from KV load failure: 1 request(s) rescheduled (512 tokens affected).",
            level="WARNING",
            process="EngineCore_DP0 pid=212",
            where="scheduler.py:910",
            stamp=f"{d} 10:07:46",
            colour=colour,
        ),
        vllm_line(
            "Declining expired remote read for cmpl-z-0 from engine p-engine-7.",
            level="WARNING",
            stamp=f"{d} 10:07:47",
            colour=colour,
        ),
        vllm_line("something odd happened", level="WARNING", stamp=f"{d} 10:07:48", colour=colour),
    ]
    return "\n".join(lines) + "\n"


def prefill_log(*, era: str = "abort", colour: bool = False, stamp_day: str = "04-21") -> str:
    """A prefill instance's log: expiries in the given era, and an unrecognised read."""
    tail = "within 480 seconds." if era == "abort" else "before lease expired."
    who = "decode" if era == "abort" else "remote"
    lines = [
        vllm_line(
            f"Initializing NIXL worker {REMOTE_ID}",
            process="Worker_TP1 pid=411",
            stamp=f"{stamp_day} 09:00:00",
            colour=colour,
        ),
        vllm_line(
            f"Releasing expired KV blocks for request cmpl-0c5e-0-1b8f which were retrieved by 0 {who} "
            f"worker(s) {tail}",
            level="WARNING",
            process="Worker_TP1 pid=411",
            where="worker.py:1498",
            stamp=f"{stamp_day} 10:08:02",
            colour=colour,
        ),
        vllm_line(
            "Potentially invalid KV blocks for unrecognized request cmpl-0c5e-0-1b8f were retrieved by a "
            "decode worker. They may have expired.",
            level="ERROR",
            process="Worker_TP0 pid=410",
            where="pull_worker.py:402",
            stamp=f"{stamp_day} 10:08:03",
            colour=colour,
        ),
        vllm_line(
            'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            "RuntimeError: NIXL compatibility hash mismatch. Local: abc123, Remote: def456",
            level="ERROR",
            process="Worker_TP0 pid=410",
            where="worker.py:434",
            stamp=f"{stamp_day} 10:09:00",
            colour=colour,
        ),
    ]
    return "\n".join(lines) + "\n"
