"""Writing ``verifications`` rows: the store's batch commit, as ingest uses it.

Rows are committed in batches with ``Store.write_batch``: data files first, then the
batch's ``sources`` row (format ``verify``) as the commit, under the store's writer lock.
A verify killed at any moment leaves the batches it committed and nothing half-written;
the next writer's recovery removes what an interrupted batch left. The lock is taken per
commit, not for the whole run, so a long verify does not keep the scheduled ingest out;
a commit that finds an ingest writing waits for it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import time
from collections.abc import Callable

import pyarrow as pa

from hybridtrace.errors import UsageError
from hybridtrace.schema import SCHEMA_VERSION, table_schema
from hybridtrace.store import Store, new_batch_id

BATCH_ROWS = int(os.environ.get("HYBRIDTRACE_VERIFY_BATCH_ROWS", "32"))
BATCH_S = 15.0  # a slow run still commits what it has this often
LOCK_WAIT_S = 600.0  # how long the last commit waits for an ingest holding the writer lock


class VerifyWriter:
    """Collects result rows and commits them in batches."""

    def __init__(self, store: Store, run_id: str, *, on_wait: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.pending: list[dict] = []
        self.committed = 0
        self.batches = 0
        self.last_commit = time.monotonic()
        self.recovered = False
        self.on_wait = on_wait

    def add(self, row: dict) -> None:
        self.pending.append(row)

    def due(self) -> bool:
        return bool(self.pending) and (
            len(self.pending) >= BATCH_ROWS or time.monotonic() - self.last_commit >= BATCH_S
        )

    def commit(self, *, wait_s: float = 0.0) -> bool:
        """Commit the pending rows; False when the writer lock stayed held for ``wait_s``."""
        if not self.pending:
            return True
        deadline = time.monotonic() + wait_s
        while True:
            lock = self.store.writer_lock()
            try:
                lock.__enter__()
            except UsageError:
                # another writer (an ingest) holds the lock: wait for it, or keep the rows
                if time.monotonic() >= deadline:
                    if wait_s:
                        raise
                    return False
                if self.on_wait is not None:
                    self.on_wait("waiting for another writer to release the store")
                time.sleep(1.0)
                continue
            try:
                if not self.recovered:
                    self.store.recover()  # what an interrupted batch left goes first
                    self.recovered = True
                self._write(self.pending)
            finally:
                lock.__exit__(None, None, None)
            self.committed += len(self.pending)
            self.batches += 1
            self.pending = []
            self.last_commit = time.monotonic()
            return True

    def _write(self, rows: list[dict]) -> None:
        batch = new_batch_id()
        now = time.time()
        uri = f"verify:{self.run_id}"
        source_id = hashlib.sha256(f"{uri}\0{batch}".encode()).hexdigest()[:32]
        schema = table_schema("verifications")
        # by the schema, not the first row's keys: an error row lacks the comparison's columns
        full = [{**row, "source_id": source_id, "day": dt.datetime.fromtimestamp(row["ts"], dt.UTC).date()}
                for row in rows]  # fmt: skip
        table = pa.Table.from_pylist(full, schema=schema.arrow_schema())
        manifest = {
            "source_id": source_id, "batch_id": batch, "uri": uri, "format": "verify",
            "size_bytes": None, "mtime": now, "etag": "", "version": None,
            "start_offset": self.committed, "end_offset": self.committed + len(rows),
            "end_line": self.committed + len(rows), "lines": len(rows), "end_ts": None,
            "rows": json.dumps({"verifications": len(rows)}), "rejects": 0, "duplicates": 0,
            "status": "ok", "message": None, "engine_id": None, "ingested_at": now,
            "schema_version": SCHEMA_VERSION,
        }  # fmt: skip
        sources = pa.Table.from_pylist([manifest], schema=table_schema("sources").arrow_schema())
        self.store.write_batch(batch, {"verifications": table}, sources)
