"""SGLang's request time stats and transfer metrics, written by code that follows its source.

Read in sgl-project/sglang:
- ``python/sglang/srt/metrics/collector.py`` at 93d04878cfb9b08645fae7b11bd340ee33b34acf: ``TimeStats.
  convert_to_duration`` before transfer figures (``bootstrap_duration=…, queue_duration=…,
  forward_duration=…, start_time=…``) and gauges ``sglang:kv_transfer_speed_gb_s`` /
  ``sglang:kv_transfer_latency_ms``;
- later versions of the same method (``SchedulerReqTimeStats``): ``bootstrap_queue_duration(Xms)
  queue_duration=…, start=…, transfer_speed=X.XXGB/s, transfer_total=Y.YYMB, #retries=N`` and the newest
  ``bootstrap_duration=…, alloc_wait_duration=…, queue_duration=…, forward_duration=…,
  entry_time=<epoch .3f>, transfer_speed=X.XX GB/s, transfer_total=Y.YY MB, #retries=N``, with
  ``total_mb = total_bytes / (1024 * 1024)`` and ``speed_gb_s = (total_mb / 1024) / latency_s``;
- ``Req.log_time_stats`` in ``python/sglang/srt/managers/schedule_batch.py`` (the line's head) and
  the scheduler's logger prefix (`` DP{d}`` / `` PP{p}`` / `` TP{t}`` / `` EP{e}``, each only when that
  size is above one; ``[%(asctime)s{prefix}] %(message)s``, ``%Y-%m-%d %H:%M:%S``, later
  ``%m-%d %H:%M:%S``);
- ``CommonKVSender.get_transfer_metric`` in ``python/sglang/srt/disaggregation/common/conn.py``:
  ``total = kv_indices * kv_item_lens_sum + state_indices * state_item_lens_sum`` where the state
  index count is summed over every state component and ``state_item_lens_sum`` over every
  component's item lengths.
"""

from __future__ import annotations

import json

import pytest

from hybridtrace.ingest.sglang import looks_like_sglang, parse_sglang
from hybridtrace.schema import table_schema

MIB = 1 << 20


def req_line(stamp, prefix, rid, room, input_len, output_len, kind, stats) -> str:
    head = f"rid={rid}" + (f", bootstrap_room={room}" if room is not None else "")
    lens = f"input len={input_len}, output len={output_len}"
    return f"[{stamp}{prefix}] Req Time Stats({head}, {lens}, type={kind}): {stats}"


def prefill_stats_newest(total_bytes: int, latency_s: float) -> str:
    total_mb = total_bytes / (1024 * 1024)
    speed = (total_mb / 1024) / latency_s
    return (
        "bootstrap_duration=3.10ms, alloc_wait_duration=0.20ms, queue_duration=0.50ms, "
        "forward_duration=80.00ms, entry_time=1776765600.000, "
        f"transfer_speed={speed:.2f} GB/s, transfer_total={total_mb:.2f} MB, #retries=0"
    )


def prefill_stats_middle(total_bytes: int, latency_s: float) -> str:
    total_mb = total_bytes / (1024 * 1024)
    speed = (total_mb / 1024) / latency_s
    return (
        "bootstrap_queue_duration(3.30ms) queue_duration=0.50ms, forward_duration=80.00ms, start=1234.567, "
        f"transfer_speed={speed:.2f}GB/s, transfer_total={total_mb:.2f}MB, #retries=0"
    )


DECODE_STATS = (
    "bootstrap_duration=2.00ms, alloc_wait_duration=0.10ms, transfer_duration=95.00ms, "
    "queue_duration=0.30ms, "
    "forward_duration=900.00ms, entry_time=1776765600.010"
)
OLDEST_PREFILL = (
    "bootstrap_duration=3.30ms, queue_duration=0.50ms, forward_duration=80.00ms, start_time=1234.567"
)


def sglang_total_bytes(kv_indices: int, kv_item_lens: list[int], state_indices: list[list[int]],
                       state_item_lens: list[list[int]]) -> int:  # fmt: skip
    """get_transfer_metric's count: index counts times summed item lengths, state components pooled."""
    states = sum(len(component) for component in state_indices)
    return kv_indices * sum(kv_item_lens) + states * sum(x for comp in state_item_lens for x in comp)


def test_prefill_and_decode_lines_every_shape():
    log = "\n".join(
        [
            "[2026-04-21 10:00:00 DP0 TP1] Prefill batch. #new-seq: 1",
            req_line("2026-04-21 10:00:01", " DP0 TP1", "r1", 11, 100, 1, "prefill",
                     prefill_stats_newest(100 * 6144, 0.004)),
            req_line("2026-04-21 10:00:02", " DP0 TP1", "r2", 12, 200, 1, "prefill",
                     prefill_stats_middle(200 * 6144, 0.004)),
            req_line("2026-04-21 10:00:03", " DP0 TP1", "r3", 13, 50, 1, "prefill", OLDEST_PREFILL),
            req_line("2026-04-21 10:00:04", " TP0", "r1", 11, 100, 12, "decode", DECODE_STATS),
        ]
    )  # fmt: skip
    data = log.encode()
    assert looks_like_sglang(data, "server.log")
    tables, rejects = parse_sglang(data, "src", name="/logs/prefill-0/server.log")
    assert rejects == []
    requests = tables["requests"].to_pylist()
    assert tables["requests"].schema == table_schema("requests").arrow_schema()
    assert [(r["engine_id"], r["request_id"], r["handoff_key"], r["prompt_tokens"]) for r in requests] == [
        ("prefill-0_dp0", "r1", "11", 100),
        ("prefill-0_dp0", "r2", "12", 200),
        ("prefill-0_dp0", "r3", "13", 50),
        ("prefill-0", "r1", "11", 100),
    ]
    transfers = tables["transfers"].to_pylist()
    # the oldest shape has no transfer figures, and a decode line none of its own
    assert [(t["request_id"], t["rank"], t["side"]) for t in transfers] == [
        ("r1", 1, "send"),
        ("r2", 1, "send"),
    ]
    assert transfers[0]["transported_bytes"] == round(round(100 * 6144 / MIB, 2) * MIB)
    assert transfers[0]["remote_rank"] is None and transfers[0]["remote_engine_id"] is None
    assert transfers[0]["ts"] == pytest.approx(1776765601.0)
    engines = tables["engines"].to_pylist()
    assert {(e["engine_id"], e["rank"], e["role"], e["tp_size"]) for e in engines} == {
        ("prefill-0_dp0", 1, "prefill", None), ("prefill-0", 0, "decode", None)}  # fmt: skip


def test_a_stamp_without_a_year_takes_the_one_given():
    line = req_line(
        "04-21 10:00:01", " TP0", "r1", 5, 10, 1, "prefill", prefill_stats_newest(10 * 6144, 0.001)
    )
    tables, rejects = parse_sglang(line.encode(), "src", name="p/s.log")
    assert tables["requests"].num_rows == 0 and rejects[0][1] == "time stamp names no year and none was given"
    tables, rejects = parse_sglang(line.encode(), "src", name="p/s.log", year=2026, tz="Europe/Berlin")
    assert rejects == [] and tables["requests"].column("ts")[0].as_py() == pytest.approx(1776765601.0 - 7200)


def test_bad_lines_are_rejects_with_line_numbers():
    log = "\n".join(
        [
            "[2026-04-21 10:00:00] Req Time Stats(rid=r0, input len=x, output len=1, type=prefill): ",
            "[2026-02-30 10:00:00] Req Time Stats(rid=r1, input len=1, output len=1, type=prefill): ",
            "[2026-04-21 10:00:00] Req Time Stats(rid=r2, input len=1, output len=1, type=mixed): ",
            "[2026-04-21 10:00:00] Req Time Stats(rid=r3, input len=1, output len=1, type=prefill): "
            "transfer_speed=1.0GB/s, transfer_total=1e999MB",
            req_line("2026-04-21 10:00:05", "", "ok", None, 1, 1, "unified", "queue_duration=0.10ms"),
        ]
    )
    tables, rejects = parse_sglang(log.encode(), "src", name="u/s.log")
    assert [r["request_id"] for r in tables["requests"].to_pylist()] == ["ok"]
    assert [(n, reason.split(":")[0]) for n, reason, _ in rejects] == [
        (1, "Req Time Stats line whose fields do not parse"),
        (2, "time stamp is not a date and time"),
        (3, "unknown type mixed"),
        (4, "transfer figures do not parse"),
    ]


def test_mamba_state_components_are_over_counted_by_sglang():
    """One rank of a hybrid Mamba model whose recurrent state is registered as two components (conv
    and SSM state, one slot each): SGLang multiplies the two indices by the sum of both components'
    sizes. (Parsed only: the byte check of the same over-count, ingested and analysed, is the case
    tests/cases/finding_reported_bytes_excess/sglang_mamba_state_overcount.)"""
    b = 6144  # attention bytes per token: 6 layers x K and V x 2 heads x 128 x 2 bytes
    kv_item_lens = [512] * 12  # page size 1: one item per token per K/V buffer
    conv, ssm = 516_096, 18_350_080  # one slot's bytes of the 28 recurrent layers (Nemotron Nano, TP 4, bf16)
    tokens = 4096
    reported = sglang_total_bytes(tokens, kv_item_lens, [[7], [7]], [[conv], [ssm]])
    logical = b * tokens + (conv + ssm)
    assert reported - logical == conv + ssm  # the state counted twice
    # Mooncake without its own latency: all chunks' bytes over the last chunk's time
    line = req_line(
        "2026-04-21 10:00:01", "", "m1", 21, tokens, 1, "prefill", prefill_stats_newest(reported, 0.001)
    )
    tables, rejects = parse_sglang(line.encode(), "src", name="nemotron-prefill/s.log")
    assert rejects == []
    row = tables["transfers"].to_pylist()[0]
    assert row["transported_bytes"] == pytest.approx(reported, abs=MIB * 0.005)
    assert row["transported_bytes"] > logical + 0.4 * (conv + ssm)
    assert row["reported_bytes_per_s"] == pytest.approx(reported / 0.001, rel=1e-3)
    assert row["reported_bytes_per_s"] > 50e9  # above any one link of today
    assert tables["requests"].to_pylist()[0]["prompt_tokens"] == tokens


def test_scrape_keeps_the_transfer_families_per_rank():
    labels = 'model_name="m",tp_rank="1",pp_rank="0",dp_rank="0"'
    text = "\n".join(
        [
            "# TYPE sglang:kv_transfer_total_mb histogram",
            f'sglang:kv_transfer_total_mb_bucket{{{labels},le="50.0"}} 3.0',
            f'sglang:kv_transfer_total_mb_bucket{{{labels},le="+Inf"}} 4.0',
            f"sglang:kv_transfer_total_mb_sum{{{labels}}} 180.5",
            f"sglang:kv_transfer_total_mb_count{{{labels}}} 4.0",
            f"sglang:kv_transfer_speed_gb_s{{{labels}}} 12.5",  # the older gauge
            f"sglang:num_transfer_failed_reqs_total{{{labels}}} NaN",
            'sglang:kv_transfer_latency_ms_sum{tp_rank="1" pp_rank="0"} 3.0',
            f"sglang:num_running_reqs{{{labels}}} 2.0",
        ]
    )
    data = text.encode()
    assert looks_like_sglang(data, "metrics.prom")
    tables, rejects = parse_sglang(data, "src", name="/scrapes/p0/0001.prom", scrape_ts=1776765600.0)
    rows = tables["prom_samples"].to_pylist()
    assert [r["metric"] for r in rows] == [
        "sglang:kv_transfer_total_mb_bucket",
        "sglang:kv_transfer_total_mb_bucket",
        "sglang:kv_transfer_total_mb_sum",
        "sglang:kv_transfer_total_mb_count",
        "sglang:kv_transfer_speed_gb_s",
    ]
    assert json.loads(rows[0]["labels"]) == {
        "dp_rank": "0",
        "model_name": "m",
        "pp_rank": "0",
        "tp_rank": "1",
    }
    assert rows[1]["le"] == float("inf") and rows[0]["instance"] == "/scrapes/p0"
    assert [(n, reason.split(":")[0]) for n, reason, _ in rejects] == [
        (7, "counter value is not a finite number"),
        (8, "sample line whose labels do not parse"),
    ]


@pytest.mark.parametrize("launch", [
    # later releases: behind the logger's level and place
    "[2026-04-21 09:59:00] INFO engine.py:177: server_args=ServerArgs("
    "model_path='nvidia/NVIDIA-Nemotron-Nano-12B-v2', tokenizer_path='nvidia/NVIDIA-Nemotron-Nano-12B-v2', "
    "tp_size=2, pp_size=1, dp_size=1, kv_cache_dtype='auto', page_size=1, disaggregation_mode='prefill', "
    "enable_dp_attention=False)",
    # earlier ones: bare, and with DP attention splitting the TP group among data-parallel ranks
    "[2026-04-21 09:59:00] server_args=ServerArgs(model_path='/models/nemotron', served_model_name="
    "'nvidia/NVIDIA-Nemotron-Nano-12B-v2', tp_size=4, dp_size=2, enable_dp_attention=True, page_size=1)",
])  # fmt: skip
def test_the_launch_line_gives_the_tp_size_and_model(launch):
    # the TP size no Req Time Stats prefix says (it names a rank, not a size)
    log = "\n".join([
        launch,
        req_line("2026-04-21 10:00:01", " TP1", "r1", 11, 100, 1, "prefill",
                 prefill_stats_newest(100 * 6144, 0.004)),
    ])  # fmt: skip
    tables, rejects = parse_sglang(log.encode(), "src", name="/logs/prefill-0/server.log")
    assert rejects == []
    ((engine,),) = [[(e["tp_size"], e["model"], e["block_tokens"]) for e in tables["engines"].to_pylist()]]
    assert engine == (2, "nvidia/NVIDIA-Nemotron-Nano-12B-v2", 1)
