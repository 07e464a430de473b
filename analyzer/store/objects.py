"""Input objects and bucket locations: local files and S3 or GCS objects behind one ``ObjectRef``.

Ingest lists and reads its inputs through here; the store's bucket roots (``roots.py``)
and the report's publishing take their bucket locations from here too.

Buckets go through pyarrow's native filesystems, which follow each cloud's standard
credential chain (environment, shared profiles, instance or workload identity,
``GOOGLE_APPLICATION_CREDENTIALS``). pyarrow does not read an endpoint override from the
environment itself, so this module does:

- S3: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (an S3-compatible server: MinIO,
  Ceph, a test server), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``;
- GCS: ``STORAGE_EMULATOR_HOST`` (an emulator: plain HTTP, no credentials) and
  ``GOOGLE_CLOUD_PROJECT``.

Listing a prefix reads names, sizes and modification times only; an object's contents
(and its ETag or generation) are fetched only when it is opened. Credentials never
appear in a URI, a message or the store: a URI carrying them is refused.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from hybridtrace.errors import UsageError

SCHEMES = ("s3", "gs", "gcs")
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
# Query parameters that carry a credential (pyarrow's from_uri takes the first three), compared
# lower-case without separators, so Secret-Key and secretKey are caught as well.
_SECRET_PARAMETERS = frozenset({
    "accesskey", "secretkey", "sessiontoken", "awsaccesskeyid", "awssecretaccesskey", "awssessiontoken",
    "xamzcredential", "xamzsecuritytoken", "xamzsignature",
})  # fmt: skip


def is_bucket(location: str | Path) -> bool:
    return str(location).split("://", 1)[0].lower() in SCHEMES and "://" in str(location)


def redact(text: str) -> str:
    """``text`` with any credential the environment holds replaced by ***."""
    for name in _SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


@dataclass(frozen=True)
class Bucket:
    """A bucket location: its filesystem, the ``bucket/prefix`` path in it, and its URI."""

    scheme: str  # s3 or gs
    filesystem: pafs.FileSystem = field(repr=False, compare=False)
    path: str  # bucket/prefix, no trailing slash
    uri: str  # scheme://bucket/prefix

    def uri_of(self, path: str) -> str:
        return f"{self.scheme}://{path}"


def _endpoint(url: str) -> tuple[str, str]:
    """(host[:port], scheme) of an endpoint URL; https when it does not say."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    return parts.netloc, parts.scheme or "https"


def _s3_filesystem() -> pafs.S3FileSystem:
    options: dict = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_override"], options["scheme"] = _endpoint(endpoint)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


def _gcs_filesystem() -> pafs.GcsFileSystem:
    options: dict = {"retry_time_limit": dt.timedelta(seconds=60)}
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        host, scheme = _endpoint(emulator if "://" in emulator else f"http://{emulator}")
        options.update(endpoint_override=host, scheme=scheme, anonymous=True)
        options["retry_time_limit"] = dt.timedelta(seconds=5)
    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    if project:
        options["project_id"] = project
    return pafs.GcsFileSystem(**options)


def refuse_credentials(uri: str) -> None:
    """Raise a UsageError, without repeating the URI, when ``uri`` carries a credential:
    ``key:secret@`` before the bucket, or ``access_key=``, ``secret_key=``, ``session_token=``
    (any case) in its query."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        # never echo it: the part before @ is a secret
        raise UsageError(
            f"{scheme}:// URIs with credentials in them are refused; use the standard credential chain"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    names = {re.sub(r"[^a-z0-9]", "", name.lower()) for name, _ in query}
    if names & _SECRET_PARAMETERS:
        raise UsageError(
            f"{scheme}:// URIs with credentials in their query are refused; use the standard credential chain"
        )


def bucket(uri: str) -> Bucket:
    """The bucket location of ``s3://bucket/prefix`` or ``gs://bucket/prefix``."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise UsageError(f"{uri}: not a bucket URI (s3://… or gs://…)")
    refuse_credentials(uri)
    if not parts.netloc:
        raise UsageError(f"{uri}: no bucket name")
    scheme = "gs" if scheme == "gcs" else scheme
    path = (parts.netloc + parts.path).rstrip("/")
    try:
        filesystem = _s3_filesystem() if scheme == "s3" else _gcs_filesystem()
    except Exception as exc:  # pyarrow raises several kinds for a bad setting
        raise UsageError(f"{scheme}://{path}: cannot open the filesystem: {redact(str(exc))}") from exc
    return Bucket(scheme, filesystem, path, f"{scheme}://{path}")


@dataclass(frozen=True)
class ObjectRef:
    """One object to ingest: a local file or a bucket object, as a listing saw it."""

    uri: str  # identity in the manifest: an absolute local path, or scheme://bucket/key
    size: int
    mtime: float  # epoch seconds
    local: Path | None = None
    filesystem: pafs.FileSystem | None = field(default=None, repr=False, compare=False)
    path: str | None = None  # bucket/key for a bucket object
    error: str | None = None  # a folder the listing could not read: the object stands for it
    skipped: str | None = None  # why the listing will not have it opened (a link out of the input, a FIFO)

    @property
    def name(self) -> str:
        return self.local.name if self.local else self.path.rsplit("/", 1)[-1]

    @property
    def folder(self) -> str:
        """The name of the folder (or key prefix segment) that holds the object."""
        if self.local:
            return self.local.parent.name
        parts = self.path.split("/")
        return parts[-2] if len(parts) > 2 else ""

    @property
    def stem(self) -> str:
        name = self.name
        return name.rsplit(".", 1)[0] if "." in name[1:] else name

    def open(self) -> BinaryIO:
        """A seekable binary handle on the object (the caller closes it)."""
        if self.local is not None:
            return open(self.local, "rb")
        try:
            # open_input_file reads by ranges on demand: far faster than a stream for our chunks
            return self.filesystem.open_input_file(self.path)  # type: ignore[union-attr, return-value]
        except (OSError, pa.ArrowInvalid) as exc:
            # ArrowInvalid: a key pyarrow refuses to address; an unreadable object, not a crash
            raise OSError(redact(str(exc))) from None

    def version(self, handle: BinaryIO) -> str | None:
        """The object's version from an open handle: ETag (S3) or generation (GCS); None locally."""
        if self.local is not None:
            return None
        meta = handle.metadata() or {}  # type: ignore[attr-defined]
        keys = ("generation", "ETag", b"generation", b"ETag")
        raw = next((meta[k] for k in keys if meta.get(k)), None)
        return None if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw)).strip('"')


def _visible(name: str) -> bool:
    return not name.rsplit("/", 1)[-1].startswith(".")


_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_a_file(mode: int) -> str | None:
    """What a non-regular, non-folder entry is; None for a regular file or a folder."""
    return next((what for test, what in _SPECIAL_FILES if test(mode)), None)


def _file_ref(path: Path, link: bool = False) -> ObjectRef:
    """The object for a path that is (or leads to) a file: a regular file, or one never opened.

    A FIFO would block the reader until something writes to it, and a device or socket holds
    no telemetry: they are listed as skipped, by their own name (a link's, for ``link``)."""
    uri = str(_target(path))
    try:
        info = path.stat()
    except OSError as exc:
        return ObjectRef(uri, 0, 0.0, local=path, error=f"cannot read: {exc.strerror or exc}")
    what = _not_a_file(info.st_mode)
    if what is None:
        return ObjectRef(uri, info.st_size, info.st_mtime, local=path)
    named = f"a link to {what} ({uri})" if link else what
    return _skipped(path, f"{named}, not a regular file: never opened")


def _skipped(path: Path, why: str) -> ObjectRef:
    """A listed entry that is not read, with the reason; named by its own path (a link's, not
    its target's), with the entry's own size and time so that a later listing sees it unchanged."""
    try:
        info = path.lstat()
        size, mtime = info.st_size, info.st_mtime
    except OSError:
        size, mtime = 0, 0.0
    uri = str(_target(path.parent) / path.name)
    return ObjectRef(uri, size, mtime, local=path, skipped=why)


def _folder_key(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None  # os.walk says why, through onerror
    return info.st_dev, info.st_ino


def _target(link: Path) -> Path:
    """Where a link leads, every link on the way resolved (a loop of links leads nowhere)."""
    return Path(os.path.realpath(link))


def _walk(root: Path, failed: Callable[[OSError], None]) -> list[ObjectRef]:
    """Every visible entry under ``root``, each folder walked once.

    Links are not followed by os.walk: each is looked at once the folders reached without
    links are walked, so a folder is listed under its own path where it has one. A link is
    followed when its target lies inside ``root`` and is not a folder walked already (by
    device and inode: a link back to its own folder, or two links to one folder, would
    otherwise be walked without end); any other link is listed as skipped, with the reason.
    """
    inside = root.resolve()
    walked: set[tuple[int, int]] = set()
    refs: list[ObjectRef] = []
    tops = [root]
    while tops:
        top, links = tops.pop(0), []
        for folder, folders, names in os.walk(top, onerror=failed):
            here = Path(folder)
            key = _folder_key(here)
            if key in walked and here != top:  # reached again (a bind mount of a folder above it)
                folders[:] = []
                continue
            if key is not None:
                walked.add(key)
            links += [here / f for f in folders if _visible(f) and (here / f).is_symlink()]
            folders[:] = [f for f in folders if _visible(f) and not (here / f).is_symlink()]
            refs += [_entry(here / name, inside) for name in names if _visible(name)]
        for link in links:
            target = _target(link)
            key = _folder_key(link)
            if not target.is_relative_to(inside):
                refs.append(_skipped(link, f"a link to {target}, outside {inside}: not followed"))
            elif key in walked:
                refs.append(_skipped(link, f"a link to {target}, a folder walked already: not followed"))
            elif key is not None:
                walked.add(key)  # a second link to the same folder is then a link to one walked
                tops.append(link)
    return refs


def _entry(path: Path, inside: Path) -> ObjectRef:
    """The object for a non-folder entry of a walked folder (a link is checked first)."""
    if not path.is_symlink():
        return _file_ref(path)
    target = _target(path)
    if not target.is_relative_to(inside):
        return _skipped(path, f"a link to {target}, outside {inside}: not followed")
    if not target.exists():
        return _skipped(path, f"a link to {target}, which does not exist (or is a loop of links)")
    return _file_ref(path, link=True)


def list_local(path: Path) -> Iterator[ObjectRef]:
    """Every visible file under ``path``; a folder that cannot be read is an object with an
    error (the run records it and goes on), never silently missing. A link or a file that is
    not read (see ``_walk``, ``_file_ref``) is an object marked skipped, with the reason."""
    unreadable: list[ObjectRef] = []

    def failed(exc: OSError) -> None:
        where = Path(exc.filename or path)
        unreadable.append(ObjectRef(str(where.resolve()), 0, 0.0, local=where,
                                    error=f"cannot list: {exc.strerror or exc}"))  # fmt: skip

    if path.is_dir():
        refs = _walk(path, failed)
    elif path.exists():  # a file named on the command line, a link to one included
        refs = [_file_ref(path)]
    else:
        raise UsageError(f"{path}: no such file or folder")
    yield from sorted(refs + unreadable, key=lambda ref: ref.uri)


def _unaddressable(path: str) -> str | None:
    """Why pyarrow's filesystems cannot open the object ``bucket/key``, or None.

    A key may hold any characters, but pyarrow takes it for a path: it refuses an empty
    segment (``prod//z.log``) and resolves ``.`` and ``..``, so it asks for another key."""
    segments = path.split("/")[1:]
    if "" in segments:
        return "its key has an empty path segment (//), which pyarrow cannot open: rename it to have it read"
    if "." in segments or ".." in segments:
        return "its key has a . or .. path segment, which pyarrow cannot open: rename it to have it read"
    return None


def list_bucket(location: Bucket) -> list[ObjectRef]:
    """Every object under the prefix (or the one object it names), by listing only."""
    fs = location.filesystem
    try:
        info = fs.get_file_info(location.path)
        if info.type == pafs.FileType.File:
            infos = [info]
        elif info.type == pafs.FileType.NotFound and "/" not in location.path:
            raise UsageError(f"{location.uri}: no such bucket")
        else:
            infos = fs.get_file_info(pafs.FileSelector(location.path, recursive=True, allow_not_found=True))
    except UsageError:
        raise
    except (OSError, pa.ArrowInvalid) as exc:
        raise UsageError(f"{location.uri}: cannot list: {redact(str(exc))}") from exc
    if not infos:
        # an empty prefix is fine; a missing bucket is a mistake worth saying
        name = location.path.split("/", 1)[0]
        try:
            missing = fs.get_file_info(name).type == pafs.FileType.NotFound
        except OSError:
            missing = False
        if missing:
            raise UsageError(f"{location.scheme}://{name}: no such bucket")
    out = []
    base = location.path.rstrip("/")
    for item in infos:
        if item.type != pafs.FileType.File:
            continue
        mtime = item.mtime.timestamp() if item.mtime is not None else 0.0
        # hidden as on a disk: the object's name, or a "folder" of its key below the prefix
        below = item.path[len(base) :].lstrip("/") if item.path.startswith(base) else item.path
        if not all(_visible(part) for part in below.split("/") if part not in (".", "..")):
            continue
        ref = ObjectRef(location.uri_of(item.path), item.size or 0, mtime, filesystem=fs, path=item.path)
        out.append(replace(ref, skipped=_unaddressable(item.path)))
    out.sort(key=lambda o: o.uri)
    return out


def list_objects(location: str | Path) -> tuple[str, list[ObjectRef]]:
    """(the URI prefix the listing covers, its objects) for a local path or a bucket URI."""
    text = str(location)
    if text.startswith("file://"):
        text = urlsplit(text).path
    if is_bucket(text):
        where = bucket(text)
        objects = list_bucket(where)
        single = len(objects) == 1 and objects[0].uri == where.uri
        return (where.uri if single else where.uri + "/"), objects
    path = Path(text)
    objects = list(list_local(path))
    resolved = str(path.resolve())
    return (resolved if path.is_file() else resolved.rstrip(os.sep) + os.sep), objects
