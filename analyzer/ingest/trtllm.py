"""TensorRT-LLM's per-rank KV-transfer CSVs (the folder ``TRTLLM_KVCACHE_TIME_OUTPUT_PATH`` names).

Three writers, every header they have had:

- the Python transceiver's perf logger (``tensorrt_llm/_torch/disaggregation/native/perf_logger.py``):
  ``{base}_{instance_name}_{instance_rank}.csv`` (later ``{instance}_{rank}.csv``), header
  ``timestamp,task_type,unique_rid,peer_rank,transfer_size_bytes,avg_segment_size_bytes,
  transfer_entry_count,prepare_args_latency_ms,queue_latency_ms,transfer_latency_ms,
  task_latency_ms,throughput_mbs``; one row per task and peer rank; the timestamp is the
  logging module's local ``YYYY-MM-DD HH:MM:SS.mmm``; throughput in MiB/s (bytes / 2^20 / s);
  receive rows may leave the latency fields blank;
- the C++ transceiver (``cpp/tensorrt_llm/batch_manager/dataTransceiver.cpp``):
  ``rank_{world rank}_send.csv`` / ``rank_{world rank}_recv.csv``, one row per request
  (the context-phase request id on both sides), header ``RequestID`` then one
  ``Delay(ms),Duration(ms),Bandwidth(Gbps)`` triple per measure of the first request
  written; later ``RequestID,RequestInfo,Preparation,Preprocess,Transmissions,Postprocess``
  then ``Delay,Duration,Bandwidth(Gbps)`` triples. A row carries as many triples as its own
  request had connections, whatever the header says;
- the generation side's summary (C++ ``cacheTransceiver.cpp`` and the Python transceiver):
  ``{instance}_{rank}_gen_transfer_summary.csv``, ``RequestID,gen_side_transfer_time(ms),
  kv_cache_size`` (the Python logger puts ``timestamp`` first). Its time is synchronised
  across the ranks before it is written, so it is the request's, not the rank's.

Rows become ``transfers`` rows (``side`` says which end measured them) and one ``engines``
row per instance and rank. What a file does not say stays null: the C++ files name no
time, no peer rank and no byte count (only a rate at six significant digits), the summary
no rank.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath

import polars as pl
import pyarrow as pa

from hybridtrace.schema import table_schema

RAW_LIMIT = 512
SOURCE_KIND = "trtllm"

PY_HEADER = (
    "timestamp,task_type,unique_rid,peer_rank,transfer_size_bytes,avg_segment_size_bytes,"
    "transfer_entry_count,prepare_args_latency_ms,queue_latency_ms,transfer_latency_ms,"
    "task_latency_ms,throughput_mbs"
)
CPP_V1_TRIPLE = "Delay(ms),Duration(ms),Bandwidth(Gbps)"
CPP_V2_STAGES = "RequestInfo,Preparation,Preprocess,Transmissions,Postprocess"
CPP_V2_TRIPLE = "Delay,Duration,Bandwidth(Gbps)"
SUMMARY_HEADER = "RequestID,gen_side_transfer_time(ms),kv_cache_size"
PY_SUMMARY_HEADER = "timestamp," + SUMMARY_HEADER

_MIB = 1024.0 * 1024.0
_GBIT_BYTES = 1e9 / 8  # a Gbps figure is 10^9 bits per second
# task types whose rows are KV: AuxSendTask moves the first-token/metadata buffer
_SEND_TASKS = ("KVSendTask",)
_RECV_TASKS = ("KVRecvTask",)
_AUX_TASKS = ("AuxSendTask",)

_CPP_NAME = re.compile(r"^(?:rank_|(?P<instance>.+)_)(?P<rank>\d+)_(?P<side>send|recv)\.csv$")
_SUMMARY_NAME = re.compile(r"^(?P<instance>.+)_(?P<rank>\d+)_gen_transfer_summary\.csv$")
_PY_NAME = re.compile(r"^(?P<instance>.+)_(?P<rank>\d+)\.csv$")


def _header_kind(header: str) -> str | None:
    header = header.strip().lstrip("\ufeff")
    if header == PY_HEADER:
        return "python"
    if header in (SUMMARY_HEADER, PY_SUMMARY_HEADER):
        return "summary"
    for prefix, triple in (("RequestID," + CPP_V2_STAGES, CPP_V2_TRIPLE), ("RequestID", CPP_V1_TRIPLE)):
        rest = header[len(prefix) :]
        if header.startswith(prefix) and rest and rest == ("," + triple) * (rest.count(",") // 3):
            return "cpp_v2" if prefix != "RequestID" else "cpp_v1"
    return None


def _first_line(head: bytes) -> str:
    text = head.decode("utf-8", "replace")
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


def looks_like_trtllm(head: bytes, name: str = "") -> bool:
    """True when the first non-blank line is one of TensorRT-LLM's transfer CSV headers.

    The headers are distinctive, so the name is not needed to tell them; a C++ header-only
    file cut before its first triple (``RequestID`` alone) is taken only when named
    ``rank_<n>_send.csv`` / ``rank_<n>_recv.csv``.
    """
    line = _first_line(head[:65536]).strip()
    if _header_kind(line) is not None:
        return True
    return line == "RequestID" and bool(_CPP_NAME.match(PurePosixPath(name).name))


def _instance_and_rank(name: str, kind: str, engine_id: str | None) -> tuple[str, int | None, str | None]:
    """Engine, rank and side the file name gives; the folder names the engine when the file does not."""
    path = PurePosixPath(name.replace("\\", "/"))
    base = path.name
    folder = path.parent.name or "trtllm"
    side = None
    rank: int | None = None
    instance: str | None = None
    pattern = {"summary": _SUMMARY_NAME, "python": _PY_NAME}.get(kind, _CPP_NAME)
    match = pattern.match(base)
    if match:
        rank = int(match["rank"])
        instance = match.groupdict().get("instance")
        side = match.groupdict().get("side")
    return engine_id or instance or folder, rank, side


def _lines(data: bytes) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    """Non-blank lines with their 1-based numbers; lines that are not UTF-8 are rejects."""
    rejects: list[tuple[int, str, str]] = []
    numbers: list[int] = []
    texts: list[str] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            rejects.append((number, "invalid UTF-8", raw[:RAW_LIMIT].decode("utf-8", "replace")))
            continue
        numbers.append(number)
    frame = pl.DataFrame(
        {"line_number": numbers, "line": texts}, schema={"line_number": pl.Int64, "line": pl.String}
    )
    return frame, rejects


def _number(field: pl.Expr, name: str, *, integer: bool = False) -> tuple[pl.Expr, pl.Expr]:
    """(value, reason) for one text field: blank is null, anything else must read."""
    text = field.str.strip_chars()
    blank = text.is_null() | (text == "")
    value = text.cast(pl.Int64 if integer else pl.Float64, strict=False)
    reason = (
        pl.when(blank)
        .then(None)
        .when(value.is_null())
        .then(pl.lit(f"{name} is not a number: ") + text)
        .when(value.cast(pl.Float64).is_infinite() | value.cast(pl.Float64).is_nan())
        .then(pl.lit(f"{name} is not a finite number: ") + text)
        .when(value < 0)
        .then(pl.lit(f"{name} is negative: ") + text)
    )
    return pl.when(blank).then(None).otherwise(value), reason


def _split_rejects(
    frame: pl.DataFrame, reasons: list[pl.Expr]
) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    frame = frame.with_columns(
        pl.coalesce(reasons).alias("_reason") if reasons else pl.lit(None).alias("_reason")
    )
    bad = frame.filter(pl.col("_reason").is_not_null())
    rejects = [
        (n, r, line[:RAW_LIMIT]) for n, r, line in bad.select("line_number", "_reason", "line").iter_rows()
    ]
    return frame.filter(pl.col("_reason").is_null()).drop("_reason"), rejects


def _epoch(stamp: pl.Expr, tz: str) -> tuple[pl.Expr, pl.Expr]:
    parsed = stamp.str.strip_chars().str.to_datetime("%Y-%m-%d %H:%M:%S%.3f", strict=False, time_unit="ms")
    # the logging module writes local time without a zone: read it in the zone given
    local = parsed.dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null")
    epoch = local.dt.epoch("ms").cast(pl.Float64) / 1000.0
    reason = pl.when(epoch.is_null()).then(pl.lit("time stamp is not a date and time: ") + stamp)
    return epoch, reason


def _day(ts: pl.Expr) -> pl.Expr:
    return (ts * 1000).cast(pl.Int64).cast(pl.Datetime("ms", "UTC")).dt.date()


def _python_rows(frame: pl.DataFrame, tz: str) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    fields = pl.col("line").str.split(",")
    frame = frame.with_columns(fields.alias("_f"))
    wrong = frame.filter(pl.col("_f").list.len() != 12)
    rejects = [
        (n, f"wrong number of fields: {k} (want 12)", line[:RAW_LIMIT])
        for n, k, line in wrong.select("line_number", pl.col("_f").list.len(), "line").iter_rows()
    ]
    frame = frame.filter(pl.col("_f").list.len() == 12)
    get = pl.col("_f").list.get
    ts, ts_reason = _epoch(get(0), tz)
    task = get(1).str.strip_chars()
    known = task.is_in([*_SEND_TASKS, *_RECV_TASKS, *_AUX_TASKS])
    peer, peer_reason = _number(get(3), "peer_rank", integer=True)
    size, size_reason = _number(get(4), "transfer_size_bytes", integer=True)
    entries, entries_reason = _number(get(6), "transfer_entry_count", integer=True)
    queue, queue_reason = _number(get(8), "queue_latency_ms")
    xfer, xfer_reason = _number(get(9), "transfer_latency_ms")
    rate, rate_reason = _number(get(11), "throughput_mbs")
    rid = get(2).str.strip_chars()
    frame = frame.with_columns(
        ts.alias("ts"),
        task.alias("_task"),
        rid.alias("request_id"),
        peer.alias("remote_rank"),
        size.alias("transported_bytes"),
        entries.alias("descriptors"),
        (queue / 1000.0).alias("wait_s"),
        (xfer / 1000.0).alias("xfer_s"),
        (rate * _MIB).alias("reported_bytes_per_s"),
    )
    reasons = [
        ts_reason,
        pl.when(~known).then(pl.lit("unknown task_type ") + task),
        pl.when((rid.is_null()) | (rid == "")).then(pl.lit("missing unique_rid")),
        peer_reason,
        size_reason,
        entries_reason,
        queue_reason,
        xfer_reason,
        rate_reason,
    ]
    frame, bad = _split_rejects(frame, reasons)
    # AuxSendTask moves the first-token and metadata buffer, not KV: no transfers row
    frame = frame.filter(~pl.col("_task").is_in(_AUX_TASKS)).with_columns(
        pl.when(pl.col("_task").is_in(_SEND_TASKS))
        .then(pl.lit("send"))
        .otherwise(pl.lit("recv"))
        .alias("side"),
        pl.col("remote_rank").cast(pl.Int32),
    )
    return frame, rejects + bad


def _cpp_rows(frame: pl.DataFrame, stages: int) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    fields = pl.col("line").str.split(",")
    frame = frame.with_columns(fields.alias("_f"))
    triples = pl.col("_f").list.len() - 1 - stages
    wrong = frame.filter((triples < 3) | (triples % 3 != 0))
    rejects = [
        (n, f"wrong number of fields: {k} (want {1 + stages} plus three per measure)", line[:RAW_LIMIT])
        for n, k, line in wrong.select("line_number", pl.col("_f").list.len(), "line").iter_rows()
    ]
    frame = frame.filter((triples >= 3) & (triples % 3 == 0))
    rid = pl.col("_f").list.get(0).str.strip_chars()
    frame = frame.with_columns(rid.alias("request_id"), pl.col("_f").list.slice(1 + stages).alias("_m"))
    # one row per measure: explode the values with their position, then put each triple together
    long = (
        frame.select(
            "line_number", "line", "request_id", "_m", pl.int_ranges(0, pl.col("_m").list.len()).alias("_pos")
        )
        .explode(["_m", "_pos"])
        .with_columns((pl.col("_pos") // 3).alias("seq"), (pl.col("_pos") % 3).alias("_part"))
    )
    wide = long.group_by("line_number", "seq", maintain_order=True).agg(
        pl.col("line").first(),
        pl.col("request_id").first(),
        pl.col("_m").filter(pl.col("_part") == 0).first().alias("_delay"),
        pl.col("_m").filter(pl.col("_part") == 1).first().alias("_duration"),
        pl.col("_m").filter(pl.col("_part") == 2).first().alias("_rate"),
    )
    delay, delay_reason = _number(pl.col("_delay"), "Delay")
    duration, duration_reason = _number(pl.col("_duration"), "Duration")
    text_rate = pl.col("_rate").str.strip_chars()
    rate = text_rate.cast(pl.Float64, strict=False)
    # the writer divides by the duration: a zero duration prints inf (or nan), a rate of nothing
    rate_ok = rate.is_not_null() & ~rate.is_infinite() & ~rate.is_nan()
    divided_by_zero = text_rate.str.to_lowercase().is_in(["inf", "-inf", "nan", "-nan", "+inf"])
    rate_reason = (
        pl.when(rate.is_null() & ~divided_by_zero)
        .then(pl.lit("Bandwidth(Gbps) is not a number: ") + text_rate)
        .when(rate_ok & (rate < 0))
        .then(pl.lit("Bandwidth(Gbps) is negative: ") + text_rate)
    )
    wide = wide.with_columns(
        (delay / 1000.0).alias("wait_s"),
        (duration / 1000.0).alias("xfer_s"),
        pl.when(rate_ok).then(rate * _GBIT_BYTES).otherwise(None).alias("reported_bytes_per_s"),
        pl.col("seq").cast(pl.Int32),
    )
    missing_id = pl.when(pl.col("request_id").is_null() | (pl.col("request_id") == "")).then(
        pl.lit("missing RequestID")
    )
    wide, bad = _split_rejects(
        wide,
        [
            missing_id,
            pl.when(pl.col("_duration").is_null()).then(pl.lit("missing Duration")),
            delay_reason,
            duration_reason,
            rate_reason,
        ],
    )
    # a line is read whole or not at all: one bad measure rejects the line once
    bad_lines = {n for n, _, _ in bad}
    first: dict[int, tuple[int, str, str]] = {}
    for item in bad:
        first.setdefault(item[0], item)
    wide = wide.filter(~pl.col("line_number").is_in(list(bad_lines)))
    return wide, rejects + list(first.values())


def _summary_rows(
    frame: pl.DataFrame, timestamped: bool, tz: str
) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    width = 4 if timestamped else 3
    frame = frame.with_columns(pl.col("line").str.split(",").alias("_f"))
    wrong = frame.filter(pl.col("_f").list.len() != width)
    rejects = [
        (n, f"wrong number of fields: {k} (want {width})", line[:RAW_LIMIT])
        for n, k, line in wrong.select("line_number", pl.col("_f").list.len(), "line").iter_rows()
    ]
    frame = frame.filter(pl.col("_f").list.len() == width)
    get = pl.col("_f").list.get
    off = 1 if timestamped else 0
    reasons: list[pl.Expr] = []
    if timestamped:
        ts, ts_reason = _epoch(get(0), tz)
        reasons.append(ts_reason)
    else:
        ts = pl.lit(None, pl.Float64)
    xfer, xfer_reason = _number(get(off + 1), "gen_side_transfer_time(ms)")
    size, size_reason = _number(get(off + 2), "kv_cache_size", integer=True)
    rid = get(off).str.strip_chars()
    frame = frame.with_columns(
        ts.alias("ts"),
        rid.alias("request_id"),
        (xfer / 1000.0).alias("xfer_s"),
        size.alias("transported_bytes"),
    )
    reasons += [
        pl.when(rid.is_null() | (rid == "")).then(pl.lit("missing RequestID")),
        xfer_reason,
        size_reason,
    ]
    frame, bad = _split_rejects(frame, reasons)
    return frame.with_columns(pl.lit("recv").alias("side")), rejects + bad


def _empty_tables() -> dict[str, pa.Table]:
    return {name: table_schema(name).arrow_schema().empty_table() for name in ("transfers", "engines")}


def parse_trtllm(
    data: bytes,
    source_id: str,
    *,
    name: str = "",
    engine_id: str | None = None,
    tz: str = "UTC",
) -> tuple[dict[str, pa.Table], list[tuple[int, str, str]]]:
    """``transfers`` and ``engines`` rows of one TensorRT-LLM transfer CSV, and its rejects.

    ``name`` is the object's path: the file name gives the rank (and, for the Python and
    summary files, the instance); without ``engine_id`` the instance the name gives, or
    else the folder holding the file, names the engine. ``tz`` is the zone the Python
    logger's local time stamps are read in. Rejects are ``(line number, reason, raw text)``.
    """
    tables = _empty_tables()
    frame, rejects = _lines(data)
    if frame.is_empty():
        return tables, rejects
    header_number, header = frame.row(0)
    kind = _header_kind(header)
    if kind is None and header.strip() == "RequestID":
        kind = "cpp_v1"
    if kind is None:
        rejects.append((header_number, "not a TensorRT-LLM transfer CSV header", header[:RAW_LIMIT]))
        return tables, rejects
    body = frame.slice(1)
    engine, rank, file_side = _instance_and_rank(name, "cpp" if kind.startswith("cpp") else kind, engine_id)
    if kind == "python":
        rows, bad = _python_rows(body, tz)
    elif kind == "summary":
        rows, bad = _summary_rows(body, header.strip().startswith("timestamp,"), tz)
        rank = None  # synchronised across the ranks before it is written: the request's figure
    else:
        rows, bad = _cpp_rows(body, 5 if kind == "cpp_v2" else 0)
        rows = rows.with_columns(pl.lit(file_side or "recv").alias("side"))
    rejects += bad
    if kind.startswith("cpp") and file_side is None:
        # which end wrote it is only in the name; without it the rows cannot be placed
        rejects += [
            (n, "file name does not say send or recv (rank_<n>_send.csv)", line[:RAW_LIMIT])
            for n, line in rows.select("line_number", "line").unique(maintain_order=True).iter_rows()
        ]
        rows = rows.clear()
    if "ts" not in rows.columns:
        rows = rows.with_columns(pl.lit(None, pl.Float64).alias("ts"))
    rows = rows.with_columns(
        pl.lit(engine).alias("engine_id"),
        pl.lit(rank, pl.Int32).alias("rank"),
        pl.lit("ok").alias("status"),
        _day(pl.col("ts")).alias("day"),
        pl.lit(source_id).alias("source_id"),
    )
    keep = [c for c in table_schema("transfers").column_names if c in rows.columns]
    tables["transfers"] = table_schema("transfers").conform(rows.select(keep).to_arrow())
    if rows.height:
        sides = rows.get_column("side").unique().to_list()
        role = {"send": "prefill", "recv": "decode"}.get(sides[0]) if len(sides) == 1 else None
        first_ts = rows.get_column("ts").drop_nulls()
        ts0 = float(first_ts.min()) if first_ts.len() else None
        engine_row = {
            "ts": ts0,
            "engine_id": engine,
            "role": role,
            "rank": rank,
            "source_kind": SOURCE_KIND,
            "day": None,
            "source_id": source_id,
            "line_number": int(rows.get_column("line_number").min()),
        }
        eng = pl.DataFrame(
            [engine_row], schema_overrides={"ts": pl.Float64, "rank": pl.Int32, "day": pl.Date}
        )
        if ts0 is not None and math.isfinite(ts0):
            eng = eng.with_columns(_day(pl.col("ts")).alias("day"))
        tables["engines"] = table_schema("engines").conform(eng.to_arrow())
    return tables, sorted(rejects)
