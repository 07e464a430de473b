"""The connector trace v1 (JSON Lines, ``docs/trace-format.md``) as an input format.

Parsing is ``hybridtrace.ingest.trace``'s; this holds how a trace is recognised, that it
is read on line by line as it grows, and that its last record is whole when it parses.
"""

from __future__ import annotations

import json

from hybridtrace.ingest.formats.base import (
    Chunk,
    Format,
    Head,
    LastLine,
    ObjectContext,
    Parsed,
    Parser,
    Resume,
)
from hybridtrace.ingest.stream import Lines

_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark some editors and Windows tools put first


def _is_json(data: bytes) -> bool:
    """Whether ``data`` parses as JSON: whether a trace's last record is whole."""
    try:
        json.loads(data)
    except RecursionError:
        # nested deeper than Python's parser goes: whole or not, no check here can tell, so
        # it is read as it is and the trace parser says what is wrong with it
        return True
    except (ValueError, UnicodeDecodeError):
        return False
    return True


class _TraceParser(Parser):
    def __init__(self, context: ObjectContext) -> None:
        self.context = context
        self.fast = None  # the object's fast reader, made when the first chunk is parsed

    def feed(self, chunk: Chunk) -> Parsed:
        from hybridtrace.ingest.trace import FastReader, parse_trace

        if self.fast is None:
            self.fast = FastReader()
        parsed = Parsed()
        lines = chunk.lines
        if lines and chunk.first_line == 1 and lines.block.startswith(_BOM):
            lines = Lines(lines.block[len(_BOM) :], len(lines))
        if lines:
            tables = self.fast.parse(lines.block, chunk.first_line, len(lines), chunk.source_id)
            if tables is None:  # some line is not clean: the careful path says which
                tables, rejects = parse_trace(self.context.connect(), lines.split(), chunk.first_line,
                                              chunk.source_id)  # fmt: skip
                parsed.reject(rejects)
            for name, table in tables.items():
                parsed.add(name, table)
        return parsed


class ConnectorTrace(Format):
    name = "connector_trace"
    resume = Resume.LINES
    tables = ("transfers", "requests", "engines", "log_events")
    doc = "Connector trace"

    def sniff(self, head: Head) -> bool:
        from hybridtrace.ingest.trace import looks_like_trace

        return looks_like_trace(head.data)

    def last_line(self, tail: bytes, quiet: bool) -> LastLine:
        if _is_json(tail):  # a record is whole when it parses, whatever the object's age
            return LastLine.TAKE
        # Cut short for good once the object is quiet: a reject, once (see store.CUT_RECORD)
        return LastLine.CUT if quiet else LastLine.WAIT

    def parser(self, context: ObjectContext) -> Parser:
        return _TraceParser(context)
