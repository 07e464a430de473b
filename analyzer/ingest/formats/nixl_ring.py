"""NIXL's telemetry ring files (``nixl-telemetry.md`` §1.4) as an input format.

A ring is binary and NIXL rewrites it in place, so it fits ``Resume.NONE``: recognised by
its header and size alone, read whole as one snapshot each time it changed, never resumed.
Parsing is ``hybridtrace.ingest.nixl_ring``'s; the file is only read.
"""

from __future__ import annotations

import time

from hybridtrace.ingest.formats.base import Chunk, Format, Head, ObjectContext, Parsed, Parser, Resume
from hybridtrace.ingest.nixl_ring import RingError, looks_like_ring, parse_ring, ring_tables


class _RingParser(Parser):
    def __init__(self, context: ObjectContext) -> None:
        self.context = context

    def feed(self, chunk: Chunk) -> Parsed:
        parsed = Parsed()
        try:
            ring = parse_ring(chunk.lines.block, self.context.obj.name)
        except RingError as exc:
            parsed.error = f"cannot read the NIXL ring: {exc}"
            return parsed
        # A later read is a new snapshot: transfers an earlier one held have the same key
        # (agent, slot and content), so they count as duplicates, not stored twice.
        transfers, snapshot = ring_tables(ring, chunk.source_id, time.time())
        parsed.add("nixl_transfers", transfers)
        parsed.add("nixl_rings", snapshot)
        parsed.lines = ring.events
        return parsed


class NixlRing(Format):
    name = "nixl_ring"
    resume = Resume.NONE
    tables = ("nixl_transfers", "nixl_rings")
    doc = "NIXL telemetry rings"

    def sniff(self, head: Head) -> bool:
        return looks_like_ring(head.data, head.size)

    def parser(self, context: ObjectContext) -> Parser:
        return _RingParser(context)
