"""nixlbench's text output as link calibration points (``docs/ingest.md``, "nixlbench output").

Recognised by its configuration banner or its table header; read whole when it changes,
parsed once by ``hybridtrace.ingest.nixlbench``; one ``nixlbench_points`` row per table row.
"""

from __future__ import annotations

import json

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

_NUMBERS = ("gb_per_s", "aggregate_gb_per_s", "network_util_pct", "avg_latency_us", "avg_prep_us",
            "p99_prep_us", "avg_post_us", "p99_post_us", "avg_tx_us", "p99_tx_us")  # fmt: skip


class _BenchParser(WholeParser):
    def parse_whole(self, chunk: Chunk) -> Parsed:

        from hybridtrace.ingest.nixlbench import parse_nixlbench

        bench = parse_nixlbench(self.data().decode("utf-8", "replace"))
        config = bench.config
        obj = self.context.obj
        rows = []
        for point in bench.rows:
            block, batch = point.get("block_bytes"), point.get("batch_size")
            post, tx = point.get("avg_post_us"), point.get("avg_tx_us")
            rows.append({
                "origin": self.context.uri,
                "link": obj.folder or obj.stem,
                "backend": config.get("backend"),
                "op_type": config.get("op_type"),
                "initiator_seg_type": config.get("initiator_seg_type"),
                "target_seg_type": config.get("target_seg_type"),
                "config": json.dumps(config, sort_keys=True),
                "block_bytes": block,
                "batch_size": batch,
                "request_bytes": block * batch if block is not None and batch is not None else None,
                **{name: point.get(name) for name in _NUMBERS},
                # NIXL's own transfer time runs from the post's start: post + the time after it
                "xfer_us": post + tx if post is not None and tx is not None else None,
                "source_id": chunk.source_id,
                "line_number": point["line_number"],
            })  # fmt: skip
        parsed = Parsed()
        parsed.add_rows("nixlbench_points", rows)
        parsed.reject_lines(bench.rejects)
        return parsed


class Nixlbench(Format):
    name = "nixlbench"
    resume = Resume.WHOLE
    tables = ("nixlbench_points",)
    doc = "nixlbench output"

    def sniff(self, head: Head) -> bool:
        from hybridtrace.ingest.nixlbench import looks_like_nixlbench

        return looks_like_nixlbench(head.data)

    def parser(self, context: ObjectContext) -> Parser:
        return _BenchParser(context)
