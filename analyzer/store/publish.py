"""Publishing a finished file (a report, a summary) to a path or a bucket, all at once.

A reader of the target (a browser, a web server, a chat bot) must never see half a page:
locally the text goes to a temporary name in the target's folder, is fsynced and renamed
over the target (and the rename fsynced); in a bucket an object appears whole when its one
upload completes. ``report`` and the scheduled job both publish through here.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from hybridtrace.errors import UsageError
from hybridtrace.store.objects import bucket, is_bucket, redact


def publish_text(text: str, target: str | Path, *, what: str = "the report") -> str:
    """Write ``text`` (UTF-8) to ``target``, a path or a bucket URI; returns where it went."""
    data = text.encode("utf-8")
    if is_bucket(target):
        where = bucket(str(target))
        try:
            with where.filesystem.open_output_stream(where.path, compression=None) as out:
                out.write(data)
        except OSError as exc:
            raise UsageError(f"{where.uri}: cannot write {what}: {redact(str(exc))}") from exc
        return where.uri
    destination = Path(target)
    if destination.is_dir():
        raise UsageError(f"{destination}: is a folder; name the file to write {what} to")
    # a name of its own: two runs may publish the same target at once
    staged = destination.with_name(f"{destination.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with open(staged, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        staged.replace(destination)
        _sync_folder(destination.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):  # where the folder cannot be made, there is nothing to remove
            staged.unlink(missing_ok=True)
        raise UsageError(f"{destination}: cannot write {what}: {exc.strerror or exc}") from exc
    return str(destination)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (a folder some file systems will not open is skipped)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
