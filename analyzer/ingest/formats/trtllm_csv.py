"""TensorRT-LLM's KV-cache transfer CSVs (``docs/other-engines.md``) as an input format.

Recognised by their own header lines; read whole when they change (a CSV needs its header
line) and parsed once, at the end, by ``hybridtrace.ingest.trtllm``.
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


class _CsvParser(WholeParser):
    def parse_whole(self, chunk: Chunk) -> Parsed:
        from hybridtrace.ingest.trtllm import parse_trtllm

        context = self.context
        tables, rejects = parse_trtllm(self.data(), chunk.source_id, name=context.uri, tz=context.tz)
        parsed = Parsed()
        for name, table in tables.items():
            parsed.add(name, table)
        parsed.reject_lines(rejects)
        return parsed


class TrtllmCsv(Format):
    name = "trtllm_csv"
    resume = Resume.WHOLE
    tables = ("transfers", "engines")
    doc = "Other engines' transfer telemetry"

    def sniff(self, head: Head) -> bool:
        from hybridtrace.ingest.trtllm import looks_like_trtllm

        return looks_like_trtllm(head.data, head.name)

    def parser(self, context: ObjectContext) -> Parser:
        return _CsvParser(context)
