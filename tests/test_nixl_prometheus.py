"""NIXL's own Prometheus exporters: per-agent intervals, mapped to engine and rank.

The scrapes are written as NIXL's `prometheus_mp` exporter serves them (one process
serving every rank's agents, labels `hostname`, `agent_name`, `pid`, `agent_instance`,
`local_rank`; names and buckets as ../shared/formats/nixl-telemetry.md §2 gives them).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

T0 = datetime(2026, 12, 1, 19, 0, 0, tzinfo=UTC).timestamp()
BUCKETS_US = [10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
              1000000, 5000000, 10000000]  # fmt: skip


def _agent_series(labels: str, rx: int, reads: list[tuple[float, float]], errors: int) -> list[str]:
    """One agent's series after ``reads`` (xfer µs, post µs) pulling ``rx`` bytes in all."""
    lines = [
        f"agent_rx_bytes_total{{{labels}}} {rx}",
        f"agent_rx_last_bytes{{{labels}}} {rx // max(len(reads), 1)}",
        f"agent_rx_requests_num_total{{{labels}}} {len(reads)}",
        f"agent_tx_bytes_total{{{labels}}} 0",
        f"agent_tx_requests_num_total{{{labels}}} 0",
        f"agent_xfer_time_total{{{labels}}} {sum(x for x, _ in reads)}",
        f"agent_xfer_post_time_total{{{labels}}} {sum(p for _, p in reads)}",
        f'agent_errors_total{{{labels},status="backend"}} {errors}',
        f'agent_errors_total{{{labels},status="remote_disconnect"}} 0',
        f"agent_telemetry_events_dropped_total{{{labels}}} 0",
    ]
    for name, values in (("agent_xfer_time_us", [x for x, _ in reads]), ("agent_xfer_post_time_us",
                                                                         [p for _, p in reads])):  # fmt: skip
        for bound in BUCKETS_US:
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {sum(1 for v in values if v <= bound)}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {len(values)}')
        lines.append(f"{name}_sum{{{labels}}} {sum(values)}")
        lines.append(f"{name}_count{{{labels}}} {len(values)}")
    return lines


def _labels(agent: str, pid: int, rank: int) -> str:
    return f'hostname="gpu-node-7",agent_name="{agent}",pid="{pid}",agent_instance="0",local_rank="{rank}"'


def _scrape(state: dict[str, tuple[int, list, int]]) -> str:
    lines = ["# TYPE agent_rx_bytes_total counter", "# TYPE agent_xfer_time_us histogram"]
    for rank, (agent, pid) in enumerate((("3f2a-rank0", 4101), ("91c0-rank1", 4102))):
        rx, reads, errors = state[agent]
        lines += _agent_series(_labels(agent, pid, rank), rx, reads, errors)
    return "\n".join(lines) + "\n"


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (T0, T0))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    folder = tmp_path / "in" / "decode-0"
    r0 = [(4000.0, 800.0)] * 2
    r1 = [(40000.0, 900.0)] * 2  # rank 1 is ten times slower for the same bytes
    scrapes = [
        {"3f2a-rank0": (0, [], 0), "91c0-rank1": (0, [], 0)},
        {"3f2a-rank0": (2 * 50_000_000, r0, 0), "91c0-rank1": (2 * 50_000_000, r1, 1)},
        {"3f2a-rank0": (5 * 50_000_000, r0 * 2 + [(4000.0, 800.0)], 0),
         "91c0-rank1": (3 * 50_000_000, [*r1, (40000.0, 900.0)], 1)},
    ]  # fmt: skip
    for n, state in enumerate(scrapes):
        _put(folder / f"nixl-20261201T19000{n}Z.prom", _scrape(state))
    # the connector's engine record names rank 0's agent (rank 1's process wrote none)
    engine = {"v": 1, "type": "engine", "ts": T0, "engine_id": "decode-0", "role": "decode", "tp_size": 2,
              "rank": 0, "agent_name": "3f2a-rank0"}  # fmt: skip
    _put(tmp_path / "in" / "trace" / "decode-0.decode.tp0.pid1.0.jsonl", json.dumps(engine) + "\n")
    ingest([tmp_path / "in"], tmp_path / "s")
    return tmp_path / "s"


def test_each_agent_gets_its_own_intervals(store: Path) -> None:
    con = Store(store).connect()
    rows = con.sql(
        "SELECT agent_name, pid, local_rank, end_ts - start_ts, rx_bytes, rx_requests, transfers, xfer_us, "
        "avg_xfer_s, errors, one_way, bandwidth_bytes_s FROM nixl_agent_intervals ORDER BY agent_name, end_ts"
    ).fetchall()
    assert rows == [
        # rank 0: 100 MB in two reads of 4 ms: 100e6 / 0.008 s = 12.5 GB/s
        ("3f2a-rank0", 4101, "0", 1.0, 100_000_000, 2, 2, 8000.0, 0.004, 0, True, 1.25e10),
        # then three more reads (150 MB, 12 ms)
        ("3f2a-rank0", 4101, "0", 1.0, 150_000_000, 3, 3, 12000.0, 0.004, 0, True, 1.25e10),
        # rank 1: the same 100 MB in 80 ms, and one backend error
        ("91c0-rank1", 4102, "1", 1.0, 100_000_000, 2, 2, 80000.0, 0.04, 1, True, 1.25e9),
        ("91c0-rank1", 4102, "1", 1.0, 50_000_000, 1, 1, 40000.0, 0.04, 0, True, 1.25e9),
    ]


def test_agents_map_to_engine_and_rank_through_the_connectors_records(store: Path) -> None:
    con = Store(store).connect()
    rows = con.sql(
        "SELECT DISTINCT agent_name, engine_id, rank, mapped FROM nixl_agent_intervals ORDER BY 1"
    ).fetchall()
    # an agent no record names stays visible, unmapped
    assert rows == [("3f2a-rank0", "decode-0", 0, True), ("91c0-rank1", None, None, False)]


@pytest.mark.parametrize("shape", ["csv", "toml"])
def test_a_users_agent_map_names_the_agents_no_record_does(tmp_path: Path, store: Path, shape: str) -> None:
    folder = tmp_path / "in" / "maps"
    if shape == "csv":
        text = ("agent_name,engine_id,rank\n91c0-rank1,decode-0,1\n3f2a-rank0,wrong-engine,5\n"
                "no-engine,,2\nbad-rank,decode-0,x\n")  # fmt: skip
        _put(folder / "agents.csv", text)
    else:
        text = ('# which agent is which\n[agents]\n"91c0-rank1" = { engine_id = "decode-0", rank = 1 }\n'
                '"3f2a-rank0" = "wrong-engine"\n'
                '"bad-rank" = { engine_id = "decode-0", rank = -1 }\n')  # fmt: skip
        _put(folder / "agents.toml", text)
    ingest([tmp_path / "in"], store)
    con = Store(store).connect()
    rows = con.sql(
        "SELECT DISTINCT agent_name, engine_id, rank, mapped_by FROM nixl_agent_intervals ORDER BY 1"
    ).fetchall()
    # the connector's record wins over the map for the agent it names
    assert rows == [
        ("3f2a-rank0", "decode-0", 0, "engine_record"),
        ("91c0-rank1", "decode-0", 1, "agent_map"),
    ]
    rejects = con.sql("SELECT reason FROM rejects WHERE uri LIKE '%agents%' ORDER BY line_number").fetchall()
    expected = ["agent map entry whose rank is not a whole number"]  # "x"
    if shape == "csv":
        expected.insert(0, "agent map entry without agent_name or engine_id")
    else:
        expected = ["agent map entry whose rank is out of range"]  # -1
    assert [r[0] for r in rejects] == expected
    (fmt,) = {r[0] for r in con.sql("SELECT format FROM sources WHERE uri LIKE '%agents%'").fetchall()}
    assert fmt == "agent_map"


def test_an_unreadable_agent_map_is_an_error_row(tmp_path: Path) -> None:
    _put(tmp_path / "in" / "agents.toml", "[agents]\n\"a\" = { engine_id = \n")
    from typer.testing import CliRunner

    from hybridtrace.cli import app

    result = CliRunner().invoke(app, ["ingest", str(tmp_path / "in"), "--store", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    con = Store(tmp_path / "s").connect()
    ((status, message),) = con.sql("SELECT status, message FROM sources").fetchall()
    assert status == "error" and message.startswith("agent map unreadable")
