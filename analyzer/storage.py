"""Where a store's files live: a local folder or a bucket prefix, behind one small interface.

The store (``store.py``) speaks in paths relative to its root ("transfers/day=…/part-….
parquet"); a root turns them into files. Locally a write goes to a temporary name, is
fsynced and renamed, so a reader never sees half a file. In a bucket an object appears
whole when its upload completes, so a write is one upload. Either way the store's
commit record (its ``sources`` file) is written last.

Buckets have no file locks, so a bucket root offers a lease instead: a small claim object
naming its holder and an expiry, renewed while the holder works. A holder that dies
stops renewing, and the lease expires. Object stores give no atomic create through
pyarrow, so each run writes a claim of its own, waits, and lists the claims: a later
claimant always sees an earlier one and steps aside, and two that see each other both
back off and try again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from hybridtrace.buckets import Bucket, bucket, is_bucket, redact
from hybridtrace.errors import UsageError

if TYPE_CHECKING:
    import duckdb

PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1}


def _settle_s() -> float:
    """How long a new lease waits for a racing writer (HYBRIDTRACE_LEASE_SETTLE_S, default 2 s)."""
    text = os.environ.get("HYBRIDTRACE_LEASE_SETTLE_S", "2")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"HYBRIDTRACE_LEASE_SETTLE_S must be a positive number of seconds, not {text!r}")
    return value


# How much longer than three settle times an undecided claim lives: writing and listing
# claims on a slow store must not outlast it.
UNDECIDED_SLACK_S = 10.0


class LeaseHeld(UsageError):
    """Another holder has the lease; ``holder`` says who and until when."""

    def __init__(self, message: str, holder: dict) -> None:
        super().__init__(message)
        self.holder = holder


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
        pq.write_table(table, tmp, **PARQUET_OPTIONS)
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
        return pq.read_table(self.path / rel)

    def scan(self, con: duckdb.DuckDBPyConnection, name: str, files: list[str], schema: pa.Schema) -> str:
        """A FROM clause over ``files`` (DuckDB reads local Parquet itself)."""
        listing = ", ".join("'" + self.full(f).replace("'", "''") + "'" for f in files)
        return f"read_parquet([{listing}], union_by_name = true, hive_partitioning = false)"

    @contextlib.contextmanager
    def lock(self, name: str, lease_s: float, what: str) -> Iterator[dict]:
        """An exclusive file lock; the system releases it when the holder dies."""
        import fcntl

        self.make()
        handle = open(self.path / name, "a+")  # noqa: SIM115 - closed below
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                try:
                    holder = json.loads(handle.read() or "{}")
                except ValueError:
                    holder = {}
                raise LeaseHeld(f"{self.display}: {what}", holder) from None
            holder = _holder(lease_s)
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(holder))
            handle.flush()
            yield holder
        finally:
            handle.close()


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
        pq.write_table(table, sink, **PARQUET_OPTIONS)
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
        return pq.read_table(self.full(rel), filesystem=self.fs)

    def scan(self, con: duckdb.DuckDBPyConnection, name: str, files: list[str], schema: pa.Schema) -> str:
        """A FROM clause over ``files``: a pyarrow dataset registered with DuckDB.

        DuckDB cannot reach buckets itself here (no httpfs), so pyarrow reads them; the
        dataset's schema is the table's, so a column older files lack reads as null.
        """
        paths = [self.full(f) for f in files]
        dataset = pads.dataset(paths, filesystem=self.fs, format="parquet", schema=schema)
        con.register(f"_files_{name}", dataset)
        return f"_files_{name}"

    @contextlib.contextmanager
    def lock(self, name: str, lease_s: float, what: str) -> Iterator[dict]:
        """A lease: held while renewed, taken over once expired.

        Each run writes its own claim object (``<name>.d/<token>.json``), waits for racing
        claims to land and lists them. Nothing is overwritten, so of two runs that claim at
        about the same time at least the later one sees the other and steps aside; if
        both see each other, both withdraw, wait a random moment and try again.
        """
        settle = _settle_s()
        if not (math.isfinite(lease_s) and lease_s >= 3 * settle):
            raise UsageError(f"{self.display}: a lease must last at least three settle times "
                             f"({3 * settle:g} s), not {lease_s:g} s")  # fmt: skip
        claims = f"{name}.d"
        held_elsewhere = [c for c in self._live_claims(name, claims) if c.get("held", True)]
        if held_elsewhere:
            raise LeaseHeld(f"{self.display}: {what}", _first(held_elsewhere))
        mine = self._claim(name, claims, lease_s, settle, what)
        rel = mine["rel"]
        stop = threading.Event()

        def renew() -> None:
            # A holder paused past its lease may have been replaced: it stops renewing
            # (``check`` then refuses to commit) rather than revive an expired claim.
            while not stop.wait(max(lease_s / 3, 0.5)):
                try:
                    if time.time() > mine["expires"] or not self.exists(rel):
                        mine["lost"] = True
                        return
                    expires = time.time() + lease_s
                    self.write_text(rel, json.dumps({**_public(mine), "expires": expires}))
                    if time.time() > mine["expires"]:
                        # the renewal may have landed after the lease ran out, when another
                        # run could already have taken it: give it up
                        mine["lost"] = True
                        with contextlib.suppress(UsageError, OSError):
                            self.delete(rel)
                        return
                    mine["expires"] = expires
                except (UsageError, OSError):
                    if time.time() > mine["expires"]:
                        mine["lost"] = True  # could not renew in time: assume another took over
                        return

        mine["check"] = lambda: self._still_held(name, claims, mine)

        keeper = threading.Thread(target=renew, name="hybridtrace-lease", daemon=True)
        keeper.start()
        try:
            yield mine
        finally:
            stop.set()
            keeper.join()
            with contextlib.suppress(UsageError, OSError):
                self.delete(rel)

    def _claim(self, name: str, claims: str, lease_s: float, settle: float, what: str) -> dict:
        """Write a claim, settle, look; the claim held, or ``LeaseHeld``. Leaves no claim on error."""
        others: list[dict] = []
        for attempt in range(_CLAIM_ATTEMPTS):
            mine = _holder(lease_s)
            # A claim not yet held lives only as long as deciding takes, so one left by a
            # run killed in the middle blocks nobody for long.
            mine["expires"] = mine["started"] + 3 * settle + UNDECIDED_SLACK_S
            rel = mine["rel"] = f"{claims}/{mine['token']}.json"
            try:
                self.write_text(rel, json.dumps(_public(mine)))
                time.sleep(settle)  # let a racing claim land before looking
                others = self._live_claims(name, claims, mine["token"])
                if time.time() >= mine["expires"]:
                    # others may have taken our claim as dead meanwhile: the answer is void
                    raise UsageError(
                        f"{self.display}: the store answered too slowly to take the lease (writing "
                        f"and listing a claim took over {2 * settle + UNDECIDED_SLACK_S:g} s)"
                    )
                if not others:
                    mine["held"], mine["lost"] = True, False
                    mine["expires"] = time.time() + lease_s
                    self.write_text(rel, json.dumps(_public(mine)))
                    # a run that judged our claim expired (a stall, a skewed clock) may have
                    # won meanwhile: of two held claims, both give way
                    rivals = self._live_claims(name, claims, mine["token"])
                    others = [c for c in rivals if c.get("held", True)]
                    if not others:
                        self._sweep(claims, mine["token"])
                        return mine
                self.delete(rel)
            except BaseException:
                with contextlib.suppress(UsageError, OSError):
                    self.delete(rel)
                raise
            if attempt == _CLAIM_ATTEMPTS - 1 or any(c.get("held", True) for c in others):
                raise LeaseHeld(f"{self.display}: {what}", _first(others) if others else {})
            # Both claimed at once and both saw the other: back off by a random amount so
            # one of the two goes first next time, and step aside if it already has.
            time.sleep(random.uniform(0.0, 2 * settle))
            others = self._live_claims(name, claims)
            if others:
                raise LeaseHeld(f"{self.display}: {what}", _first(others))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _live_claims(self, name: str, claims: str, mine: str | None = None) -> list[dict]:
        """Unexpired claims on a lease other than ``mine`` (a token), with a lock object from
        older versions counted as one."""
        now, live = time.time(), []
        for rel in [*self.list_files(claims, "*.json"), name]:
            if mine is not None and rel == f"{claims}/{mine}.json":
                continue
            claim = self._read_claim(rel, legacy=rel == name)
            if claim is not None and _number(claim.get("expires")) > now:
                live.append(claim)
        return live

    def _read_claim(self, rel: str, legacy: bool) -> dict | None:
        """A claim's content; None once it is gone (withdrawn or swept since the listing)."""
        for attempt in range(3):
            try:
                if legacy and not self.exists(rel):
                    return None
                return _parse(self.read_text(rel))
            except UsageError:
                # a renewal replacing the object under the read, or a claim deleted since
                # the listing; one we still cannot read may be live: never take it as gone
                if not self.exists(rel):
                    return None
                if attempt == 2:
                    raise
                time.sleep(0.05 * (attempt + 1))
        return None

    def _sweep(self, claims: str, token: str) -> None:
        """Delete expired claims of dead runs, so they do not pile up."""
        now = time.time()
        try:
            names = self.list_files(claims, "*.json")
        except UsageError:
            return  # the next holder sweeps them
        for rel in names:
            if rel == f"{claims}/{token}.json":
                continue
            with contextlib.suppress(UsageError, OSError):
                if _number(_parse(self.read_text(rel)).get("expires")) <= now:
                    self.delete(rel)

    def _still_held(self, name: str, claims: str, mine: dict) -> None:
        """Refuse to go on (commit) unless the lease is still ours and unexpired."""
        if mine.get("lost") or time.time() > mine["expires"]:
            raise UsageError(f"{self.display}: this run lost the store's lease; nothing more is committed")
        mine_there = self.exists(f"{claims}/{mine['token']}.json")
        others = self._live_claims(name, claims, mine["token"])
        if not mine_there or any(c.get("held", True) for c in others):
            # A claim that is not (yet) held is a run in its settling wait; it will see ours
            # and step aside. A held one (or an older version's lock object) has replaced us.
            mine["lost"] = True
            raise UsageError(
                f"{self.display}: another run took over the store's lease; nothing more is committed"
            )


_CLAIM_ATTEMPTS = 3


def _first(claims: list[dict]) -> dict:
    """The claim to name in a message: a holder if there is one, else the earliest."""
    return min(claims, key=lambda c: (not c.get("held", True), _number(c.get("started"))))


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _public(holder: dict) -> dict:
    """What the lock object says: who holds it, since and until when."""
    # ``held`` tells a winner from a run still settling; a lock object without it (an
    # older version's) counts as held.
    return {**{k: holder[k] for k in ("host", "pid", "token", "started", "expires")},
            "held": bool(holder.get("held"))}  # fmt: skip


def _holder(lease_s: float) -> dict:
    now = time.time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
            "started": now, "expires": now + lease_s}  # fmt: skip


def _parse(text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def root_of(location: str | Path) -> LocalRoot | BucketRoot:
    text = str(location)
    if text.startswith("file://"):
        from urllib.parse import urlsplit

        text = urlsplit(text).path
    return BucketRoot(bucket(text)) if is_bucket(text) else LocalRoot(text)
