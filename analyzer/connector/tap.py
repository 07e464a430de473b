"""A tap on a NIXL agent: every call goes through unchanged, the reads are noted on the way.

The tap sees what NIXL itself sees: the local descriptor lists as they are prepared
(lengths per descriptor), each read as it is made and posted (its descriptor indices and
notification, which carries the remote request id), its state when the engine polls it,
and its telemetry (post and transfer time, bytes, descriptors). When the handle is
released the read is handed, as one tuple, to the trace writer. The engine's thread pays
for a dict insert per call it makes anyway; everything else happens on the writer's
thread. Nothing here may raise into the engine: the tap's own work is guarded, the
agent's errors pass through as they would without it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from hybridtrace.connector.writer import say_once


class Read:
    """One read from ``make_prepped_xfer`` to ``release_xfer_handle``."""

    __slots__ = ("context", "indices", "local", "notif", "observed", "post_ts", "state", "telemetry")

    def __init__(self, context: tuple | None, local: Any, indices: Any, notif: bytes) -> None:
        self.context = context
        self.local = local
        self.indices = indices
        self.notif = notif
        self.post_ts: float | None = None
        self.observed: float | None = None
        self.state: str | None = None
        self.telemetry: Any = None  # NIXL's telemetry object (or its fields as a tuple)


def telemetry_tuple(telemetry: Any) -> tuple | None:
    """(start µs, post µs, transfer µs, bytes, descriptors) of a NIXL telemetry object."""
    try:
        return (
            telemetry.startTime,
            telemetry.postDuration,
            telemetry.xferDuration,
            telemetry.totalBytes,
            telemetry.descCount,
        )
    except Exception:
        return None


class AgentTap:
    """Wraps ``agent`` (a ``nixl_agent``); ``on_read(read)`` gets every finished read."""

    def __init__(self, agent: Any, on_read: Callable[[Read], None]) -> None:
        self._agent = agent
        self._on_read = on_read
        self._reads: dict[Any, Read] = {}
        self.dlists: dict[Any, Any] = {}  # local prepared list -> per-descriptor lengths
        self.context: tuple | None = None  # set by the connector around a read's posting

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    # -- preparation (start-up, not the hot path) ----------------------------------------

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, *args: Any, **kwargs: Any) -> Any:
        handle = self._agent.prep_xfer_dlist(agent_name, xfer_list, *args, **kwargs)
        if agent_name in ("NIXL_INIT_AGENT", ""):
            try:
                self.dlists[handle] = descriptor_lengths(xfer_list)
            except Exception as error:
                say_once("dlist", "cannot read a local descriptor list (%s); reads through it "
                         "are traced without a per-group split", error)
        return handle

    # -- the reads --------------------------------------------------------------------------

    def make_prepped_xfer(self, operation: str, local: Any, local_indices: Any, remote: Any,
                          remote_indices: Any, notif_msg: bytes = b"", *args: Any, **kwargs: Any) -> Any:
        try:
            handle = self._agent.make_prepped_xfer(
                operation, local, local_indices, remote, remote_indices, notif_msg, *args, **kwargs
            )
        except BaseException:
            if operation == "READ":
                self._failed_before_post(local, local_indices, notif_msg)
            raise
        if operation == "READ":
            self._reads[handle] = Read(self.context, local, local_indices, notif_msg)
        return handle

    def transfer(self, handle: Any, *args: Any, **kwargs: Any) -> str:
        read = self._reads.get(handle)
        if read is not None:
            read.post_ts = time.time()
        try:
            state = self._agent.transfer(handle, *args, **kwargs)
        except BaseException:
            if read is not None:
                read.state, read.observed = "ERR", time.time()
            raise
        if read is not None and state != "PROC":
            read.state, read.observed = state, time.time()
        return state

    def check_xfer_state(self, handle: Any) -> str:
        state = self._agent.check_xfer_state(handle)
        if state != "PROC":
            read = self._reads.get(handle)
            if read is not None and read.observed is None:  # the first poll that saw it end
                read.state, read.observed = state, time.time()
        return state

    def get_xfer_telemetry(self, handle: Any) -> Any:
        telemetry = self._agent.get_xfer_telemetry(handle)
        read = self._reads.get(handle)
        if read is not None:
            read.telemetry = telemetry  # a value NIXL copied out: its fields are read later, off this thread
        return telemetry

    def release_xfer_handle(self, handle: Any, *args: Any, **kwargs: Any) -> Any:
        read = self._reads.pop(handle, None)
        if read is not None and read.telemetry is None and read.state == "ERR":
            # vLLM reads telemetry of completed reads only; a failed one may have some
            with contextlib.suppress(Exception):
                read.telemetry = self._agent.get_xfer_telemetry(handle)
        try:
            result = self._agent.release_xfer_handle(handle, *args, **kwargs)
        except BaseException:
            if read is not None:  # not released: the read goes on until vLLM's retry releases it
                self._reads[handle] = read
            raise
        if read is not None:
            self._hand_over(read)
        return result

    def _failed_before_post(self, local: Any, indices: Any, notif: bytes) -> None:
        read = Read(self.context, local, indices, notif)
        read.state = "ERR"
        read.post_ts = read.observed = time.time()
        self._hand_over(read)

    def _hand_over(self, read: Read) -> None:
        try:
            self._on_read(read)
        except Exception as error:
            say_once("hand-over", "a read could not be queued for the trace (%s)", error)


def read_facts(read: Read) -> dict:
    """What the NIXL calls alone say of a read, as trace v1 ``transfer`` fields.

    ``ts`` is our clock when the read was posted and ``xfer_s`` runs to the first poll
    that saw it end (so it includes the engine's polling delay, as trace v1 defines it);
    ``bytes`` and ``descriptors`` are NIXL's telemetry of the handle (descriptors after
    NIXL merged neighbours), 0 bytes when NIXL reported none (a read that failed).
    ``remote_request_id`` comes from vLLM's notification ``<id>:<consumers>``.
    """
    telemetry = read.telemetry if isinstance(read.telemetry, tuple) or read.telemetry is None else (
        telemetry_tuple(read.telemetry))
    status = "ok" if read.state == "DONE" else "failed"
    if telemetry is not None and telemetry[3] is not None:
        transported, descriptors, post_s = int(telemetry[3]), int(telemetry[4]), telemetry[1] / 1e6
    else:
        transported, descriptors, post_s = 0, None, None
    start = read.post_ts if read.post_ts is not None else read.observed or time.time()
    notif = bytes(read.notif or b"").decode(errors="replace")
    return {
        "ts": start,
        "status": status,
        "post_s": post_s,
        "xfer_s": max((read.observed or start) - start, 0.0),
        "transported_bytes": transported,
        "descriptors": descriptors,
        "remote_request_id": notif.rpartition(":")[0] or None,
    }


def descriptor_lengths(xfer_list: Any) -> Any:
    """Per-descriptor lengths of a list given to ``prep_xfer_dlist``.

    NIXL takes an Nx3 array (address, length, device), an Nx5 strided one (address,
    length, device, stride, count: ``count`` descriptors of ``length``), or a sequence of
    (address, length, device, ...) tuples.
    """
    import numpy as np  # the engine has it loaded already; the analysis side never needs this

    if isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2:
        if xfer_list.shape[1] == 5:
            return np.repeat(xfer_list[:, 1].astype(np.int64), xfer_list[:, 4].astype(np.int64))
        return xfer_list[:, 1].astype(np.int64)
    return np.asarray([int(item[1]) for item in xfer_list], dtype=np.int64)
