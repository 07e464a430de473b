"""Locks and leases: one writer (or one scheduled run) at a time, in a folder or a bucket.

Locally a lock is an exclusive ``flock`` on a file under the store root: the system
releases it when its holder dies, and the file names the holder (host, pid, start) so the
next run can tell a long run from a stuck one.

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
from typing import TYPE_CHECKING

from hybridtrace.errors import UsageError

if TYPE_CHECKING:
    from hybridtrace.store.roots import BucketRoot, LocalRoot


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



@contextlib.contextmanager
def file_lock(root: LocalRoot, name: str, lease_s: float, what: str) -> Iterator[dict]:
    """An exclusive file lock; the system releases it when the holder dies."""
    import fcntl

    root.make()
    handle = open(root.path / name, "a+")  # noqa: SIM115 - closed below
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            try:
                holder = json.loads(handle.read() or "{}")
            except ValueError:
                holder = {}
            raise LeaseHeld(f"{root.display}: {what}", holder) from None
        holder = _holder(lease_s)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder))
        handle.flush()
        yield holder
    finally:
        handle.close()



@contextlib.contextmanager
def bucket_lease(root: BucketRoot, name: str, lease_s: float, what: str) -> Iterator[dict]:
    """A lease: held while renewed, taken over once expired.

    Each run writes its own claim object (``<name>.d/<token>.json``), waits for racing
    claims to land and lists them. Nothing is overwritten, so of two runs that claim at
    about the same time at least the later one sees the other and steps aside; if
    both see each other, both withdraw, wait a random moment and try again.
    """
    settle = _settle_s()
    if not (math.isfinite(lease_s) and lease_s >= 3 * settle):
        raise UsageError(f"{root.display}: a lease must last at least three settle times "
                         f"({3 * settle:g} s), not {lease_s:g} s")  # fmt: skip
    claims = f"{name}.d"
    held_elsewhere = [c for c in _live_claims(root, name, claims) if c.get("held", True)]
    if held_elsewhere:
        raise LeaseHeld(f"{root.display}: {what}", _first(held_elsewhere))
    mine = _claim(root, name, claims, lease_s, settle, what)
    rel = mine["rel"]
    stop = threading.Event()

    def renew() -> None:
        # A holder paused past its lease may have been replaced: it stops renewing
        # (``check`` then refuses to commit) rather than revive an expired claim.
        while not stop.wait(max(lease_s / 3, 0.5)):
            try:
                if time.time() > mine["expires"] or not root.exists(rel):
                    mine["lost"] = True
                    return
                expires = time.time() + lease_s
                root.write_text(rel, json.dumps({**_public(mine), "expires": expires}))
                if time.time() > mine["expires"]:
                    # the renewal may have landed after the lease ran out, when another
                    # run could already have taken it: give it up
                    mine["lost"] = True
                    with contextlib.suppress(UsageError, OSError):
                        root.delete(rel)
                    return
                mine["expires"] = expires
            except (UsageError, OSError):
                if time.time() > mine["expires"]:
                    mine["lost"] = True  # could not renew in time: assume another took over
                    return

    mine["check"] = lambda: _still_held(root, name, claims, mine)

    keeper = threading.Thread(target=renew, name="hybridtrace-lease", daemon=True)
    keeper.start()
    try:
        yield mine
    finally:
        stop.set()
        keeper.join()
        with contextlib.suppress(UsageError, OSError):
            root.delete(rel)

def _claim(root: BucketRoot, name: str, claims: str, lease_s: float, settle: float, what: str) -> dict:
    """Write a claim, settle, look; the claim held, or ``LeaseHeld``. Leaves no claim on error."""
    others: list[dict] = []
    for attempt in range(_CLAIM_ATTEMPTS):
        mine = _holder(lease_s)
        # A claim not yet held lives only as long as deciding takes, so one left by a
        # run killed in the middle blocks nobody for long.
        mine["expires"] = mine["started"] + 3 * settle + UNDECIDED_SLACK_S
        rel = mine["rel"] = f"{claims}/{mine['token']}.json"
        try:
            root.write_text(rel, json.dumps(_public(mine)))
            time.sleep(settle)  # let a racing claim land before looking
            others = _live_claims(root, name, claims, mine["token"])
            if time.time() >= mine["expires"]:
                # others may have taken our claim as dead meanwhile: the answer is void
                raise UsageError(
                    f"{root.display}: the store answered too slowly to take the lease (writing "
                    f"and listing a claim took over {2 * settle + UNDECIDED_SLACK_S:g} s)"
                )
            if not others:
                mine["held"], mine["lost"] = True, False
                mine["expires"] = time.time() + lease_s
                root.write_text(rel, json.dumps(_public(mine)))
                # a run that judged our claim expired (a stall, a skewed clock) may have
                # won meanwhile: of two held claims, both give way
                rivals = _live_claims(root, name, claims, mine["token"])
                others = [c for c in rivals if c.get("held", True)]
                if not others:
                    _sweep(root, claims, mine["token"])
                    return mine
            root.delete(rel)
        except BaseException:
            with contextlib.suppress(UsageError, OSError):
                root.delete(rel)
            raise
        if attempt == _CLAIM_ATTEMPTS - 1 or any(c.get("held", True) for c in others):
            raise LeaseHeld(f"{root.display}: {what}", _first(others) if others else {})
        # Both claimed at once and both saw the other: back off by a random amount so
        # one of the two goes first next time, and step aside if it already has.
        time.sleep(random.uniform(0.0, 2 * settle))
        others = _live_claims(root, name, claims)
        if others:
            raise LeaseHeld(f"{root.display}: {what}", _first(others))
    raise AssertionError("unreachable: the last attempt returns or raises")

def _live_claims(root: BucketRoot, name: str, claims: str, mine: str | None = None) -> list[dict]:
    """Unexpired claims on a lease other than ``mine`` (a token), with a lock object from
    older versions counted as one."""
    now, live = time.time(), []
    for rel in [*root.list_files(claims, "*.json"), name]:
        if mine is not None and rel == f"{claims}/{mine}.json":
            continue
        claim = _read_claim(root, rel, legacy=rel == name)
        if claim is not None and _number(claim.get("expires")) > now:
            live.append(claim)
    return live

def _read_claim(root: BucketRoot, rel: str, legacy: bool) -> dict | None:
    """A claim's content; None once it is gone (withdrawn or swept since the listing)."""
    for attempt in range(3):
        try:
            if legacy and not root.exists(rel):
                return None
            return _parse(root.read_text(rel))
        except UsageError:
            # a renewal replacing the object under the read, or a claim deleted since
            # the listing; one we still cannot read may be live: never take it as gone
            if not root.exists(rel):
                return None
            if attempt == 2:
                raise
            time.sleep(0.05 * (attempt + 1))
    return None

def _sweep(root: BucketRoot, claims: str, token: str) -> None:
    """Delete expired claims of dead runs, so they do not pile up."""
    now = time.time()
    try:
        names = root.list_files(claims, "*.json")
    except UsageError:
        return  # the next holder sweeps them
    for rel in names:
        if rel == f"{claims}/{token}.json":
            continue
        with contextlib.suppress(UsageError, OSError):
            if _number(_parse(root.read_text(rel)).get("expires")) <= now:
                root.delete(rel)

def _still_held(root: BucketRoot, name: str, claims: str, mine: dict) -> None:
    """Refuse to go on (commit) unless the lease is still ours and unexpired."""
    if mine.get("lost") or time.time() > mine["expires"]:
        raise UsageError(f"{root.display}: this run lost the store's lease; nothing more is committed")
    mine_there = root.exists(f"{claims}/{mine['token']}.json")
    others = _live_claims(root, name, claims, mine["token"])
    if not mine_there or any(c.get("held", True) for c in others):
        # A claim that is not (yet) held is a run in its settling wait; it will see ours
        # and step aside. A held one (or an older version's lock object) has replaced us.
        mine["lost"] = True
        raise UsageError(
            f"{root.display}: another run took over the store's lease; nothing more is committed"
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
