"""An ingest batch (the rows and manifest rows of one commit) and its commit: rows the store
already holds are dropped by their table key, and each manifest row counts what it added."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from hybridtrace.ingest.summary import IngestSummary
from hybridtrace.schema import table_schema
from hybridtrace.store import Store, concat, dedupe, new_batch_id

# Every table a batch may fill, in the order the summary counts them (a table a new format
# fills is added after them). Every one is deduped against the store by its key.
DATA_TABLES = (
    "transfers",
    "requests",
    "engines",
    "models",
    "intervals",
    "log_events",
    "prom_samples",
    "rejects",
    "nixl_transfers",
    "nixl_rings",
)


class Batch:
    """Rows per table and the manifest rows of the objects (or slices) they were read from."""

    def __init__(self) -> None:
        self.id = new_batch_id()
        self.tables: dict[str, list[pa.Table]] = {name: [] for name in DATA_TABLES}
        self.sources: list[dict] = []
        self.rows = 0

    def add(self, table: str, data: pa.Table) -> None:
        if data.num_rows:
            self.tables.setdefault(table, []).append(data)
            self.rows += data.num_rows


def commit(store: Store, batch: Batch, summary: IngestSummary) -> None:
    """Dedupe and write one batch (on the writer thread)."""
    tables: dict[str, pa.Table] = {}
    duplicates_by_source: dict[str, int] = {}
    lost_rows: dict[tuple[str, str], int] = {}  # (source, table) → rows dropped as duplicates
    for name, parts in batch.tables.items():
        data = concat(parts, table_schema(name))
        if data.num_rows:
            kept, dropped = dedupe(store, name, data)
            if dropped:
                kept_map = {d["values"]: d["counts"] for d in pc.value_counts(kept["source_id"]).to_pylist()}
                for item in pc.value_counts(data["source_id"]).to_pylist():
                    lost = item["counts"] - kept_map.get(item["values"], 0)
                    if lost:
                        duplicates_by_source[item["values"]] = (
                            duplicates_by_source.get(item["values"], 0) + lost
                        )
                        lost_rows[(item["values"], name)] = lost
            data = kept
            summary.duplicates += dropped
        tables[name] = data
        summary.rows[name] = summary.rows.get(name, 0) + data.num_rows
    for row in batch.sources:
        row["duplicates"] = duplicates_by_source.get(row["source_id"], 0)
        if row["duplicates"] and row.get("rows"):
            # `rows` counts what the object added to the store: its duplicates are not written
            counts = json.loads(row["rows"])
            for table in counts:
                counts[table] -= lost_rows.get((row["source_id"], table), 0)
            row["rows"] = json.dumps(counts)
    sources = pa.Table.from_pylist(batch.sources, schema=table_schema("sources").arrow_schema())
    store.write_batch(batch.id, tables, sources)
