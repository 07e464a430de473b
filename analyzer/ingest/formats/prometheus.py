"""Prometheus text exposition (a scrape of vLLM's or NIXL's ``/metrics``) as an input format.

Parsing is ``hybridtrace.ingest.prometheus``'s; this holds how a scrape is recognised,
that it is one whole (read again when it changes, its samples deduped by key), and the
``prom_samples`` rows: each names the folder it was found in as its instance.
"""

from __future__ import annotations

import re

from hybridtrace.ingest.formats.base import Chunk, Format, Head, ObjectContext, Parsed, Parser, Resume
from hybridtrace.ingest.rows import rows_table, with_day
from hybridtrace.ingest.stream import decode_lines

_PROM_LINE = re.compile(
    rb"^(?:# (?:HELP|TYPE) [A-Za-z_:][\w:]* |[A-Za-z_:][\w:]*(?:\{[^}]*\})? [-+0-9.eEnaNIf]+)", re.M
)
SNIFF_BYTES = 16384


class _ScrapeParser(Parser):
    def __init__(self, context: ObjectContext) -> None:
        self.context = context

    def feed(self, chunk: Chunk) -> Parsed:
        from hybridtrace.ingest import prometheus

        parsed = Parsed()
        if not chunk.lines:
            return parsed
        obj = self.context.obj
        texts, bad = decode_lines(chunk.lines, chunk.first_line)
        samples, rejects = prometheus.parse_snapshot(texts, chunk.first_line, obj.name, obj.mtime)
        parsed.reject(bad + rejects)
        if samples:
            instance = obj.uri.rsplit("/", 1)[0]  # the folder's path: see _instance_engines
            table = rows_table([{**s, "instance": instance, "source_id": chunk.source_id} for s in samples])
            parsed.add("prom_samples", with_day(table, "ts"))
        return parsed


class Prometheus(Format):
    name = "prometheus"
    resume = Resume.WHOLE
    tables = ("prom_samples",)
    doc = "Prometheus snapshots"

    def sniff(self, head: Head) -> bool:
        sample = head.data[:SNIFF_BYTES]
        return len(_PROM_LINE.findall(sample)) >= 2 and (
            b"# TYPE" in sample or b"vllm:" in sample or b"agent_" in sample
        )

    def parser(self, context: ObjectContext) -> Parser:
        return _ScrapeParser(context)
