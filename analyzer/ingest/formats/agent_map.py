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
        import pyarrow as pa

        from hybridtrace.ingest.agent_map import parse_agent_map
        from hybridtrace.schema import table_schema

        rows, rejects, error = parse_agent_map(self.data())
        parsed = Parsed(error=error)
        now = time.time()
        for row in rows:
            row.update(origin=self.context.uri, ingested_at=now, source_id=chunk.source_id)
        if rows:
            schema = table_schema("agent_map").arrow_schema()
            parsed.add("agent_map", pa.Table.from_pylist(rows, schema=schema))
        parsed.reject([{"line_number": n, "reason": why, "raw": raw} for n, why, raw in rejects])
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
