"""vLLM's server log (``docs/ingest.md``, "vLLM server logs") as an input format.

Parsing is ``hybridtrace.ingest.vllm_log``'s; this holds how a log is recognised, that it
is read on as it grows (an event spanning lines at a chunk's end is kept back for the
next chunk; a resumed read goes on from the latest stamp, for the year), and how its
events, intervals and engine facts become ``log_events``, ``intervals`` and ``engines`` rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.ingest.detect import COLLECTOR_STAMP, LOGGING_PREFIX
from hybridtrace.ingest.formats.base import Chunk, Format, Head, ObjectContext, Parsed, Parser, Resume
from hybridtrace.ingest.rows import constant, rows_table, with_day
from hybridtrace.ingest.stream import Lines, decode_lines

# without a NIXL engine id in the log, the instance is named by its folder: one rule,
# shared with the views (store/instances.py)
from hybridtrace.store.instances import folder_engine_id

if TYPE_CHECKING:
    import polars as pl

    from hybridtrace.ingest import vllm_log
    from hybridtrace.ingest.envelope_log import EnvelopeLog

# "(Worker_TP1 pid=306) INFO 04-21 10:02:11 [worker.py:367] ..." with or without the
# process prefix, the opening bracket, or ANSI colour.
_VLLM_LINE = re.compile(
    # after a collector's stamp, then " | " or a space
    rb"^(?:" + COLLECTOR_STAMP.encode() + rb"(?: \| | ))?"
    rb"(?:\x1b\[[0-9;]*m)?(?:\([A-Za-z][\w]*(?: rank=\d+)? pid=\d+\)(?:\x1b\[[0-9;]*m)? )?"
    rb"(?:" + LOGGING_PREFIX.encode() + rb" )?"
    rb"(?:\x1b\[[0-9;]*m)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?:\x1b\[[0-9;]*m)? "
    rb"(?:\x1b\[[0-9;]*m)?\d\d-\d\d \d\d:\d\d:\d\d",
    re.MULTILINE,
)
# a CRI log line's opening (kubelet's container logs): stamp, stream, partial/full tag
_CRI_START = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d) std(?:out|err) [PF]")
SNIFF_BYTES = 16384
HEAD_BYTES = 64 * 1024  # of a resumed log's head, for its TTY shape
# The hash names an event by what the log says, not by where it was read, so the same
# line in a rotated copy is a duplicate.
_EVENT_HASH = "md5(concat_ws('|', process, level, stamp, message, request_id, kind))"


def _instances(text: str | None) -> dict[str, str]:
    """The manifest's record of each instance's engine id (sources.instances)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def tty_shape(path: Path) -> bool | None:
    """Whether the log's lines all end with a carriage return (written through a TTY), from
    its first lines; None when there are too few to say."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return None
    lines = [line for line in head.split(b"\n")[:-1] if line]
    if len(lines) < 2:
        return None
    return all(line.endswith(b"\r") for line in lines)


def decode_series(lines: Lines, first_line: int) -> tuple[pl.Series, list[dict]]:
    """Lines as a polars Series, split without a Python list when the block is valid UTF-8."""
    import polars as pl

    if not lines:
        return pl.Series("raw", [], dtype=pl.String), []
    block = lines.block
    # polars' CSV reader splits and checks UTF-8 on every core, several times faster than
    # decoding and splitting here; it would also take "\r" for part of a line end, a BOM
    # for no text and the separator for a second field, so those blocks go the long way
    if b"\r" not in block and b"\x1f" not in block and not block.startswith(b"\xef\xbb\xbf"):
        try:
            frame = pl.read_csv(block, has_header=False, separator="\x1f", quote_char=None,
                                new_columns=["raw"], schema={"raw": pl.String})  # fmt: skip
        except pl.exceptions.ComputeError:  # invalid UTF-8: said line by line below
            frame = None
        if frame is not None and frame.height == len(lines):  # a blank last line is dropped
            return frame["raw"].fill_null(""), []
    try:
        text = lines.block.decode("utf-8")
    except UnicodeDecodeError:
        texts, bad = decode_lines(lines, first_line)
        return pl.Series("raw", texts, dtype=pl.String), bad
    return pl.Series("raw", [text]).str.split("\n").explode(), []


def _event_columns() -> dict:
    import polars as pl

    return {
        "ts": pl.Float64,
        "process": pl.String,
        "rank": pl.Int32,
        "level": pl.String,
        "line_number": pl.Int64,
        "kind": pl.String,
        "message": pl.String,
        "stamp": pl.String,
        "request_id": pl.String,
        "remote_engine_id": pl.String,
        "details": pl.String,
    }


def _event_table(result: vllm_log.LogResult) -> pa.Table | None:
    import polars as pl

    columns = _event_columns()
    frames = [f.select(list(columns)).cast(columns) for f in result.event_frames]
    if result.events:
        frames.append(pl.DataFrame(result.events, schema=columns))
    if not frames:
        return None
    return pl.concat(frames).to_arrow()


class _LogParser(Parser):
    def __init__(self, context: ObjectContext) -> None:
        self.context = context
        self.ctx: vllm_log.LogContext | None = None
        # the envelope the log's lines arrive in (envelopes.py): "" for a bare log, None
        # until the first chunk says
        self.envelope: str | None = None
        self.enveloped: EnvelopeLog | None = None

    def _context(self, first_line: int) -> vllm_log.LogContext:
        from hybridtrace.ingest import vllm_log

        context = self.context
        ctx = vllm_log.LogContext(
            uri=context.uri,
            mtime=context.obj.mtime,
            year=context.year,
            tz=context.tz,
            engine_id=context.engine_id,
            fallback_engine_id=folder_engine_id(context.obj),
        )
        if first_line > 1 and context.obj.local is not None:
            # a read resumed mid-file decides the TTY shape as the first read did, from
            # the file's head, not from the few lines appended since
            ctx.tty = tty_shape(context.obj.local)
        ctx.resume_ts = context.resume_ts
        return ctx

    def _envelope(self, chunk: Chunk) -> str:
        previous = self.context.previous
        if previous is not None and previous.get("format") == VllmLog.name:
            return previous.get("envelope") or ""  # a resumed read: as the read before found it
        from hybridtrace.ingest.envelopes import sniff

        head = chunk.lines.block[:HEAD_BYTES].decode("utf-8", "replace").split("\n")
        return sniff(head) or ""

    def feed(self, chunk: Chunk) -> Parsed:
        from hybridtrace.ingest import vllm_log

        if self.envelope is None:
            self.envelope = self._envelope(chunk)
        if self.envelope:
            return self._feed_enveloped(chunk)
        if self.ctx is None:
            self.ctx = self._context(chunk.first_line)
        parsed = Parsed()
        series, bad = decode_series(chunk.lines, chunk.first_line)
        parsed.reject(bad)
        result = vllm_log.LogResult()
        # a last event of several lines (a traceback being written) can still gain lines until
        # the log has gone quiet: till then it is held back, and the next read takes it whole
        vllm_log.parse_chunk(self.ctx, vllm_log.lines_frame(chunk.first_line, series), chunk.final, result,
                             growing=not chunk.quiet)  # fmt: skip
        engine_id = vllm_log.finish(self.ctx, result)
        if result.engine.get("engine_id"):
            self.ctx.engine_id = parsed.learned_engine_id = result.engine["engine_id"]
        parsed.engine_id = engine_id
        self._rows(parsed, chunk.source_id, result, engine_id)
        carried = self.ctx.carry
        parsed.kept_back = (sum(len(t.encode()) + 1 for _, t in carried), len(carried))
        return parsed

    def _feed_enveloped(self, chunk: Chunk) -> Parsed:
        """A log inside an envelope: unwrapped, then parsed per instance it names."""
        from hybridtrace.ingest.envelope_log import EnvelopeLog, instance_key
        from hybridtrace.ingest.envelopes import NO_INSTANCE, instance_from_path

        context = self.context
        log = self.enveloped
        if log is None:
            known = _instances((context.previous or {}).get("instances"))
            if context.engine_id:
                known.setdefault(instance_key(NO_INSTANCE), context.engine_id)
            log = self.enveloped = EnvelopeLog(
                kind=self.envelope or "", uri=context.uri, mtime=context.obj.mtime, year=context.year,
                tz=context.tz, folder_engine_id=folder_engine_id(context.obj),
                path_instance=instance_from_path(context.uri), engine_ids=known, resume_ts=context.resume_ts,
            )  # fmt: skip
        parsed = Parsed()
        texts, bad = decode_lines(chunk.lines, chunk.first_line)
        parsed.reject(bad)
        sizes = [len(raw) for raw in chunk.lines.split()] if chunk.lines else []
        results, rejects = log.parse(texts, chunk.first_line, chunk.final, sizes)
        parsed.reject(rejects)
        for item in results:
            self._rows(parsed, chunk.source_id, item.result, item.engine_id, item.ctx)
        unnamed = log.contexts.get(NO_INSTANCE)
        engines = {item.engine_id for item in results}
        if unnamed is not None:
            parsed.engine_id = unnamed.engine_id or unnamed.fallback_engine_id
            parsed.learned_engine_id = unnamed.engine_id
        elif len(engines) == 1:
            parsed.engine_id = next(iter(engines))
        parsed.manifest = {"envelope": self.envelope, "instances": log.instances_json()}
        parsed.kept_back = log.kept_back(chunk.first_line + len(chunk.lines))
        return parsed

    def latest_ts(self) -> float | None:
        if self.enveloped is not None:
            latest = self.enveloped.latest_ts()
            return latest if latest is not None else self.context.resume_ts
        if self.ctx is None:
            return None
        return self.ctx.latest_ts if self.ctx.latest_ts is not None else self.ctx.resume_ts

    def _rows(self, parsed: Parsed, sid: str, result: vllm_log.LogResult, engine_id: str,
              ctx: vllm_log.LogContext | None = None) -> None:  # fmt: skip
        from hybridtrace.ingest import vllm_log

        events = _event_table(result)
        if events is not None:
            query = f"SELECT * EXCLUDE (stamp), {_EVENT_HASH} AS event_hash FROM events"
            hashed = self.context.connect().sql(query).to_arrow_table()
            hashed = constant(constant(hashed, "engine_id", engine_id), "source_id", sid)
            parsed.add("log_events", with_day(hashed, "ts"))
        if result.intervals:
            table = rows_table(vllm_log.intervals_with_starts(ctx or self.ctx, result.intervals))
            for name, value in (("engine_id", engine_id), ("source_kind", "log"), ("source_id", sid)):
                table = constant(table, name, value)
            parsed.add("intervals", with_day(table, "end_ts"))
        facts = {k: v for k, v in result.engine.items() if k != "engine_id"}
        if facts:
            first_ts = next((e["ts"] for e in result.events if e["ts"] is not None), None)
            if first_ts is None and events is not None and events.num_rows:
                first_ts = pc.min(events["ts"]).as_py()
            facts.setdefault("ts", first_ts)
            engine = {**facts, "engine_id": engine_id, "source_kind": "log", "source_id": sid,
                      "line_number": 0}  # fmt: skip
            parsed.add("engines", with_day(pa.Table.from_pylist([engine]), "ts"))
        parsed.reject(result.rejects)


class VllmLog(Format):
    name = "vllm_log"
    resume = Resume.LINES
    tables = ("log_events", "intervals", "engines")
    doc = "vLLM server logs"

    def sniff(self, head: Head) -> bool:
        if _VLLM_LINE.search(head.data[:SNIFF_BYTES]) is not None:
            return True
        data = head.data.lstrip()
        if data[:1] == b"{" or _CRI_START.match(data):
            # vLLM lines inside a runtime's or collector's envelope (envelopes.py)
            from hybridtrace.ingest.envelopes import sniff

            return sniff(head.data.decode("utf-8", "replace").split("\n")) is not None
        return False

    def parser(self, context: ObjectContext) -> Parser:
        return _LogParser(context)
