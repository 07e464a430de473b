"""SGLang's per-request KV-transfer telemetry: ``Req Time Stats`` log lines and its Prometheus scrape.

With ``--enable-request-time-stats-logging`` every scheduler logs, when a request finishes,
``Req Time Stats(rid=R[, bootstrap_room=N], input len=I, output len=O, type=prefill|decode|
unified): <durations>`` behind the logger's ``[YYYY-MM-DD HH:MM:SS DPd PPp TPt EPe]``
prefix (older releases; newer ones drop the year: ``[MM-DD HH:MM:SS …]``). The prefix names
a rank only where its size is above one, so no ``TP`` means TP rank 0 of one. The prefill
side's durations end with ``transfer_speed=X GB/s, transfer_total=Y MB`` (``XGB/s`` and
``YMB`` without the space before it): GB there is GiB (``total_mb / 1024 / seconds``) and
MB is MiB (``bytes / 2^20``), both printed with two decimals.

``bootstrap_room`` is what the prefill and decode lines of one handoff share
(``requests.handoff_key``). No line names the peer rank or the other engine.

The scrape's ``sglang:kv_transfer_*`` families (histograms in later releases, gauges
before) and the transfer-failure counters are kept as ``prom_samples`` with their
``tp_rank``, ``pp_rank`` and ``dp_rank`` labels, so consecutive scrapes give per-rank deltas.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from zoneinfo import ZoneInfo

import polars as pl
import pyarrow as pa

from hybridtrace.schema import table_schema

RAW_LIMIT = 512
SOURCE_KIND = "sglang"
_MIB = float(1 << 20)
_GIB = float(1 << 30)

_MARK = "Req Time Stats("
_LINE = re.compile(
    r"^\[(?P<stamp>(?:\d{4}-)?\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?P<prefix>(?: [A-Z_]+\d+)*)\] "
    r"Req Time Stats\((?P<head>[^)]*)\): (?P<stats>.*)$"
)
_HEAD = re.compile(
    r"^rid=(?P<rid>[^,]+)(?:, bootstrap_room=(?P<room>-?\d+))?, input len=(?P<input>\d+), "
    r"output len=(?P<output>\d+)(?:, [^=,]+=[^,]*)*, type=(?P<type>\w+)(?:, .*)?$"
)
_RANKS = re.compile(r"([A-Z_]+?)(\d+)")
# The launch line every SGLang server logs (`server_args=ServerArgs(model_path='…', …, tp_size=2, …)`,
# behind `INFO engine.py:177: ` in later releases): the only place its TP size is written.
_SERVER_ARGS = "server_args=ServerArgs("
_ARG_INT = {name: re.compile(rf"[(, ]{name}=(\d+)[,)]") for name in ("tp_size", "dp_size", "page_size")}
_ARG_STR = {name: re.compile(rf"[(, ]{name}='([^']*)'") for name in ("model_path", "served_model_name",
                                                                  "kv_cache_dtype")}  # fmt: skip
_DP_ATTENTION = re.compile(r"[(, ]enable_dp_attention=True[,)]")
_TOTAL = re.compile(r"transfer_total=(\S+?) ?MB\b")
_SPEED = re.compile(r"transfer_speed=(\S+?) ?GB/s")
_PROM_NAMES = ("sglang:kv_transfer_", "sglang:num_transfer_failed_reqs", "sglang:num_bootstrap_failed_reqs")
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def looks_like_sglang(head: bytes, name: str = "") -> bool:
    """True for an SGLang log with request time stats, or a scrape with SGLang's transfer metrics."""
    head = head[:65536]
    return _MARK.encode() in head or any(n.encode() in head for n in _PROM_NAMES)


def _year_stamp(stamp: str, year: int | None) -> str | None:
    if len(stamp) >= 10 and stamp[4] == "-":
        return stamp
    return None if year is None else f"{year:04d}-{stamp}"


def _ranks(prefix: str) -> dict[str, int]:
    return {name: int(number) for name, number in _RANKS.findall(prefix.replace(" ", ""))}


def _epoch(stamp: str, zone: ZoneInfo) -> float | None:
    try:
        moment = datetime.strptime(
            stamp.replace(",", "."),
            "%Y-%m-%d %H:%M:%S.%f" if "." in stamp or "," in stamp else "%Y-%m-%d %H:%M:%S",
        )
    except ValueError:
        return None
    return moment.replace(tzinfo=zone).timestamp()


def _float(pattern: re.Pattern[str], text: str) -> tuple[float | None, str | None]:
    match = pattern.search(text)
    if match is None:
        return None, None
    try:
        value = float(match.group(1))
    except ValueError:
        return None, f"not a number: {match.group(1)}"
    if not math.isfinite(value) or value < 0:
        return None, f"not a finite, non-negative number: {match.group(1)}"
    return value, None


def server_args(data: bytes) -> dict:
    """The engine facts of the log's last `server_args=ServerArgs(…)` line: TP size (per
    data-parallel engine), model, KV cache dtype, page size; empty without such a line."""
    at = data.rfind(_SERVER_ARGS.encode())
    if at < 0:
        return {}
    end = data.find(b"\n", at)
    line = data[at : end if end >= 0 else len(data)].decode("utf-8", "replace")
    found: dict = {}
    ints = {name: int(m.group(1)) for name, p in _ARG_INT.items() if (m := p.search(line))}
    texts = {name: m.group(1) for name, p in _ARG_STR.items() if (m := p.search(line))}
    tp, dp = ints.get("tp_size"), ints.get("dp_size") or 1
    if tp:
        # with DP attention the data-parallel ranks split the TP group; else each replica has it whole
        found["tp_size"] = tp // dp if _DP_ATTENTION.search(line) and dp > 1 and tp % dp == 0 else tp
    model = texts.get("served_model_name") or texts.get("model_path")
    if model:
        found["model"] = model
    if texts.get("kv_cache_dtype") and texts["kv_cache_dtype"] != "auto":
        found["kv_cache_dtype"] = texts["kv_cache_dtype"]
    if ints.get("page_size"):
        found["block_tokens"] = ints["page_size"]
    return found


def _parse_log(
    data: bytes, source_id: str, engine: str, year: int | None, tz: str
) -> tuple[dict[str, list[dict]], list[tuple[int, str, str]]]:
    zone = ZoneInfo(tz)
    facts = server_args(data)
    rows: dict[str, list[dict]] = {"requests": [], "transfers": [], "engines": []}
    rejects: list[tuple[int, str, str]] = []
    seen_engines: set[tuple[str, int]] = set()
    # only lines carrying the mark are looked at: a long server log is mostly other lines
    for number, raw in enumerate(data.split(b"\n"), 1):
        if _MARK.encode() not in raw:
            continue
        line = raw.rstrip(b"\r").decode("utf-8", "replace")
        text = line[:RAW_LIMIT]
        match = _LINE.match(line)
        head = _HEAD.match(match["head"]) if match else None
        if match is None or head is None:
            rejects.append((number, "Req Time Stats line whose fields do not parse", text))
            continue
        stamp = _year_stamp(match["stamp"], year)
        if stamp is None:
            rejects.append((number, "time stamp names no year and none was given", text))
            continue
        ts = _epoch(stamp, zone)
        if ts is None:
            rejects.append((number, f"time stamp is not a date and time: {match['stamp']}", text))
            continue
        kind = head["type"]
        if kind not in ("prefill", "decode", "unified"):
            rejects.append((number, f"unknown type {kind}", text))
            continue
        ranks = _ranks(match["prefix"])
        # a data-parallel rank is an engine of its own (its own scheduler and KV pool)
        eng = f"{engine}_dp{ranks['DP']}" if "DP" in ranks else engine
        rank = ranks.get("TP", 0)
        total, total_error = _float(_TOTAL, match["stats"])
        speed, speed_error = _float(_SPEED, match["stats"])
        if total_error or speed_error:
            rejects.append((number, f"transfer figures do not parse: {total_error or speed_error}", text))
            continue
        common = {"ts": ts, "engine_id": eng, "source_id": source_id, "line_number": number}
        rows["requests"].append(
            {
                **common,
                "request_id": head["rid"],
                "prompt_tokens": int(head["input"]),
                "handoff_key": head["room"],
            }
        )
        # SGLang leaves both figures at 0.00 when the backend gave no metric: nothing was measured
        if kind == "prefill" and total is not None and (total > 0 or (speed or 0) > 0):
            rows["transfers"].append(
                {
                    **common,
                    "request_id": head["rid"],
                    "rank": rank,
                    "side": "send",
                    "status": "ok",
                    "transported_bytes": round(total * _MIB),
                    "reported_bytes_per_s": None if speed is None or speed == 0 else speed * _GIB,
                }
            )
        if (eng, rank) not in seen_engines:
            seen_engines.add((eng, rank))
            role = None if kind == "unified" else kind
            rows["engines"].append(
                {
                    **common,
                    "role": role,
                    "rank": rank,
                    "tp_size": 1 if "TP" not in ranks else None,
                    "source_kind": SOURCE_KIND,
                    **facts,  # the launch line's TP size, model, dtype and page size, when logged
                }
            )
    return rows, rejects


def _labels(text: str | None) -> dict[str, str] | None:
    if not text:
        return {}
    out: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None or match.group(1) in out:
            return None
        out[match.group(1)] = match.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        position = match.end()
    return out


def _parse_scrape(
    data: bytes, source_id: str, instance: str, scrape_ts: float | None
) -> tuple[list[dict], list[tuple[int, str, str]]]:
    rows: list[dict] = []
    rejects: list[tuple[int, str, str]] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.startswith(b"sglang:") or not any(raw.startswith(n.encode()) for n in _PROM_NAMES):
            continue
        line = raw.rstrip(b"\r").decode("utf-8", "replace")
        match = _SAMPLE.match(line)
        labels = _labels(match["labels"]) if match else None
        if match is None or labels is None:
            rejects.append((number, "sample line whose labels do not parse", line[:RAW_LIMIT]))
            continue
        try:
            value = float(match["value"])
        except ValueError:
            rejects.append((number, f"value is not a number: {match['value']}", line[:RAW_LIMIT]))
            continue
        le = labels.pop("le", None)
        # counters and histogram parts are summed by the deltas: they must be finite
        if not math.isfinite(value) and re.search(r"_(total|count|sum|bucket)$", match["name"]):
            rejects.append(
                (number, f"counter value is not a finite number: {match['value']}", line[:RAW_LIMIT])
            )
            continue
        ts = int(match["ts"]) / 1000.0 if match["ts"] else scrape_ts
        rows.append(
            {
                "ts": ts,
                "instance": instance,
                "metric": match["name"],
                "labels": json.dumps(dict(sorted(labels.items()))),
                "model_name": labels.get("model_name"),
                "le": None if le is None else float(le),
                "value": value,
                "source_id": source_id,
                "line_number": number,
            }
        )
    return rows, rejects


def _table(name: str, rows: list[dict]) -> pa.Table:
    schema = table_schema(name)
    if not rows:
        return schema.arrow_schema().empty_table()
    frame = pl.DataFrame(rows, infer_schema_length=None)
    if "ts" in frame.columns:
        frame = frame.with_columns(
            pl.col("ts").cast(pl.Float64),
            (pl.col("ts") * 1000).cast(pl.Int64).cast(pl.Datetime("ms", "UTC")).dt.date().alias("day"),
        )
    return schema.conform(frame.to_arrow())


def parse_sglang(
    data: bytes,
    source_id: str,
    *,
    name: str = "",
    engine_id: str | None = None,
    year: int | None = None,
    tz: str = "UTC",
    scrape_ts: float | None = None,
) -> tuple[dict[str, pa.Table], list[tuple[int, str, str]]]:
    """``requests``, ``transfers`` (prefill side) and ``engines`` rows of an SGLang log, or
    ``prom_samples`` rows of an SGLang scrape, with the rejects ``(line number, reason, raw)``.

    ``engine_id`` names the server (else the folder of ``name``); ``year`` completes stamps
    that lack one; ``tz`` is the zone the log's local stamps are read in; ``scrape_ts`` is
    the scrape's time where its samples carry none.
    """
    parts = name.replace("\\", "/").rsplit("/", 2)
    folder = parts[-2] if len(parts) >= 2 and parts[-2] else "sglang"
    engine = engine_id or folder
    if _MARK.encode() in data:
        rows, rejects = _parse_log(data, source_id, engine, year, tz)
        tables = {table: _table(table, rows[table]) for table in ("requests", "transfers", "engines")}
        return tables, rejects
    samples, rejects = _parse_scrape(
        data, source_id, engine_id or name.rsplit("/", 1)[0] or engine, scrape_ts
    )
    return {"prom_samples": _table("prom_samples", samples)}, rejects
