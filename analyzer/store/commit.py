"""The store and its commit protocol: batches written, committed, recovered and compacted.

Layout under the store root::

    _meta.json                                   schema version
    transfers/day=2026-11-29/engine_id=d0/part-<batch>-<n>.parquet
    sources/part-<batch>.parquet                 the commit record of a batch
    sources/supersedes-<batch>.json              the batches a compaction replaces

A batch commits when its ``sources`` file appears (written last: by atomic rename in a
folder, by one whole upload in a bucket; see ``roots.py``). Data files carry their batch
id in the name; the views read only files of committed batches (``raw_views.py``), so a
process killed mid-batch leaves a readable store, and the files it left are removed by the
next run, which then reads the same objects again. The writer lock is a file lock or a
bucket lease (``leases.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pyarrow as pa

from hybridtrace.errors import UsageError
from hybridtrace.schema import SCHEMA_VERSION, TABLES, TableSchema, table_schema
from hybridtrace.store.leases import LeaseHeld
from hybridtrace.store.roots import BucketRoot, root_of

if TYPE_CHECKING:
    import duckdb

DEFAULT_STORE = "hybridtrace-data"
# Compaction: batches of at most COMPACT_SMALL_BYTES are merged once there are
# COMPACT_MIN_BATCHES of them, at most COMPACT_MAX_BYTES at a time.
COMPACT_MIN_BATCHES = int(os.environ.get("HYBRIDTRACE_COMPACT_MIN_BATCHES", "32"))
COMPACT_SMALL_BYTES = 64 << 20
COMPACT_MAX_BYTES = 1 << 30
# Superseded files stay this long after their compaction, for readers that listed them.
COMPACT_GRACE_S = float(os.environ.get("HYBRIDTRACE_COMPACT_GRACE_S", "3600"))
# How a null partition value is named (Hive's convention); older stores wrote "None".
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_PART = re.compile(r"^part-(?P<batch>[0-9a-f]{32})(?:-\d+)?\.parquet$")


def default_store() -> str:
    return os.environ.get("HYBRIDTRACE_STORE") or DEFAULT_STORE


def new_batch_id() -> str:
    return uuid.uuid4().hex


def _partition_dir(value: object) -> str:
    """A partition value as a directory name: Hive's for a null, percent-quoted otherwise.

    Engine ids can hold any character, so names are quoted (safe and reversible); a null is
    Hive's ``__HIVE_DEFAULT_PARTITION__``, which Hive, Spark, Trino and Athena read as null.
    The strings that would read as that name, or as an old null ("None", see
    ``legacy_partition``), get their first character quoted, so every name says one thing.
    """
    if value is None:
        return HIVE_NULL
    text = quote(str(value), safe="")
    return f"%{ord(text[0]):02X}{text[1:]}" if text in (HIVE_NULL, "None") else text


def legacy_partition(rel: str) -> bool:
    """Whether a file lies under a ``<column>=None`` directory, how older versions wrote a null.

    Such a directory may also hold the string "None" (the old names could not tell the two
    apart); the files' own partition columns do, and ``migrate`` rewrites by them. A
    directory of this version never ends so: the string is written ``%4Eone``.
    """
    return any(part.endswith("=None") for part in rel.split("/")[1:-1])


def canonical_directory(directory: str) -> str:
    """A partition directory, with the names an old null could have (``None``, now either
    Hive's null or the string "None") made one, for finding the files a key may be in."""
    out = []
    for i, part in enumerate(directory.split("/")):
        column, _, value = part.partition("=")
        out.append(f"{column}=\0" if i and value in ("None", HIVE_NULL, "%4Eone") else part)
    return "/".join(out)


class Store:
    """A store root: a local folder, or a bucket prefix (``s3://…``, ``gs://…``)."""

    def __init__(self, root: str | Path) -> None:
        self.location = str(root)
        self.files = root_of(root)
        self.is_bucket = isinstance(self.files, BucketRoot)
        self._lease_check = None  # set while a bucket writer holds its lease
        # local stores keep a Path for callers that want one
        self.root = Path(root) if not self.is_bucket else None
        # (lowest, highest, any null) of the key's range column of each data file this object
        # wrote: a later batch's dedupe skips the files it cannot collide with (keys.py)
        self.key_ranges: dict[str, tuple[object, object, bool]] = {}
        self._meta: dict | None = None  # _meta.json, read once (again when a writer starts)
        # each table's committed-file digest this process last published to Iceberg
        self.iceberg_synced: dict[str, str] = {}

    def __str__(self) -> str:
        return self.files.display

    # --- layout -----------------------------------------------------------------------

    def init(self) -> None:
        self.check_version()
        self.files.make()
        if not self.files.exists("_meta.json"):
            try:
                self.files.write_text("_meta.json", json.dumps({"schema_version": SCHEMA_VERSION}))
            except FileNotFoundError:
                # another process created the store at the same moment (its recovery may
                # have swept our temporary file): theirs is the same file
                if not self.files.exists("_meta.json"):
                    raise

    @property
    def schema_version(self) -> int | None:
        if not self.files.exists("_meta.json"):
            return None
        try:
            meta = json.loads(self.files.read_text("_meta.json"))
            version = int(meta["schema_version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{self}: _meta.json is damaged ({exc}); this is not a readable store") from exc
        except OSError as exc:
            raise UsageError(f"{self}: cannot read _meta.json: {exc.strerror or exc}") from exc
        self._meta = meta if isinstance(meta, dict) else {}
        return version

    def reload_meta(self) -> None:
        self._meta = None
        self.schema_version  # noqa: B018 (reads _meta.json)

    @property
    def publishes_iceberg(self) -> bool:
        """Whether the store keeps Iceberg tables of its committed state (``iceberg.py``)."""
        if self._meta is None:
            self.schema_version  # noqa: B018 (reads _meta.json)
        return bool((self._meta or {}).get("iceberg"))

    def publish(self) -> None:
        """Bring the store's Iceberg tables to its committed state, when it keeps them."""
        if self.publishes_iceberg:
            from hybridtrace.store.iceberg import sync

            sync(self)

    @contextlib.contextmanager
    def writer_lock(self, lease_s: float | None = None) -> Iterator[None]:
        """Hold the store's writer lock: one ingest at a time (a crashed one releases it).

        A file lock locally; in a bucket, a lease renewed while the ingest runs, which
        expires ``lease_s`` (HYBRIDTRACE_LEASE_S, default 60 s) after a killed run.
        """
        lease_s = lease_s or float(os.environ.get("HYBRIDTRACE_LEASE_S", "60"))
        try:
            with self.files.lock(".writer.lock", lease_s, "another ingest is writing to this store; "
                                 "try again when it ends") as held:  # fmt: skip
                self._lease_check = held.get("check")
                self.reload_meta()  # another process may have changed it (``iceberg.enable``)
                if self.publishes_iceberg:
                    from hybridtrace.store.iceberg import require

                    require(self)  # before anything is written that Iceberg would then miss
                try:
                    yield
                finally:
                    self._lease_check = None
        except LeaseHeld as held:
            raise UsageError(str(held)) from None

    def check_version(self) -> None:
        version = self.schema_version
        if version is not None and version > SCHEMA_VERSION:
            raise UsageError(
                f"{self}: written by a newer hybridtrace (store schema {version}, this one reads "
                f"up to {SCHEMA_VERSION}); upgrade hybridtrace"
            )

    def exists(self) -> bool:
        return self.files.exists("_meta.json")

    def _files(self, table: str) -> list[str]:
        return [f for f in self.files.list_files(table) if _PART.match(f.rsplit("/", 1)[-1])]

    def _parts(self) -> set[str]:
        """Batches that have a ``sources`` file."""
        batches = set()
        for rel in self._files("sources"):
            match = _PART.match(rel.rsplit("/", 1)[-1])
            if match:
                batches.add(match.group("batch"))
        return batches

    def _compactions(self) -> dict[str, dict]:
        """Every compaction's record: its batch -> {"batches": superseded, "committed_at": t}."""
        records = {}
        for rel in self.files.list_files("sources", "supersedes-*.json"):
            batch = rel.rsplit("/", 1)[-1][len("supersedes-") : -len(".json")]
            value = json.loads(self.files.read_text(rel))
            records[batch] = value if isinstance(value, dict) else {"batches": value, "committed_at": 0.0}
        return records

    def committed_batches(self) -> set[str]:
        """Batches with a ``sources`` file, less those a committed compaction superseded."""
        batches = self._parts()
        return batches - self._superseded(batches, self._compactions())

    @staticmethod
    def _superseded(batches: set[str], compactions: dict[str, dict]) -> set[str]:
        """Batches merged into a compaction that committed (its ``sources`` file exists)."""
        gone: set[str] = set()
        for batch, record in compactions.items():
            if batch in batches:
                gone.update(record["batches"])
        return gone

    def committed_files(self, table: str, batches: set[str] | None = None) -> list[str]:
        """Paths (relative to the root) of the table's files in committed batches."""
        batches = self.committed_batches() if batches is None else batches
        out = []
        for rel in self._files(table):
            match = _PART.match(rel.rsplit("/", 1)[-1])
            if match and match.group("batch") in batches:
                out.append(rel)
        return out

    def recover(self) -> int:
        """Remove what interrupted batches and old compactions left; returns how many files went.

        Files of a batch that never committed go at once. Files a compaction superseded go
        only ``COMPACT_GRACE_S`` after it committed: a reader that listed them before the
        commit (``query``, ``analyze`` and ``report`` take no lock) can still open them.
        Then batches with old ``=None`` partition directories are rewritten (``migrate``),
        and the Iceberg tables, for a store that publishes them, are brought up to the
        committed state (``publish``): this is where a run killed between its commit and
        its Iceberg update is repaired. Runs under the writer lock.
        """
        if not self.exists():
            return 0
        parts, compactions = self._parts(), self._compactions()
        superseded_at: dict[str, float] = {}
        for batch, record in compactions.items():
            if batch in parts:
                for old in record["batches"]:
                    superseded_at[old] = min(superseded_at.get(old, float("inf")), record["committed_at"])
        committed = parts - set(superseded_at)
        if self._lease_check is not None:
            self._lease_check()  # a writer that lost its lease deletes nothing another may use
        removed = 0
        for tmp in self.files.leftovers():
            self.files.delete(tmp)
            removed += 1
        files: dict[str, list[str]] = {}
        legacy = False  # a committed file under an old "=None" directory: migrate below
        for table in TABLES:
            for rel in self._files(table):
                match = _PART.match(rel.rsplit("/", 1)[-1])
                if match and match.group("batch") not in committed:
                    files.setdefault(match.group("batch"), []).append(rel)
                elif match:
                    legacy = legacy or legacy_partition(rel)
        now = time.time()
        # the oldest supersessions first, and a batch's sources file last: a crash between
        # deletions never brings a superseded batch back
        kept: set[str] = set()  # superseded batches still within their grace period
        for batch in sorted(files, key=lambda b: superseded_at.get(b, -1.0)):
            if batch in superseded_at and now - superseded_at[batch] < COMPACT_GRACE_S:
                kept.add(batch)
                continue
            for rel in sorted(files[batch], key=lambda r: r.startswith("sources/")):
                self.files.delete(rel)
                removed += 1
        for batch, record in compactions.items():
            # a record goes when its compaction never committed, or none of the batches it
            # lists has a file left (so dropping it cannot bring one back)
            if batch not in parts or not set(record["batches"]) & kept:
                self.files.delete(f"sources/supersedes-{batch}.json")
                removed += 1
        if legacy:
            self.migrate()
        self.publish()
        return removed

    def compact(self, *, min_batches: int = COMPACT_MIN_BATCHES) -> int:
        """Merge the files of many small batches into one batch; returns how many were merged.

        A scheduled job commits a small batch every run, and each adds files to every
        table partition it touches and one ``sources`` file, which every reader lists and
        every run reads. Compaction rewrites the small batches' files as one new batch:
        its data files first (invisible until committed), then the list of batches it
        supersedes, then its ``sources`` file (the merged manifest rows) as the commit;
        readers then ignore the superseded batches, whose files ``recover`` deletes once
        no reader can still be using them. A crash at any step leaves the store readable
        with every row once.
        """
        committed = self.committed_batches()
        sizes, files = self._batch_files(committed)
        chosen, total = [], 0
        for batch in sorted(committed, key=lambda b: sizes.get(b, 0)):
            if sizes.get(batch, 0) > COMPACT_SMALL_BYTES or total + sizes.get(batch, 0) > COMPACT_MAX_BYTES:
                break
            chosen.append(batch)
            total += sizes.get(batch, 0)
        if len(chosen) < min_batches:
            return 0
        self._merge(chosen, files)
        # the superseded files stay for readers that listed them; recover() removes them
        # once the grace period has passed
        self.recover()
        return len(chosen)

    def migrate(self) -> int:
        """Rewrite the batches that have ``<column>=None`` directories; returns how many.

        Older versions named a null partition value "None"; it is Hive's
        ``__HIVE_DEFAULT_PARTITION__`` now (``_partition_dir``). The views read the files'
        own columns (``raw_views.py``: explicit file lists, no Hive partitioning), so they
        read either spelling alike, but other engines read the directory names. The
        batches holding such a directory are rewritten as a compaction is, by the same
        protocol and under the caller's writer lock: a killed migration leaves either
        the old batches committed or the new one (every row once), and the old files
        stay an hour for readers that listed them. ``recover`` runs it.
        """
        committed = self.committed_batches()
        _, files = self._batch_files(committed)
        chosen = sorted(b for b, rels in files.items() if any(legacy_partition(rel) for _, rel in rels))
        if not chosen:
            return 0
        self._merge(chosen, files)
        return len(chosen)

    def _batch_files(self, batches: set[str]) -> tuple[dict[str, int], dict[str, list[tuple[str, str]]]]:
        """Bytes and (table, path) files of each of ``batches``."""
        sizes: dict[str, int] = {}
        files: dict[str, list[tuple[str, str]]] = {}
        for table in TABLES:
            for rel, size in self.files.list_sized(table):
                match = _PART.match(rel.rsplit("/", 1)[-1])
                if match and match.group("batch") in batches:
                    batch = match.group("batch")
                    sizes[batch] = sizes.get(batch, 0) + size
                    files.setdefault(batch, []).append((table, rel))
        return sizes, files

    def _merge(self, chosen: list[str], files: dict[str, list[tuple[str, str]]]) -> str:
        """Write ``chosen`` batches' rows as one new batch that supersedes them; its id.

        A file under an old ``=None`` directory is split again by its rows' own partition
        values, so the merged batch names every partition the current way.
        """
        merged_id = new_batch_id()
        by_partition: dict[tuple[str, str], list[str]] = {}
        pieces: dict[tuple[str, str], list[pa.Table]] = {}
        for batch in chosen:
            for table, rel in files.get(batch, []):
                if table == "sources":
                    continue
                if legacy_partition(rel):  # rare (rows without a time or an engine), and small
                    schema = table_schema(table)
                    for directory, part in partitions(schema, schema.conform(self.files.read_table(rel))):
                        pieces.setdefault((table, directory), []).append(part)
                        by_partition.setdefault((table, directory), [])
                else:
                    by_partition.setdefault((table, rel.rsplit("/", 1)[0]), []).append(rel)
        for n, ((table, directory), rels) in enumerate(sorted(by_partition.items())):
            schema = table_schema(table)
            loaded = (self.files.read_table(rel) for rel in rels)
            data = concat(itertools.chain(loaded, pieces.get((table, directory), [])), schema)
            self.files.write_parquet(data, f"{directory}/part-{merged_id}-{n}.parquet")
        manifest = concat(
            (self.files.read_table(rel) for b in chosen for t, rel in files.get(b, []) if t == "sources"),
            table_schema("sources"),
        )
        record = {"batches": sorted(chosen), "committed_at": time.time()}
        self.files.write_text(f"sources/supersedes-{merged_id}.json", json.dumps(record))
        if self._lease_check is not None:
            self._lease_check()
        self.files.write_parquet(manifest, f"sources/part-{merged_id}.parquet")  # the commit
        return merged_id

    # --- writing ----------------------------------------------------------------------

    def write_batch(self, batch_id: str, tables: dict[str, pa.Table], sources: pa.Table) -> None:
        """Write a batch's data files, then commit it by writing its ``sources`` file."""
        for name, data in tables.items():
            if data.num_rows:
                self._write_table(batch_id, table_schema(name), data)
        schema = table_schema("sources")
        if self._lease_check is not None:
            self._lease_check()  # a bucket writer commits only while it still holds the lease
        self.files.write_parquet(schema.conform(sources), f"sources/part-{batch_id}.parquet")
        self.publish()  # derived from the commit: a failure here is repaired by the next run

    def _write_table(self, batch_id: str, schema: TableSchema, data: pa.Table) -> None:
        from hybridtrace.store.keys import note_written

        data = schema.conform(data)
        for n, (directory, part) in enumerate(partitions(schema, data)):
            rel = f"{directory}/part-{batch_id}-{n}.parquet"
            self.files.write_parquet(part, rel)
            note_written(self, rel, schema, part)

    # --- reading ----------------------------------------------------------------------

    def connect(self, *, with_queries: bool = True) -> duckdb.DuckDBPyConnection:
        """A connection with the analysis' views and default thresholds, for scripts and tests.

        The commands open the store through ``open_analysis`` (``analysis.py``), which also
        says when there is no store and reads the thresholds of ``hybridtrace.toml``;
        ``with_queries=False`` leaves out the SQL of ``queries/`` (raw views and
        ``engine_models`` only).
        """
        from hybridtrace.store.analysis import analysis_connection

        return analysis_connection(self, views=with_queries)

    def sources_frame(self) -> pa.Table:
        files = self.committed_files("sources")
        schema = table_schema("sources")
        if not files:
            return schema.arrow_schema().empty_table()
        return pa.concat_tables([schema.conform(self.files.read_table(f)) for f in files])


def partitions(schema: TableSchema, data: pa.Table) -> list[tuple[str, pa.Table]]:
    """(directory relative to the root, rows) per partition of ``data``."""
    import pyarrow.compute as pc

    if not schema.partition:
        return [(schema.name, data)]
    single = _one_partition(data, schema.partition)
    combos = (
        [single]
        if single is not None
        else data.group_by(list(schema.partition), use_threads=False).aggregate([]).to_pylist()
    )
    out = []
    for combo in combos:
        directory = schema.name
        mask = None
        for column in schema.partition:
            value = combo[column]
            directory = f"{directory}/{column}={_partition_dir(value)}"
            if len(combos) > 1:
                test = pc.is_null(data[column]) if value is None else pc.equal(data[column], value)
                mask = test if mask is None else pc.and_(mask, test)
        out.append((directory, data if mask is None else _rows_of(data, mask)))
    return out


def _rows_of(data: pa.Table, mask: pa.ChunkedArray) -> pa.Table:
    """The rows of ``data`` where ``mask`` holds: a slice (no copy) when they are one run, as
    in a table sorted by its partition columns first; else a filtered copy."""
    import pyarrow.compute as pc

    where = pc.indices_nonzero(mask)
    if len(where) and where[-1].as_py() - where[0].as_py() + 1 == len(where):
        return data.slice(where[0].as_py(), len(where))
    return data.filter(mask)


def _one_partition(data: pa.Table, columns: tuple[str, ...]) -> dict | None:
    """The partition values of ``data`` when every row has the same ones, else None.

    A batch usually holds one day of one engine: two bounds per column tell so at a small
    part of the cost of grouping every row.
    """
    import pyarrow.compute as pc

    if not data.num_rows:
        return None
    combo: dict = {}
    for column in columns:
        values = data[column]
        if values.null_count == len(values):
            combo[column] = None
            continue
        if values.null_count:
            return None
        bounds = pc.min_max(values)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low != high:
            return None
        combo[column] = low
    return combo


def concat(tables: Iterable[pa.Table], schema: TableSchema) -> pa.Table:
    parts = [schema.conform(t) for t in tables if t is not None and t.num_rows]
    if not parts:
        return schema.arrow_schema().empty_table()
    return pa.concat_tables(parts)
