"""A user-given map of NIXL agents to engine and rank (``docs/ingest.md``, "Agent maps").

Recognised by its CSV header (``agent_name,engine_id[,rank]``) or its TOML ``[agents]``
table; read whole when it changes, parsed once by ``hybridtrace.ingest.agent_map``.
"""

from __future__ import annotations

import time

from hybridtrace.ingest.formats.base import (
    Chunk,
    Format,
    Head,
    ObjectContext,
    Parsed,
    Parser,
    Resume,
    WholeParser,
)


class _MapParser(WholeParser):
    def parse_whole(self, chunk: Chunk) -> Parsed:

        from hybridtrace.ingest.agent_map import parse_agent_map

        rows, rejects, error = parse_agent_map(self.data())
        parsed = Parsed(error=error)
        now = time.time()
        for row in rows:
            row.update(origin=self.context.uri, ingested_at=now, source_id=chunk.source_id)
        parsed.add_rows("agent_map", rows)
        parsed.reject_lines(rejects)
        if error is not None:
            parsed.reject([{"line_number": 0, "reason": error, "raw": ""}])
        return parsed


class AgentMap(Format):
    name = "agent_map"
    resume = Resume.WHOLE
    tables = ("agent_map",)
    doc = "Agent maps"

    def sniff(self, head: Head) -> bool:
        from hybridtrace.ingest.agent_map import looks_like_agent_map

        return looks_like_agent_map(head.data)

    def parser(self, context: ObjectContext) -> Parser:
        return _MapParser(context)
