"""Peak memory of `hybridtrace ingest` on one input object of each format's worst shape.

Each object holds one value of tens of megabytes where a record holds a few hundred
bytes: a trace record's text field, a log line, a Prometheus label value (backslash
escapes, the costliest shape for the label pattern), a config.json value. The ingest runs
in a child process whose peak resident memory the kernel reports when it exits (the
rusage of that one child); it must stay under 1 GiB. Nothing here times anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loggen import ENGINE_ID, kv_metrics, vllm_line
from tracegen import engine_record, transfer_records

from hybridtrace.store import Store

HUGE = 48 << 20  # more than a read chunk (32 MiB), so the value spans chunks
GIB = 1 << 30


def _trace(path: Path) -> None:
    records = [engine_record("decode-0", "decode", 2), *transfer_records(2)]
    big = {**records[1], "request_id": "big", "link": "x" * HUGE}
    path.write_text("\n".join(json.dumps(r) for r in [*records, big, *transfer_records(1, seed=9)]) + "\n")


def _log(path: Path) -> None:
    lines = [
        vllm_line(f"Initializing NIXL worker {ENGINE_ID}"),
        vllm_line("a warning " + "w" * HUGE, level="WARNING"),
        kv_metrics(24, 12.4, 55.922, "04-21 10:05:21"),
    ]
    path.write_text("\n".join(lines) + "\n")


def _log_without_newline(path: Path) -> None:
    # the huge line is the last one and has no newline: the reader holds it as a tail
    path.write_text(vllm_line(f"Initializing NIXL worker {ENGINE_ID}") + "\n" + vllm_line("x" * HUGE))


def _prometheus(path: Path) -> None:
    lines = [
        "# TYPE vllm:nixl_num_failed_transfers_total counter",
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1',
        'vllm:nixl_num_failed_transfers_total{engine="1",model_name="' + "\\\\" * (HUGE // 2) + '"} 1',
        'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 1',
    ]
    path.write_text("\n".join(lines) + "\n")


def _config(path: Path) -> None:
    from hybridtrace.model import load_config

    config, _ = load_config("nemotron-nano-12b-v2")
    path.write_text(json.dumps({**config, "notes": "n" * HUGE}))


SHAPES = {
    "trace.jsonl": (_trace, "connector_trace"),
    "vllm.log": (_log, "vllm_log"),
    "tail.log": (_log_without_newline, "vllm_log"),
    "metrics.prom": (_prometheus, "prometheus"),
    "config.json": (_config, "model_config"),
}


def _peak_rss(command: list[str]) -> tuple[int, int]:
    """(exit code, peak resident bytes) of ``command`` run as a child of this process."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        sys.stderr.write(process.stderr.read().decode(errors="replace") if process.stderr else "")
    return process.returncode, usage.ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in kilobytes on Linux only")
@pytest.mark.parametrize("name", list(SHAPES))
def test_one_huge_object_of_each_format_stays_under_a_gib(tmp_path, name):
    make, fmt = SHAPES[name]
    folder = tmp_path / "in" / "decode-0"
    folder.mkdir(parents=True)
    make(folder / name)
    old = 1_700_000_000  # long quiet: a last line without its newline is read
    os.utime(folder / name, (old, old))
    code, peak = _peak_rss(
        [sys.executable, "-m", "hybridtrace", "ingest", str(tmp_path / "in"), "--store", str(tmp_path / "s")]
    )
    assert code == 0
    assert peak < GIB, f"{name}: peak RSS {peak / 2**20:.0f} MiB"
    con = Store(tmp_path / "s").connect()
    assert con.sql("SELECT format FROM sources").fetchall() == [(fmt,)]
