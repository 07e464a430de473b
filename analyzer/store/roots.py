"""Where a store's files live: a local folder or a bucket prefix, behind one small interface.

The store (``commit.py``) speaks in paths relative to its root ("transfers/day=…/part-….
parquet"); a root turns them into files. Locally a write goes to a temporary name, is
fsynced and renamed, so a reader never sees half a file. In a bucket an object appears
whole when its upload completes, so a write is one upload. Either way the store's
commit record (its ``sources`` file) is written last. Each root also locks: a file lock
locally, a lease in a bucket (both in ``leases.py``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from hybridtrace.errors import UsageError
from hybridtrace.store.leases import LeaseHeld, bucket_lease, file_lock
from hybridtrace.store.objects import Bucket, bucket, is_bucket, redact

if TYPE_CHECKING:
    import duckdb

__all__ = ["PARQUET_OPTIONS", "BucketRoot", "LeaseHeld", "LocalRoot", "root_of"]

# Row groups of DuckDB's own size: a scan filtered by key skips, by their statistics, the
# groups that cannot hold it (pyarrow's default is one group per million rows).
PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1, "row_group_size": 122_880}

# Rows looked at to judge whether a column's values repeat, and the share of them that may
# be distinct for its pages to be dictionary-encoded.
DICTIONARY_SAMPLE = 4096
DICTIONARY_DISTINCT = 1 / 8


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns of ``table`` worth a dictionary: those whose values repeat.

    pyarrow builds a dictionary for every column by default and falls back to plain pages
    once it grows too large, which for a column of mostly distinct values (a time, a line
    number, an id) is work thrown away, and a larger file. A sample of the first rows tells
    them apart: measured on a trace's transfers, a write takes about half the time and the
    file is smaller. Only the encoding differs: the values read back the same.
    """
    import pyarrow.compute as pc

    sample = table.slice(0, DICTIONARY_SAMPLE)
    limit = max(1, int(sample.num_rows * DICTIONARY_DISTINCT))
    chosen = []
    for field in table.schema:
        if pa.types.is_nested(field.type):
            continue  # the store's tables have none; a top-level name would not reach its leaves
        if pa.types.is_null(field.type):
            chosen.append(field.name)  # no value at all: nothing to count
            continue
        if pc.count_distinct(sample[field.name]).as_py() <= limit:
            chosen.append(field.name)
    return chosen


# The columns a look-up of requests filters on. An incremental analysis reads the rows of the
# few requests new objects touch (analyze/incremental.py), and vLLM's request ids are random:
# every row group of every file spans the whole range of ids, so its statistics skip none, and
# the look-up would read the whole store. A Bloom filter per row group tells a reader which
# groups cannot hold an id: measured on 1.6M reads with random ids, a look-up of 40 ids no file
# holds took 5 ms instead of 124, for 2.4% more bytes and no slower write.
BLOOM_COLUMNS = ("request_id", "remote_request_id")
# False positives per row group and id looked up, as asked of pyarrow (it rounds each filter up
# to a power of two: measured, 0.13% of 1,500 probes of absent ids passed a group of 30K ids).
BLOOM_FPP = 0.01


def bloom_filters(table: pa.Table, dictionary: list[str]) -> dict[str, dict[str, float]]:
    """Bloom filter options for the request-id columns of ``table`` whose values are mostly
    distinct (a dictionary-encoded column repeats its values: its statistics and dictionary
    serve a look-up already), sized for the distinct values one row group holds: the share of
    distinct values in a sample of the first rows (a request's reads are written together)."""
    import pyarrow.compute as pc

    chosen: dict[str, dict[str, float]] = {}
    rows = min(table.num_rows, PARQUET_OPTIONS["row_group_size"])
    for name in BLOOM_COLUMNS:
        if name not in table.column_names or name in dictionary or not rows:
            continue
        if not pa.types.is_string(table.schema.field(name).type):
            continue
        sample = table[name].slice(0, DICTIONARY_SAMPLE)
        distinct = pc.count_distinct(sample).as_py()
        if distinct:
            share = distinct / len(sample)
            chosen[name] = {"ndv": max(1, int(rows * share) + 1), "fpp": BLOOM_FPP}
    return chosen


def _bloom_supported() -> bool:
    import inspect

    return "bloom_filter_options" in inspect.signature(pq.ParquetWriter.__init__).parameters


# Whether the installed pyarrow writes Bloom filters (older versions write files without).
BLOOM_WRITTEN = _bloom_supported()


def write_parquet_table(table: pa.Table, where: str | pa.NativeFile) -> None:
    """Write ``table`` with the store's options, dictionaries only where values repeat, and
    Bloom filters of the request ids (where the installed pyarrow writes them)."""
    dictionary = dictionary_columns(table)
    extra = {}
    if BLOOM_WRITTEN:
        blooms = bloom_filters(table, dictionary)
        if blooms:
            extra["bloom_filter_options"] = blooms
    pq.write_table(table, where, use_dictionary=dictionary, **PARQUET_OPTIONS, **extra)


class LocalRoot:
    """A store in a local folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.display = str(self.path)

    def full(self, rel: str) -> str:
        return str(self.path / rel)

    def exists(self, rel: str) -> bool:
        return (self.path / rel).exists()

    def read_text(self, rel: str) -> str:
        return (self.path / rel).read_text()

    def make(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def write_text(self, rel: str, text: str) -> None:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: two processes may write the same file (the first _meta.json)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)

    def write_parquet(self, table: pa.Table, rel: str) -> None:
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        write_parquet_table(table, str(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        # The rename itself must reach the disk before anything that depends on it.
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def list_files(self, rel: str, pattern: str = "part-*.parquet") -> list[str]:
        return [name for name, _ in self.list_sized(rel, pattern)]

    def list_sized(self, rel: str, pattern: str = "part-*.parquet") -> list[tuple[str, int]]:
        base = self.path / rel
        if not base.exists():
            return []
        return sorted((str(p.relative_to(self.path)), p.stat().st_size) for p in base.rglob(pattern))

    def leftovers(self) -> list[str]:
        """Temporary files a killed write left."""
        if not self.path.exists():
            return []
        return [str(p.relative_to(self.path)) for p in self.path.rglob("*.tmp")]

    def delete(self, rel: str) -> None:
        (self.path / rel).unlink(missing_ok=True)

    def parquet_schema(self, rel: str) -> pa.Schema:
        return pq.read_schema(self.path / rel)

    def read_table(self, rel: str) -> pa.Table:
        # one file as one file: pq.read_table would build a dataset of it (and import pyarrow.dataset)
        return pq.ParquetFile(self.path / rel).read()

    def scan(self, con: duckdb.DuckDBPyConnection, name: str, files: list[str], schema: pa.Schema) -> str:
        """A FROM clause over ``files`` (DuckDB reads local Parquet itself)."""
        listing = ", ".join("'" + self.full(f).replace("'", "''") + "'" for f in files)
        return f"read_parquet([{listing}], union_by_name = true, hive_partitioning = false)"

    def lock(self, name: str, lease_s: float, what: str) -> contextlib.AbstractContextManager[dict]:
        """An exclusive file lock; the system releases it when the holder dies (``leases.py``)."""
        return file_lock(self, name, lease_s, what)


class BucketRoot:
    """A store under a bucket prefix (s3://… or gs://…)."""

    def __init__(self, where: Bucket) -> None:
        self.where = where
        self.fs = where.filesystem
        self.display = where.uri

    def full(self, rel: str) -> str:
        return f"{self.where.path}/{rel}"

    def _guard(self, action: str, error: Exception) -> UsageError:
        return UsageError(f"{self.display}: cannot {action}: {redact(str(error))}")

    def exists(self, rel: str) -> bool:
        try:
            return self.fs.get_file_info(self.full(rel)).type == pafs.FileType.File
        except OSError as exc:
            raise self._guard("read the store", exc) from exc

    def read_text(self, rel: str) -> str:
        try:
            with self.fs.open_input_file(self.full(rel)) as handle:
                return handle.read().decode(errors="replace")  # a damaged file fails as JSON
        except (OSError, ValueError) as exc:
            # ValueError: GCS replaced the object (a new generation) between open and read
            raise self._guard(f"read {rel}", exc) from exc

    def make(self) -> None:
        bucket_name = self.where.path.split("/", 1)[0]
        try:
            if self.fs.get_file_info(bucket_name).type == pafs.FileType.NotFound:
                raise UsageError(f"{self.where.scheme}://{bucket_name}: no such bucket")
        except OSError as exc:
            raise self._guard("reach the bucket", exc) from exc

    def write_bytes(self, rel: str, data: bytes) -> None:
        try:
            with self.fs.open_output_stream(self.full(rel), compression=None) as out:
                out.write(data)
        except OSError as exc:
            raise self._guard(f"write {rel}", exc) from exc

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def write_parquet(self, table: pa.Table, rel: str) -> None:
        # One upload: the object is visible only once complete, so no temporary name.
        sink = pa.BufferOutputStream()
        write_parquet_table(table, sink)
        self.write_bytes(rel, sink.getvalue().to_pybytes())

    def list_files(self, rel: str, pattern: str = "part-*.parquet") -> list[str]:
        return [name for name, _ in self.list_sized(rel, pattern)]

    def list_sized(self, rel: str, pattern: str = "part-*.parquet") -> list[tuple[str, int]]:
        import fnmatch

        base = self.full(rel)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise self._guard("list the store", exc) from exc
        prefix = self.where.path + "/"
        out = [
            (info.path[len(prefix):], info.size or 0)
            for info in infos
            if info.type == pafs.FileType.File and fnmatch.fnmatch(info.path.rsplit("/", 1)[-1], pattern)
        ]
        return sorted(out)

    def leftovers(self) -> list[str]:
        return []  # uploads are whole or absent

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.full(rel))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._guard(f"delete {rel}", exc) from exc

    def parquet_schema(self, rel: str) -> pa.Schema:
        return pq.read_schema(self.full(rel), filesystem=self.fs)

    def read_table(self, rel: str) -> pa.Table:
        with self.fs.open_input_file(self.full(rel)) as source:
            return pq.ParquetFile(source).read()

    def scan(self, con: duckdb.DuckDBPyConnection, name: str, files: list[str], schema: pa.Schema) -> str:
        """A FROM clause over ``files``: a pyarrow dataset registered with DuckDB.

        DuckDB cannot reach buckets itself here (no httpfs), so pyarrow reads them; the
        dataset's schema is the table's, so a column older files lack reads as null.
        """
        paths = [self.full(f) for f in files]
        import pyarrow.dataset as pads

        dataset = pads.dataset(paths, filesystem=self.fs, format="parquet", schema=schema)
        con.register(f"_files_{name}", dataset)
        return f"_files_{name}"

    def lock(self, name: str, lease_s: float, what: str) -> contextlib.AbstractContextManager[dict]:
        """A lease: held while renewed, taken over once expired (``leases.py``)."""
        return bucket_lease(self, name, lease_s, what)


def root_of(location: str | Path) -> LocalRoot | BucketRoot:
    text = str(location)
    if text.startswith("file://"):
        from urllib.parse import urlsplit

        text = urlsplit(text).path
    return BucketRoot(bucket(text)) if is_bucket(text) else LocalRoot(text)
