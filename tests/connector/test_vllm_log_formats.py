"""vLLM 0.33's own logging writes the text and JSON logs that ingest reads alike.

A child process configures vLLM's logging as ``--logging-config.formatter json`` and as
the default text formatter do (``vllm.logger.configure_logging``), then logs its NIXL
connector's transfer statistics through vLLM's own ``KVConnectorLogging``: the lines are
vLLM's, not copies. Each log, bare and inside envelopes, must give the same intervals.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store
from tests import envelopegen

pytestmark = [pytest.mark.connector, pytest.mark.vllm]

# Four stats intervals, one with a failed transfer, logged once per formatter by one process.
_EMIT = textwrap.dedent(
    """
    import types

    from vllm.config import KVTransferConfig
    from vllm.config.logging import LoggingConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    from vllm.logger import configure_logging

    for formatter in ("json", "text"):
        configure_logging(LoggingConfig(formatter=formatter))
        log = KVConnectorLogging(KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both"))
        for i in range(4):
            stats = NixlKVConnectorStats()
            for k in range(i + 1):
                telemetry = types.SimpleNamespace(
                    xferDuration=9862 + 100 * k, postDuration=5693, totalBytes=70_000_000 + k, descCount=56
                )
                stats.record_transfer(telemetry)
            if i == 2:
                stats.record_failed_transfer()
            log.observe(stats.data)
            log.log()
    """
)


@pytest.fixture(scope="module")
def vllm_logs() -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", _EMIT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if "KV Transfer metrics" in line]
    out = {"json": [line for line in lines if line.startswith("{")]}
    out["text"] = [line for line in lines if not line.startswith("{")]
    assert len(out["json"]) == 4 and len(out["text"]) == 4, done.stdout[-2000:]
    return out


# Where a row was read, and the time and process of the line, differ between the runs.
_COMPARED = (
    "transfers, failed_transfers, expired_requests, avg_xfer_s, p90_xfer_s, avg_post_s, p90_post_s, "
    "avg_mib_per_transfer, throughput_mib_s, avg_descriptors, transported_bytes, engine_id, source_kind"
)


def _intervals(tmp_path: Path, name: str, text: str) -> list[tuple]:
    path = tmp_path / name / "decode-0" / "vllm.log"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    ingest([tmp_path / name], tmp_path / f"{name}-store", year=2026)
    con = Store(tmp_path / f"{name}-store").connect()
    return con.sql(f"SELECT {_COMPARED} FROM intervals ORDER BY end_ts, transfers").fetchall()


def test_vllms_json_and_text_logs_give_the_same_intervals(tmp_path: Path, vllm_logs: dict) -> None:
    record = json.loads(vllm_logs["json"][0])
    # the JSON shape as vLLM 0.33 writes it
    fields = {"asctime", "levelname", "name", "process", "processName", "message", "vllm_process_name"}
    assert fields <= set(record)
    text = _intervals(tmp_path, "text", "\n".join(vllm_logs["text"]) + "\n")
    assert len(text) == 4 and [row[0] for row in text] == [1, 2, 3, 4]
    assert _intervals(tmp_path, "json", "\n".join(vllm_logs["json"]) + "\n") == text
    for kind in ("cri", "docker", "fluentbit", "loki"):
        wrapped = envelopegen.WRAPPERS[kind](vllm_logs["json"])
        assert _intervals(tmp_path, f"json-{kind}", wrapped) == text, kind
        wrapped = envelopegen.WRAPPERS[kind](vllm_logs["text"])
        assert _intervals(tmp_path, f"text-{kind}", wrapped) == text, kind
