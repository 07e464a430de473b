"""vLLM server logs → ``intervals``, ``log_events`` and ``engines`` rows.

Most lines of a vLLM log are of no interest, so the work is split: one vectorised pass
(polars) reads every line's header, groups multi-line messages into events and keeps
only the events worth a look (WARNING or worse, or a message hybridtrace recognises);
those few are then parsed one by one.

Line shape: ``[(Name pid=N) ]LEVEL MM-DD HH:MM:SS [file:line] message`` — the process
prefix and ANSI colour optional, the opening ``[`` missing in older versions, and
``\\r`` ending a line whose message continues on the next (vLLM repeats the prefix on
every continuation line). Tracebacks printed without a header attach to the event
before them. The stamp has no year: it comes from ``--year`` or from the object's
modification time, with a December→January rollover counted. A container run with a
TTY ends every line in ``\r``; then a second ``\r`` marks a continued message.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import polars as pl

from hybridtrace.ingest.detect import COLLECTOR_STAMP, LOGGING_PREFIX
from hybridtrace.ingest.limits import LINE_LIMIT

MESSAGE_LIMIT = 4096
RAW_LIMIT = 512

_ANSI = r"\x1b\[[0-9;]*m"
_HEADER = (
    r"^(?:(?P<wrap>" + COLLECTOR_STAMP + r")(?: \| | ))?"
    r"(?:\((?P<process>[A-Za-z][\w]*(?: rank=\d+)?) pid=(?P<pid>\d+)\) )?"
    r"(?:" + LOGGING_PREFIX + r" )?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? "
    r"\[?(?P<file>[^\s:\]]+):(?P<lineno>\d+)\] ?(?P<msg>.*)$"
)
# The header up to its message, which is the rest of the line.
_HEADER_FIELDS = _HEADER[: _HEADER.index(r"\] ?(?P<msg>")] + r"\] ?"
# The header without captures: much cheaper to test on every line.
_HEADER_TEST = (
    r"^(?:" + COLLECTOR_STAMP + r"(?: \| | ))?"
    r"(?:\([A-Za-z]\w*(?: rank=\d+)? pid=\d+\) )?"
    r"(?:" + LOGGING_PREFIX + r" )?"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[^\s:\]]+:\d+\]"
)
_PROCESS_PREFIX = (
    r"^(?:" + COLLECTOR_STAMP + r"(?: \| | ))?"
    r"(?:\([A-Za-z][\w]*(?: rank=\d+)? pid=\d+\) )?"
)
_TRACEBACK_LIKE = (
    r"^(?:\s|Traceback |[\w.]+(?:Error|Exception|Interrupt|Exit)\b|During handling|The above exception)"
)

# Messages worth parsing even at INFO level.
INTERESTING = (
    "KV Transfer metrics:",
    "Engine ",
    "Engines Aggregated:",
    "Setting attention block size to",
    "Padding mamba page size by",
    "padding layers, may waste",
    "GPU KV cache size:",
    "Maximum concurrency for",
    "# GPU blocks:",
    "Hybrid SSM registration:",
    "Registering KV_Caches.",
    "Detected kv cache layout",
    "Initializing NIXL worker",
    "Initializing NIXL Scheduler",
    "NIXL compatibility check passed",
    "NIXL compatibility hash mismatch",
    "Releasing expired KV blocks",
    "Potentially invalid KV blocks",
    "Declining expired remote read",
    "NIXL transfer failure:",
    "KV load failure",
    "Skipping KV post-processing",
    "Transfer plan: TransferTopology",
    "Created HeteroTPTransferConfig(",
)

_KV_KEYS = {
    "Num successful transfers": ("transfers", 1.0),
    "Avg xfer time (ms)": ("avg_xfer_s", 1e-3),
    "P90 xfer time (ms)": ("p90_xfer_s", 1e-3),
    "Avg post time (ms)": ("avg_post_s", 1e-3),
    "P90 post time (ms)": ("p90_post_s", 1e-3),
    "Avg MB per transfer": ("avg_mib_per_transfer", 1.0),
    "Throughput (MB/s)": ("throughput_mib_s", 1.0),
    "Avg number of descriptors": ("avg_descriptors", 1.0),
    "Num failed transfers": ("failed_transfers", 1.0),
    "Num KV expired reqs": ("expired_requests", 1.0),
}
_KV_COUNTS = ("transfers", "failed_transfers", "expired_requests")
_ENGINE_ID = re.compile(r"Initializing NIXL (?:worker|Scheduler) (\S+)")
_EXPIRED = re.compile(
    r"Releasing expired KV blocks for request (\S+) which were retrieved by (\d+) (decode|remote) worker\(s\)"
    r"(?: within (\d+) seconds| before lease expired)"
)
_UNRECOGNISED_READ = re.compile(
    r"Potentially invalid KV blocks for unrecognized request (\S+) were retrieved"
)
_DECLINED = re.compile(r"Declining expired remote read for (\S+) from engine (\S+?)\.?$")
# The context is the dict on the event's first line: a traceback may follow it, with
# braces of its own (vLLM's mismatch message quotes a JSON config).
_FAILURE = re.compile(r"NIXL transfer failure: (.*?) \| Context: (\{.*\})")
# Failures of the notification that tells the prefill side a read finished: the read
# itself went through, so they are not failed reads.
_NOT_A_READ = ("notification_failed",)
_LOAD_FAILED = re.compile(
    r"Failing (\d+) request\(s\) due to KV load failure \(failure_policy=(\w+), (\d+) tokens affected\)\. "
    r"Request IDs: (.*)$",
    re.S,
)
_LOAD_RECOVERED = re.compile(
    r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens affected\)"
)
_POST_SKIPPED = re.compile(r"Skipping KV post-processing for failed request (\S+)")
_MISMATCH_TEXT = "NIXL compatibility hash mismatch"
_HASH_MISMATCH = re.compile(_MISMATCH_TEXT + r"\. Local: (\w+),? Remote: (\w+)")
_HASH_OK = re.compile(r"NIXL compatibility check passed \(hash: (\w+)\)")
_ENGINE_STATS = re.compile(r"^(?:Engine (\d+)|(\d+) Engines Aggregated): (.*)$")
_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
_PADDING = re.compile(r"Padding mamba page size by ([\d.]+)%")
_PAD_LAYERS = re.compile(r"Add (\d+) padding layers, may waste at most ([\d.]+)%")
_KV_SIZE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")
_SSM_REG = re.compile(r"Hybrid SSM registration:.*?mamba_ssm_size=\((\d+),\s*(\d+)\)")
_REGISTER = re.compile(
    r"Registering KV_Caches\. use_mla: (\w+), kv_buffer_device: (\w+), use_host_buffer: (\w+)"
)
_LAYOUT = re.compile(r"Detected kv cache layout (\w+)")
# The openings of the lines read above: a line that opens so but did not parse (a number
# that is not one, a context cut short) is a reject, never a silent generic event.
_RECOGNISED = tuple(
    (re.compile(opening), what)
    for opening, what in (
        (r"Setting attention block size to ", "attention block size"),
        (r"Padding mamba page size by ", "Mamba page padding"),
        (r"Add \S+ padding layers", "padding layers"),
        (r"GPU KV cache size: ", "KV cache size"),
        (r"Maximum concurrency for ", "maximum concurrency"),
        (r"Hybrid SSM registration:", "Hybrid SSM registration"),
        (r"Registering KV_Caches\.", "KV cache registration"),
        (r"Detected kv cache layout", "KV cache layout"),
        (r"Releasing expired KV blocks for request ", "KV expiry"),
        (r"NIXL transfer failure: ", "NIXL transfer failure"),
        (r"Failing \S+ request\(s\) due to KV load failure", "KV load failure"),
        (r"Recovered from KV load failure: ", "KV load recovery"),
    )
)
# The local TP size a decode worker states: the transfer plan (any variant, such as
# TransferTopology.mamba), or the hetero-TP config of the worker.py era (the reader is D).
_TOPOLOGY = re.compile(
    r"Transfer plan: TransferTopology(?:\.\w+)?\(.*\blocal_tp=(\d+)"
    r"|Created HeteroTPTransferConfig\(.*\bd_tp=(\d+)"
)
_RANK = re.compile(r"_TP(\d+)|rank=(\d+)")
# Every message the one-by-one parse reads something from.
_READ = (
    _TOPOLOGY, _ENGINE_ID, re.compile(r"^KV Transfer metrics:"), _ENGINE_STATS, _BLOCK, _PADDING, _PAD_LAYERS,
    _LAYOUT, _KV_SIZE, _CONCURRENCY, _SSM_REG, _REGISTER, _HASH_OK, _EXPIRED, _UNRECOGNISED_READ, _DECLINED,
    _FAILURE, _LOAD_FAILED, _LOAD_RECOVERED, _POST_SKIPPED, _HASH_MISMATCH, *(o for o, _ in _RECOGNISED),
)  # fmt: skip


@dataclass
class LogContext:
    """What the parser needs to know about the object, and what it carries between chunks."""

    uri: str
    mtime: float
    year: int | None = None
    tz: str = "UTC"
    engine_id: str | None = None  # from a previous read of this object
    fallback_engine_id: str = "unknown"
    carry: list[tuple[int, str]] = field(default_factory=list)  # lines of an unfinished event
    # every line ends in \r (a container run with a TTY): a message continues on the next
    # line when its line ends in a second \r
    tty: bool | None = None  # decided by the first chunk of two or more lines
    last_month: int | None = None
    year_offset: int = 0
    base_year: int | None = None
    # a read resumed where an earlier one stopped: the latest stamp it had read (epoch s),
    # which gives the year and month to go on from instead of --year or the file's time
    resume_ts: float | None = None
    latest_ts: float | None = None  # the latest stamp read so far, for the next resume
    latest_local: datetime | None = None  # the latest local (zone-less) stamp read so far
    second_pass: bool = False  # within an hour the clocks went back over
    max_tp_rank: int | None = None
    logged_tp: int | None = None  # the TP size a transfer-plan line states
    # per process, the engine index of its last `Engine NNN:` line (-1: aggregated stats)
    engine_index: dict[str, int] = field(default_factory=dict)
    last_interval_end: dict = field(default_factory=dict)


@dataclass
class LogResult:
    events: list[dict] = field(default_factory=list)  # parsed one by one
    event_frames: list[pl.DataFrame] = field(default_factory=list)  # parsed in bulk
    intervals: list[dict] = field(default_factory=list)
    engine: dict = field(default_factory=dict)
    rejects: list[dict] = field(default_factory=list)
    lines: int = 0


def looks_like_vllm_log(head: str) -> bool:
    return bool(re.search(_HEADER, re.sub(_ANSI, "", head), re.M))


def _events_frame(
    frame: pl.DataFrame, final: bool, tty: bool = False, growing: bool = False
) -> tuple[pl.DataFrame, list[tuple[int, str]], int | None]:
    """Group lines into events; return interesting events, the unfinished tail, the top TP rank.

    The last event is the tail unless the chunk is ``final``; a final chunk of an object
    still ``growing`` keeps a last event of several lines as its tail (a traceback being
    written: the next read takes it whole), and reads a one-line one.

    Every line gets only cheap tests (a capture-free header match, literal searches);
    the header is taken apart, and lines joined into events, only for the lines of
    events worth parsing.
    """
    raw = pl.col("raw")
    if frame.select((raw.str.len_bytes() > LINE_LIMIT).any()).item():
        # A line longer than LINE_LIMIT is read by its first LINE_LIMIT characters, its line
        # end kept: every test below then costs at most that, whatever the line's size.
        # The carried tail keeps the line as read (the reader counts its bytes).
        too_long = raw.str.len_bytes() > LINE_LIMIT
        end = pl.when(raw.str.ends_with("\r")).then(pl.lit("\r")).otherwise(pl.lit(""))
        cut = pl.concat_str([raw.str.slice(0, LINE_LIMIT), end])
        frame = frame.with_columns(
            pl.when(too_long).then(cut).otherwise(raw).alias("line"), too_long.alias("long")
        )
    else:  # the usual case: the line is the column as read, not a copy of it
        frame = frame.with_columns(raw.alias("line"), pl.lit(False).alias("long"))
    line = pl.col("line").str.strip_suffix("\r") if tty else pl.col("line")
    text = line
    coloured, with_cr = frame.select(
        text.str.contains("\x1b", literal=True).any().alias("coloured"),
        pl.col("line").str.contains("\r", literal=True).any().alias("with_cr"),
    ).row(0)
    if coloured:
        text = text.str.replace_all(_ANSI, "")
    if with_cr:
        frame = frame.with_columns(
            text.str.strip_suffix("\r").alias("text"), line.str.ends_with("\r").alias("cr")
        )
    else:  # no carriage return anywhere: the text is the line as read, not a copy of it
        frame = frame.with_columns(text.alias("text"), pl.lit(False).alias("cr"))
    has_header = pl.col("text").str.contains(_HEADER_TEST)
    frame = frame.with_columns(has_header.alias("has_header"))
    headerless = pl.when(~pl.col("has_header")).then(pl.col("text").str.replace(_PROCESS_PREFIX, ""))
    frame = frame.with_columns(headerless.alias("bare"))
    tb = pl.col("bare").str.contains(_TRACEBACK_LIKE).fill_null(False)
    prev_cr = pl.col("cr").shift(1).fill_null(False)
    starts = (pl.col("has_header") & ~prev_cr) | (~pl.col("has_header") & ~tb)
    # A chunk starting mid-event (carried lines are prepended, so this only happens on
    # the very first line of an object) starts a new event anyway.
    frame = frame.with_columns(starts.cum_sum().alias("event"), starts.alias("starts"))
    carry: list[tuple[int, str]] = []
    ranked = frame
    if frame.height and (not final or growing):
        last = frame["event"][-1]
        tail = frame.filter(pl.col("event") == last)
    if frame.height and (not final or (growing and tail.height > 1)):
        carry = list(zip(tail["line_number"].to_list(), tail["raw"].to_list(), strict=True))
        frame = frame.filter(pl.col("event") != last)
        named = tail.filter(pl.col("has_header") & pl.col("text").str.contains(_ENGINE_ID.pattern))
        if named.height:
            ranked = frame
    # The worker names of the process prefixes (within a line's first 96 characters, after
    # any collector stamp): a few distinct prefixes, parsed once each. When the carried tail
    # is the engine's `Initializing NIXL worker` line (a log holding little more so far),
    # its ranks wait with it: what they say is filed with the line, under its engine.
    prefixes = (
        ranked.filter(pl.col("text").str.contains_any(["_TP", "VllmWorker rank="]))["text"]
        .str.slice(0, 96)
        .unique()
    )
    # vLLM names a worker by its parallel ranks in order (Worker_TP1, Worker_PP1_TP3,
    # Worker_TP1_EP1); older versions VllmWorker rank=1
    ranks = prefixes.str.extract(r"\(\w*_TP(\d+)(?:_[A-Z]+\d+)* pid=\d+\)").fill_null(
        prefixes.str.extract(r"\(VllmWorker rank=(\d+) pid=\d+\)")
    )
    # a rank too large for a TP size (int32) is no rank
    ranks = ranks.cast(pl.Int32, strict=False).filter(ranks.cast(pl.Int32, strict=False) < _INT32_MAX)
    top_rank = ranks.max() if ranks.len() else None
    # Whether an event is worth parsing is decided on its first line (WARNING or worse,
    # or a message hybridtrace knows), then carried to its continuation lines.
    first_interesting = pl.col("has_header") & pl.col("text").str.contains_any(
        ["WARNING ", "ERROR ", "CRITICAL ", *INTERESTING]
    )
    keep = pl.when(pl.col("starts")).then(first_interesting).forward_fill().fill_null(False)
    if frame["text"].str.contains(_MISMATCH_TEXT, literal=True).any():
        # A traceback printed straight to stderr (no header) joins the event before it,
        # whatever that was: the handshake's hash mismatch is worth keeping wherever it is.
        mismatch = pl.col("text").str.contains(_MISMATCH_TEXT, literal=True)
        keep = keep | mismatch.any().over("event")
    frame = frame.filter(keep)
    # The header's fields, then the message as what is left once the header is cut off: a
    # capturing match that has to run to the end of every long line costs three times more.
    header_text = pl.when(pl.col("has_header")).then(pl.col("text"))
    frame = frame.with_columns(
        header_text.str.extract_groups(_HEADER_FIELDS).alias("h"),
        header_text.str.replace(_HEADER_FIELDS, "").alias("msg"),
    ).unnest("h")
    part = pl.coalesce(pl.when(pl.col("level").is_not_null()).then(pl.col("msg")), pl.col("bare"))
    events = (
        frame.with_columns(part.alias("part"))
        .group_by("event", maintain_order=True)
        .agg(
            pl.col("line_number").first(),
            pl.col("wrap").first(),
            pl.col("process").first(),
            pl.col("level").first(),
            pl.col("md").first(),
            pl.col("hms").first(),
            pl.col("part").str.join("\n").alias("message"),
            pl.col("text").first().alias("first_text"),
            pl.col("long").first().alias("cut"),
        )
        .filter(pl.col("level").is_not_null())
    )
    return events, carry, top_rank


# A collector stamp with its zone cut off, to check that its date and time exist; an offset
# is hours 00-23 and minutes 00-59.
_ZONE_SUFFIX = r"(?:Z|[+-]\d\d:?\d\d)$"
_OFFSET = r"[+-]\d\d:?\d\d$"
_GOOD_OFFSET = r"[+-](?:[01]\d|2[0-3]):?[0-5]\d$"


def _reject_events(events: pl.DataFrame, bad: pl.Expr, reason: pl.Expr, result: LogResult) -> pl.DataFrame:
    """Move the events where ``bad`` holds to ``result.rejects`` (with ``reason``); return the rest."""
    flagged = events.with_columns(bad.fill_null(False).alias("_bad"))
    if not flagged["_bad"].any():
        return events
    rejected = flagged.filter(pl.col("_bad")).select(
        "line_number", reason.alias("reason"), pl.col("first_text").str.slice(0, RAW_LIMIT).alias("raw")
    )
    result.rejects.extend(rejected.iter_rows(named=True))
    return flagged.filter(~pl.col("_bad")).drop("_bad")


def _impossible_stamps(events: pl.DataFrame, result: LogResult) -> pl.DataFrame:
    """Reject events whose stamp names no date or time (02-30, 13-01, 25:61:61), before the
    year walk, so that a month that does not exist cannot start a new year for the lines
    after it. February 29 passes here (2000 is a leap year): its own year decides later."""
    if events.height == 0:
        return events
    own = pl.format("2000-{} {}", pl.col("md"), pl.col("hms")).str.to_datetime(
        "%Y-%m-%d %H:%M:%S", strict=False
    )
    # the parser takes second 60 for a leap second, which a log's clock never writes
    clock = pl.col("hms").str.contains(r"^(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d$")
    events = _reject_events(
        events,
        own.is_null() | ~clock,
        pl.format("time stamp is not a date and time: {} {}", "md", "hms"),
        result,
    )
    wrap = pl.col("wrap").str.replace(" ", "T")
    naive = wrap.str.replace(_ZONE_SUFFIX, "").str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", strict=False)
    bad_offset = wrap.str.contains(_OFFSET) & ~wrap.str.contains(_GOOD_OFFSET)
    clock = wrap.str.contains(r"T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d")
    bad_wrap = pl.col("wrap").is_not_null() & (naive.is_null() | ~clock | bad_offset)
    return _reject_events(
        events, bad_wrap, pl.format("time stamp is not a date and time: {}", "wrap"), result
    )


def _with_ts(ctx: LogContext, events: pl.DataFrame, result: LogResult) -> pl.DataFrame:
    """Epoch seconds of every event, and the raw stamp it came from.

    Stamps carry no year: the first event's year comes from ``--year`` or the object's
    modification time, every drop of more than six months (December → January) starts
    the next year, and a late line stamped before that drop keeps the year before. The
    state carries over to the next chunk.
    """
    if events.height == 0:
        return events.with_columns(
            pl.lit(None, pl.Float64).alias("ts"), pl.lit(None, pl.String).alias("stamp")
        )
    months = events["md"].str.slice(0, 2).cast(pl.Int64)
    if ctx.base_year is None:
        if ctx.resume_ts is not None:
            resumed = datetime.fromtimestamp(ctx.resume_ts, ZoneInfo(ctx.tz))
            ctx.base_year, ctx.last_month = resumed.year, resumed.month
        elif ctx.year is not None:
            ctx.base_year = ctx.year
        else:
            first = events.row(0, named=True)
            modified = datetime.fromtimestamp(ctx.mtime, ZoneInfo(ctx.tz))
            month, day = int(first["md"][:2]), int(first["md"][3:])
            ctx.base_year = modified.year - (1 if (month, day) > (modified.month, modified.day) else 0)
    # Processes interleave, so a line stamped before the New Year can follow one after it:
    # a month more than six behind the latest is a new year; more than six ahead, a late
    # line of the year before. Events of interest are few, so this walks them one by one.
    year_of: list[int] = []
    for month in months.to_list():
        if ctx.last_month is None:
            ctx.last_month = month
        if month < ctx.last_month - 6:
            ctx.year_offset += 1
            ctx.last_month = month
        elif month > ctx.last_month + 6:
            year_of.append(ctx.base_year + ctx.year_offset - 1)
            continue
        else:
            ctx.last_month = max(ctx.last_month, month)
        year_of.append(ctx.base_year + ctx.year_offset)
    years = pl.Series("year", year_of, dtype=pl.Int64)
    local = pl.format("{}-{} {}", pl.lit(years), pl.col("md"), pl.col("hms")).str.to_datetime(
        "%Y-%m-%d %H:%M:%S", strict=False
    )
    # Only February 29 of a year that has none is left to fail here (_impossible_stamps
    # took the rest): a reject too.
    missing_day = events.select(local.is_null().alias("x"))["x"]
    if missing_day.any():
        keep = ~missing_day
        _reject_events(
            events.with_columns(years),
            missing_day,
            pl.format("time stamp is not a date and time: {} {} in {}", "md", "hms", "year"),
            result,
        )
        events, years = events.filter(keep), years.filter(keep)
        if events.height == 0:
            return events.with_columns(
                pl.lit(None, pl.Float64).alias("ts"), pl.lit(None, pl.String).alias("stamp")
            )
        local = pl.format("{}-{} {}", pl.lit(years), pl.col("md"), pl.col("hms")).str.to_datetime(
            "%Y-%m-%d %H:%M:%S", strict=False
        )
    # When clocks go back, an hour of stamps repeats. A stamp more than half an hour before
    # the latest one read (so not a late line of another process) starts the second pass
    # of that hour, which lasts until the stamps are past the latest again; any other
    # ambiguous stamp is in the first pass. Few events: walked one by one, like the years.
    flags: list[str] = []
    locals_ = [] if ctx.tz in ("UTC", "Etc/UTC") else events.select(local.alias("local"))["local"].to_list()
    for value in locals_:
        latest = ctx.latest_local
        if value is not None and latest is not None:
            if value < latest - timedelta(minutes=30):
                ctx.second_pass = True
            elif value > latest:
                ctx.second_pass = False
        flags.append("latest" if ctx.second_pass else "earliest")
        if value is not None and (latest is None or value > latest):
            ctx.latest_local = value
    ambiguous = pl.Series("ambiguous", flags, dtype=pl.String) if flags else "earliest"
    which = pl.lit(ambiguous) if isinstance(ambiguous, pl.Series) else ambiguous
    stamped = local.dt.replace_time_zone(ctx.tz, ambiguous=which, non_existent="null")
    stamped = stamped.dt.convert_time_zone("UTC")
    # A collector's stamp carries its year; its zone when it says one, else the log's.
    wrap = pl.col("wrap").str.replace(" ", "T")
    zoned = (
        wrap.str.replace(r"Z$", "+00:00")
        .str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%z", strict=False)
        .dt.convert_time_zone("UTC")
    )
    naive = (  # in the repeated hour, the same pass as the line's own stamp
        wrap.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", strict=False)
        .dt.replace_time_zone(ctx.tz, ambiguous=which, non_existent="null")
        .dt.convert_time_zone("UTC")
    )
    wrapped = pl.when(wrap.str.contains(r"(?:Z|[+-]\d\d:?\d\d)$")).then(zoned).otherwise(naive)
    out = events.with_columns(
        (pl.coalesce(wrapped, stamped).dt.epoch("us") / 1e6).alias("ts"),
        pl.coalesce(pl.col("wrap"), pl.format("{} {}", pl.col("md"), pl.col("hms"))).alias("stamp"),
    )
    latest = out["ts"].max()
    if latest is not None and (ctx.latest_ts is None or latest > ctx.latest_ts):
        ctx.latest_ts = float(latest)  # type: ignore[arg-type]
    return out


# The bulk patterns take only numbers that surely fit their columns (ASCII digits, at most
# 18 of an integer, 20 on each side of a decimal point): any other line goes one by one,
# where a number that is none, or too large, is a reject with the line's name.
_INT = r"[0-9]{1,18}"
_DEC = r"[0-9]{1,20}(?:\.[0-9]{1,20})?"
_KV_LINE = (
    rf"^KV Transfer metrics: Num successful transfers=(?P<transfers>{_INT}), "
    rf"Avg xfer time \(ms\)=(?P<axf>{_DEC}), "
    rf"P90 xfer time \(ms\)=(?P<pxf>{_DEC}), Avg post time \(ms\)=(?P<apo>{_DEC}), "
    rf"P90 post time \(ms\)=(?P<ppo>{_DEC}), Avg MB per transfer=(?P<mib>{_DEC}), "
    rf"Throughput \(MB/s\)=(?P<tput>{_DEC}), Avg number of descriptors=(?P<desc>{_DEC})$"
)
_STATS_LINE = (
    rf"^Engine (?P<engine>{_INT}): Avg prompt throughput: (?P<prompt>{_DEC}) tokens/s, "
    rf"Avg generation throughput: (?P<gen>{_DEC}) tokens/s, Running: (?P<running>{_INT}) reqs, "
    rf"Waiting: (?P<waiting>{_INT}) reqs, GPU KV cache usage: (?P<usage>{_DEC})%, "
    rf"Prefix cache hit rate: (?P<hit>{_DEC})%(?:, External prefix cache hit rate: (?P<ext>{_DEC})%)?$"
)
_EXPIRED_LINE = (
    rf"^Releasing expired KV blocks for request (?P<request>\S+) which were retrieved by (?P<workers>{_INT}) "
    rf"(?:decode|remote) worker\(s\)(?: within (?P<timeout>{_INT}) seconds| before lease expired)\.?$"
)
_RANK_EXPR = r"_TP(\d+)"


def _event_base(frame: pl.DataFrame, kind: str) -> list[pl.Expr]:
    rank = pl.coalesce(  # a number too large for a rank is none (the process name stays)
        pl.col("process").str.extract(_RANK_EXPR).cast(pl.Int32, strict=False),
        pl.col("process").str.extract(r"rank=(\d+)").cast(pl.Int32, strict=False),
    )
    return [
        pl.col("ts"),
        pl.col("process"),
        rank.alias("rank"),
        pl.col("level"),
        pl.col("line_number"),
        pl.lit(kind).alias("kind"),
        pl.col("message").str.slice(0, MESSAGE_LIMIT).alias("message"),
        pl.col("stamp"),
    ]


def _matching(events: pl.DataFrame, pattern: str, required: str) -> pl.DataFrame:
    """Events whose message matches ``pattern``, its groups in struct column ``x``."""
    return events.with_columns(pl.col("message").str.extract_groups(pattern).alias("x")).filter(
        pl.col("x").struct.field(required).is_not_null()
    )


def _bulk_kinds(events: pl.DataFrame, result: LogResult) -> pl.DataFrame:
    """Parse the frequent kinds (interval lines, throughput lines, expiries) in bulk.

    Returns the events left for one-by-one parsing (rare kinds, odd variants, rejects).
    """
    if events.height == 0:
        return events
    if events["cut"].any():  # a line read only in part is judged one by one
        whole = events.filter(~pl.col("cut"))
        return pl.concat([_bulk_kinds(whole, result), events.filter(pl.col("cut"))])
    kv = _matching(events, _KV_LINE, "transfers")
    if kv.height:
        x = pl.col("x").struct
        for row in kv.select(
            pl.col("ts").alias("end_ts"),
            pl.col("process"),
            pl.col("line_number"),
            pl.col("first_text"),
            x.field("transfers").cast(pl.Int64).alias("transfers"),
            (x.field("axf").cast(pl.Float64) * 1e-3).alias("avg_xfer_s"),
            (x.field("pxf").cast(pl.Float64) * 1e-3).alias("p90_xfer_s"),
            (x.field("apo").cast(pl.Float64) * 1e-3).alias("avg_post_s"),
            (x.field("ppo").cast(pl.Float64) * 1e-3).alias("p90_post_s"),
            x.field("mib").cast(pl.Float64).alias("avg_mib_per_transfer"),
            x.field("tput").cast(pl.Float64).alias("throughput_mib_s"),
            x.field("desc").cast(pl.Float64).alias("avg_descriptors"),
        ).iter_rows(named=True):
            row["line_hash"] = _line_hash(row.pop("first_text"))
            result.intervals.append(row)
    stats = _matching(events, _STATS_LINE, "engine")
    if stats.height:
        x = pl.col("x").struct
        details = pl.struct(
            x.field("prompt").cast(pl.Float64).alias("avg_prompt_throughput_tokens_s"),
            x.field("gen").cast(pl.Float64).alias("avg_generation_throughput_tokens_s"),
            x.field("running").cast(pl.Float64).alias("running"),
            x.field("waiting").cast(pl.Float64).alias("waiting"),
            x.field("usage").cast(pl.Float64).alias("gpu_kv_cache_usage_pct"),
            x.field("hit").cast(pl.Float64).alias("prefix_cache_hit_rate_pct"),
            x.field("ext").cast(pl.Float64).alias("external_prefix_cache_hit_rate_pct"),
            x.field("engine").cast(pl.Int64).alias("engine_index"),
        ).struct.json_encode()
        result.event_frames.append(
            stats.select(
                *_event_base(stats, "engine_stats"),
                pl.lit(None, pl.String).alias("request_id"),
                pl.lit(None, pl.String).alias("remote_engine_id"),
                details.alias("details"),
            )
        )
    expired = _matching(events, _EXPIRED_LINE, "request")
    if expired.height:
        x = pl.col("x").struct
        details = pl.struct(
            x.field("workers").cast(pl.Int64).alias("workers_read"),
            pl.when(x.field("timeout").is_null())
            .then(pl.lit("lease"))
            .otherwise(pl.lit("abort_timeout"))
            .alias("era"),
            x.field("timeout").cast(pl.Int64).alias("timeout_s"),
        ).struct.json_encode()
        result.event_frames.append(
            expired.select(
                *_event_base(expired, "kv_expired"),
                x.field("request").alias("request_id"),
                pl.lit(None, pl.String).alias("remote_engine_id"),
                details.alias("details"),
            )
        )
    done = pl.concat([kv["line_number"], stats["line_number"], expired["line_number"]])
    return events.filter(~pl.col("line_number").is_in(done.implode()))


def _line_hash(text: str) -> str:
    """The interval's key beside its time and process: a hash of the line as written, so that
    two lines of one second are two intervals and the same line read twice is one."""
    return hashlib.md5(text.encode()).hexdigest()


def _rank(process: str | None) -> int | None:
    if not process:
        return None
    match = _RANK.search(process)
    if not match:
        return None
    return _int(match.group(1) or match.group(2), _INT32_MAX)


_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1


def _int(text: str | None, high: int = _INT64_MAX) -> int | None:
    """A whole number of a log line (thousands separators allowed) that its column can hold
    (0 to ``high``), else None: the caller rejects the line."""
    if text is None or not text.isascii():  # int() would take other scripts' digits too
        return None
    try:
        value = int(text.replace(",", ""))
    except ValueError:
        return None
    return value if 0 <= value <= high else None


def _real(text: str | None) -> float | None:
    """A finite decimal of a log line (thousands separators allowed), else None."""
    if text is None or not text.isascii():
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _text(value: object) -> str | None:
    """An id from a failure context as text: a dict's repr may hold anything there."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _jsonable(value: object) -> object:
    """A parsed literal as JSON can hold it: text keys, finite numbers, lists for tuples and
    sets (a context may hold any literal; literal_eval bounds its depth)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)  # bytes, complex numbers, Ellipsis


def lines_frame(first_line: int, lines: pl.Series) -> pl.DataFrame:
    """(line_number, raw) for ``lines``, numbered from ``first_line``."""
    return pl.DataFrame({"raw": lines.cast(pl.String)}).select(
        pl.int_range(first_line, first_line + lines.len(), dtype=pl.Int64).alias("line_number"), pl.col("raw")
    )


def parse_chunk(
    ctx: LogContext, frame: pl.DataFrame, final: bool, result: LogResult, *, growing: bool = False
) -> None:
    """Parse ``frame`` (line_number, raw), after the carried tail of the previous chunk."""
    if ctx.carry:
        carried = pl.DataFrame(ctx.carry, schema={"line_number": pl.Int64, "raw": pl.String}, orient="row")
        frame = pl.concat([carried, frame])
    if ctx.tty is None:
        ends = frame.filter(pl.col("raw").str.len_bytes() > 0)["raw"].str.ends_with("\r")
        if ends.len() >= 2:
            ctx.tty = bool(ends.all())
    events, ctx.carry, top_rank = _events_frame(frame, final, bool(ctx.tty), growing)
    if top_rank is not None and (ctx.max_tp_rank is None or top_rank > ctx.max_tp_rank):
        # Worker_TP<r> processes exist for every rank (vLLM names them so only at TP 2 or
        # more): the highest rank seen gives the TP size, unless a line states it.
        ctx.max_tp_rank = int(top_rank)
        if ctx.logged_tp is None:
            result.engine["tp_size"] = max(ctx.max_tp_rank + 1, 2)
    events = _with_ts(ctx, _impossible_stamps(events, result), result)
    indices = _engine_indices(ctx, events)
    events = _bulk_kinds(events, result)
    for event in events.iter_rows(named=True):
        _parse_event(ctx, event, result)
    for row in result.intervals:
        row["engine_index"] = indices.get(row["line_number"])


def _engine_indices(ctx: LogContext, events: pl.DataFrame) -> dict[int, int | None]:
    """The engine index of each `KV Transfer metrics` event (by line number), when above 0.

    With data parallelism one API server logs each engine's `Engine NNN:` line followed by
    its KV line, often within one second: the index tells those KV lines apart.
    """
    if events.height == 0:
        return {}
    index = pl.col("message").str.extract(r"^Engine (\d+):").cast(pl.Int64, strict=False)
    aggregated = pl.col("message").str.contains(r"^\d+ Engines Aggregated:")
    marks = events.select(
        "line_number",
        "process",
        pl.when(aggregated).then(pl.lit(-1, pl.Int64)).otherwise(index).alias("index"),
        pl.col("message").str.starts_with("KV Transfer metrics:").alias("kv"),
    ).filter(pl.col("index").is_not_null() | pl.col("kv"))
    found: dict[int, int | None] = {}
    for line, process, value, kv in marks.iter_rows():
        key = process or ""
        if value is not None:
            ctx.engine_index[key] = value
        elif kv:
            last = ctx.engine_index.get(key)
            found[line] = last if last is not None and last > 0 else None
    return found


def _parse_event(ctx: LogContext, event: dict, result: LogResult) -> None:
    message: str = event["message"] or ""
    ts = event["ts"]
    process = event["process"]
    base = {
        "ts": ts,
        "process": process,
        "rank": _rank(process),
        "level": event["level"],
        "line_number": event["line_number"],
        "request_id": None,
        "remote_engine_id": None,
        "details": None,
        "stamp": event["stamp"],
    }

    def emit(kind: str, **extra: object) -> None:
        row = {**base, "kind": kind, "message": message[:MESSAGE_LIMIT], **extra}
        if isinstance(row["details"], dict):
            row["details"] = json.dumps(row["details"], default=str)
        result.events.append(row)

    def reject(reason: str) -> None:
        result.rejects.append(
            {"line_number": event["line_number"], "reason": reason, "raw": event["first_text"][:RAW_LIMIT]}
        )

    def unparsed(what: str) -> None:
        reject(f"{what} line whose fields do not parse")

    engine = result.engine
    if event["cut"] and any(pattern.search(message) for pattern in _READ):
        # read only in part, a line hybridtrace reads could say something it does not (a
        # request id or an id list cut short): a reject. A long warning is still one.
        reject(f"line longer than {LINE_LIMIT} characters")
        return
    if match := _TOPOLOGY.search(message):
        tp = _int(match.group(1) or match.group(2), _INT32_MAX)
        if not tp:  # a TP size is at least 1
            unparsed("transfer plan")
            return
        ctx.logged_tp = engine["tp_size"] = tp
        engine.setdefault("ts", ts)
        return
    if match := _ENGINE_ID.search(message):
        engine.setdefault("engine_id", match.group(1))
        engine.setdefault("ts", ts)
        if (
            message.startswith("Initializing NIXL worker") and (process or "").startswith("EngineCore")
            and ctx.logged_tp is None and ctx.max_tp_rank is None
        ):  # fmt: skip
            engine["tp_size"] = 1  # the engine core runs the worker itself only without TP
        return
    if message.startswith("KV Transfer metrics:"):
        body = message[len("KV Transfer metrics:") :].strip()
        values = _kv_pairs(body)
        if values is None or "transfers" not in values:
            reject("KV Transfer metrics line whose fields do not parse")
            return
        result.intervals.append(
            {
                "end_ts": ts,
                "process": process,
                "line_number": event["line_number"],
                "line_hash": _line_hash(event["first_text"]),
                **values,
            }
        )
        return
    if match := _ENGINE_STATS.match(message):
        stats = _engine_stats(match.group(3))
        if stats is None:
            reject("Engine throughput line whose fields do not parse")
            return
        stats["engine_index"] = _int(match.group(1)) if match.group(1) else None
        if match.group(1) and stats["engine_index"] is None:
            reject("Engine throughput line whose fields do not parse")
            return
        emit("engine_stats", details=stats)
        return
    for pattern, key, convert, what in (
        (_BLOCK, "block_tokens", _int, "attention block size"),
        (_PADDING, "mamba_padding_pct", _real, "Mamba page padding"),
        (_PAD_LAYERS, "padding_layers", _int, "padding layers"),
        (_LAYOUT, "kv_layout", str, "KV cache layout"),
    ):
        if match := pattern.search(message):
            value = convert(match.group(1))
            if value is None:
                unparsed(what)
                return
            engine[key] = value
            engine.setdefault("ts", ts)
            if event["level"] in ("WARNING", "ERROR", "CRITICAL") and key != "padding_layers":
                emit(event["level"].lower())
            return
    size, concurrency = _KV_SIZE.search(message), _CONCURRENCY.search(message)
    if size or concurrency:
        tokens = _int(size.group(1)) if size else None
        most = _real(concurrency.group(2)) if concurrency else None
        if (size and tokens is None) or (concurrency and most is None):
            unparsed("KV cache size" if size and tokens is None else "maximum concurrency")
            return
        if size:
            engine["kv_cache_tokens"] = tokens
        if concurrency:
            engine["max_concurrency"] = most
        engine.setdefault("ts", ts)
        return
    if match := _SSM_REG.search(message):
        conv, ssm = _int(match.group(1)), _int(match.group(2))
        if conv is None or ssm is None:
            unparsed("Hybrid SSM registration")
            return
        engine["conv_state_bytes"], engine["ssm_state_bytes"] = conv, ssm
        engine.setdefault("ts", ts)
        return
    if match := _REGISTER.search(message):
        engine["kv_buffer_device"] = match.group(2)
        engine["use_host_buffer"] = match.group(3) == "True"
        engine.setdefault("ts", ts)
        return
    if match := _HASH_OK.search(message):
        emit("handshake_ok", details={"hash": match.group(1)})
        return
    if match := _EXPIRED.search(message):
        era = "abort_timeout" if match.group(4) else "lease"
        workers, timeout = _int(match.group(2)), _int(match.group(4))
        if workers is None or (match.group(4) and timeout is None):
            unparsed("KV expiry")
            return
        details: dict = {"workers_read": workers, "era": era}
        if match.group(4):
            details["timeout_s"] = timeout
        emit("kv_expired", request_id=match.group(1), details=details)
        return
    if match := _UNRECOGNISED_READ.search(message):
        emit("kv_expired_read", request_id=match.group(1))
        return
    if match := _DECLINED.search(message):
        emit("kv_expired_declined", request_id=match.group(1), remote_engine_id=match.group(2))
        return
    if match := _FAILURE.search(message):
        context = _literal_dict(match.group(2))
        if context is None:
            reject("NIXL transfer failure whose context does not parse")
            return
        context = _jsonable(context)  # type: ignore[assignment]
        context["failure"] = match.group(1)
        failure_type = str(context.get("failure_type") or match.group(1).split(".")[0])
        emit(
            "notification_failed" if failure_type in _NOT_A_READ else "transfer_failed",
            request_id=_text(context.get("request_id")),
            remote_engine_id=_text(context.get("remote_engine_id")),
            details=context,
        )
        if mismatch := _HASH_MISMATCH.search(message):
            # the handshake's traceback says why: the engines' configurations differ
            emit(
                "handshake_mismatch",
                remote_engine_id=_text(context.get("remote_engine_id")),
                details={"local_hash": mismatch.group(1), "remote_hash": mismatch.group(2)},
            )
        return
    if match := _LOAD_FAILED.search(message):
        ids = re.findall(r"[\w.:\-]+", match.group(4))
        requests, tokens = _int(match.group(1)), _int(match.group(3))
        if requests is None or tokens is None:
            unparsed("KV load failure")
            return
        details = {"requests": requests, "policy": match.group(2), "tokens": tokens}
        for request_id in ids or [None]:
            emit("kv_load_failed", request_id=request_id, details=details)
        return
    if match := _LOAD_RECOVERED.search(message):
        requests, tokens = _int(match.group(1)), _int(match.group(2))
        if requests is None or tokens is None:
            unparsed("KV load recovery")
            return
        emit("kv_load_recovered", details={"requests": requests, "tokens": tokens})
        return
    if match := _POST_SKIPPED.search(message):
        emit("kv_post_skipped", request_id=match.group(1))
        return
    if match := _HASH_MISMATCH.search(message):
        emit("handshake_mismatch", details={"local_hash": match.group(1), "remote_hash": match.group(2)})
        return
    for opening, what in _RECOGNISED:
        if opening.search(message):
            reject(f"{what} line whose fields do not parse")
            return
    if event["level"] in ("WARNING", "ERROR", "CRITICAL"):
        emit(event["level"].lower())


def _kv_pairs(body: str) -> dict | None:
    """``k=v, k=v`` pairs of the standard line, or the dict of a MultiConnector line."""
    pairs: dict[str, str] = {}
    if re.match(r"^[\w.\-]+=\{", body):  # MultiConnector: <connector>={...}, <connector>={...}
        # numpy 2 prints a rounded numpy scalar as np.float64(3.5); a dict's repr prints
        # infinity and NaN as bare words, which are no literals: quoted, they read as text
        text = re.sub(r"\bnp\.\w+\(([^()]*)\)", r"\1", body)
        text = re.sub(r"(:\s*)(-?inf|nan)(?=\s*[,}])", r"\1'\2'", text)
        connectors = _literal_dict("{" + re.sub(r"(^|, )([\w.\-]+)=\{", r"\1'\2': {", text) + "}")
        if connectors is None or not all(isinstance(v, dict) for v in connectors.values()):
            return None
        # the NIXL connector's statistics: the one dict with its keys (another connector,
        # such as CPU offloading, reports keys of its own)
        nixl = [v for v in connectors.values() if any(key in _KV_KEYS for key in v)]
        if len(nixl) != 1:
            return None
        pairs = {str(k): str(v) for k, v in nixl[0].items()}
    else:
        for item in body.split(", "):
            if "=" not in item:
                return None
            key, _, value = item.rpartition("=")
            pairs[key.strip()] = value.strip()
    values: dict[str, float | int | None] = {}
    for key, raw in pairs.items():
        if key not in _KV_KEYS:
            continue
        column, scale = _KV_KEYS[key]
        if column in _KV_COUNTS:
            # a count vLLM prints as an integer (numpy's as 3.0 in a MultiConnector dict)
            number = _real(raw)
            if number is None or not number.is_integer() or not 0 <= number <= _INT64_MAX:
                return None
            values[column] = int(number)
            continue
        number = _real(raw)
        if number is None and column == "throughput_mib_s" and raw.strip() in ("inf", "nan"):
            # vLLM divides the MiB by numpy's sum of the transfer times, which is 0 when NIXL
            # timed every read at 0 µs: it prints inf (nan with no bytes). The line is real,
            # the ratio unknown. Any other number that is not finite is no measurement.
            values[column] = None
            continue
        if number is None:
            return None
        values[column] = number * scale
    return values


def _engine_stats(body: str) -> dict | None:
    stats: dict[str, float] = {}
    for item in body.split(", "):
        key, sep, value = item.partition(": ")
        if not sep:
            continue
        number = re.match(r"([\d.]+)", value.strip())
        if number:
            parsed = _real(number.group(1))
            if parsed is None:  # "1.2.3", or too large for a double
                return None
            name = re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")
            unit = "tokens_s" if "tokens/s" in value else ("pct" if value.strip().endswith("%") else "")
            stats[f"{name}_{unit}".rstrip("_")] = parsed
    return stats or None


def _literal_dict(text: str) -> dict | None:
    """A Python dict repr parsed safely (literals only, never code)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def finish(ctx: LogContext, result: LogResult) -> str:
    """The engine id every row of this object belongs to."""
    return result.engine.get("engine_id") or ctx.engine_id or ctx.fallback_engine_id


def intervals_with_starts(ctx: LogContext, rows: list[dict]) -> list[dict]:
    """Each interval starts where the previous line of the same process (and engine) ended."""
    for row in sorted(rows, key=lambda r: (r["end_ts"] is None, r["end_ts"] or 0)):
        key = (row["process"], row.get("engine_index"))
        row["start_ts"] = ctx.last_interval_end.get(key)
        ctx.last_interval_end[key] = row["end_ts"]
    return rows
