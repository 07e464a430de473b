"""SGLang's request time stats (its server log) and transfer metrics (a scrape) as an input
format (``docs/other-engines.md``).

Recognised by their own markers; read whole when they change and parsed once, at the
end, by ``hybridtrace.ingest.sglang``.
"""

from __future__ import annotations

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


class _SglangParser(WholeParser):
    def parse_whole(self, chunk: Chunk) -> Parsed:
        from hybridtrace.ingest.sglang import parse_sglang

        context = self.context
        tables, rejects = parse_sglang(self.data(), chunk.source_id, name=context.uri, year=context.year,
                                       tz=context.tz, scrape_ts=context.obj.mtime)  # fmt: skip
        parsed = Parsed()
        for name, table in tables.items():
            parsed.add(name, table)
        parsed.reject_lines(rejects)
        return parsed


class Sglang(Format):
    name = "sglang"
    resume = Resume.WHOLE
    tables = ("requests", "transfers", "engines", "prom_samples")
    doc = "Other engines' transfer telemetry"

    def sniff(self, head: Head) -> bool:
        from hybridtrace.ingest.sglang import looks_like_sglang

        return looks_like_sglang(head.data, head.name)

    def parser(self, context: ObjectContext) -> Parser:
        return _SglangParser(context)
