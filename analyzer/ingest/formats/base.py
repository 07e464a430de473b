"""The interface every input format implements, and what passes between it and the run.

A format says what it is called, how its objects are recognised, how an object that
changed since its last read is read again, when an object's last line (without its
newline) is whole, which tables it fills, and how its bytes become rows. Everything
else — listing, opening, gzip, cutting whole lines, the manifest, slices and batches —
is the run's (``hybridtrace.ingest.run``), the same for every format.

Three ways an object is read again (``Resume``):

- ``LINES``: a log or a trace only grows. An object that grew and still starts with the
  same first bytes is read on from the line after the last one read; line numbers keep
  counting; a large object is committed in slices. The parser is given whole lines, chunk
  after chunk, and may keep the end of a chunk back for the next one (an event spanning
  lines).
- ``WHOLE``: a scrape, a config or another engine's CSV is one whole. When it changes it
  is read again from its start, and the rows the store already holds are dropped by their
  table key. The parser is given whole lines too, and usually parses once, at the end.
- ``NONE``: a binary object rewritten in place (NIXL's telemetry ring files: a header and
  a fixed array of slots that NIXL overwrites, ``nixl-telemetry.md`` §1.4). There are no
  lines and no offset to go on from: each read is a snapshot of the whole object, taken
  in one piece. Its sniff sees the object's raw first bytes and its size, before any
  line is cut (a gzip is never one). The parser is called once, with ``final`` set and
  all the bytes as the chunk's block; it says how many records it read (``Parsed.lines``)
  since the object has no lines to count. A transfer read again in a later snapshot has
  the same key, so it is a duplicate, not a second row::

      class Ring(Format):
          name = "nixl_ring"
          resume = Resume.NONE
          tables = ("nixl_transfers", "nixl_rings")

          def sniff(self, head: Head) -> bool:
              return looks_like_ring(head.data, head.size)

          def parser(self, context: ObjectContext) -> Parser:
              return RingParser(context)   # feed(chunk): parse_ring(chunk.lines.block)

A format's sniff is asked in the registry's order (``formats.REGISTRY``); the first that
says yes decides. The sniff must be strict: it sees the first bytes of every object,
whatever they are, and must neither raise nor take another format's objects.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from hybridtrace.buckets import ObjectRef
    from hybridtrace.ingest.stream import Lines


class Resume(enum.Enum):
    """How an object of the format is read again once it changed (see the module's text)."""

    LINES = "lines"
    WHOLE = "whole"
    NONE = "none"


class LastLine(enum.Enum):
    """What becomes of an object's last line when no newline ends it."""

    TAKE = "take"  # parse it: it is whole
    WAIT = "wait"  # it may still be being written: stop before it, a later run reads it
    CUT = "cut"  # cut short for good: one reject, and the read stops before it


@dataclass(frozen=True)
class Head:
    """What a sniff sees: an object's first bytes (gunzipped), its name and its size.

    For a text format, ``data`` is the first chunk's whole lines and the line after them
    when no newline ends it yet (at most 64 KiB). For a ``Resume.NONE`` format it is the
    object's raw first 4 KiB.
    """

    data: bytes
    name: str = ""
    size: int = 0


@dataclass
class ObjectContext:
    """What a parser knows of the object it reads, and of the run."""

    obj: ObjectRef
    year: int | None  # year of a log's first line (None: from the object's mtime)
    tz: str  # time zone of stamps that carry none
    connect: Callable[[], duckdb.DuckDBPyConnection]  # the run's DuckDB connection, opened on first use
    engine_id: str | None = None  # the engine a previous read of this object found
    resume_ts: float | None = None  # the latest stamp a previous read of this object found
    # the manifest row of the read this one goes on from (None: read from the start), for
    # what a format keeps in columns of its own (a vLLM log's envelope and instances)
    previous: dict | None = None

    @property
    def uri(self) -> str:
        return self.obj.uri


@dataclass
class Chunk:
    """Whole lines of an object (no final newline), in the order they come."""

    lines: Lines  # for a Resume.NONE format: all the object's bytes, as one block
    first_line: int  # number of the chunk's first line (1-based, counting on over resumed reads)
    final: bool  # nothing comes after this chunk
    source_id: str  # the manifest row (read or slice) the chunk's rows belong to
    # the object can no longer grow (run.py's is_quiet): at its final chunk, a last event
    # that may still gain lines is read now; else it is held back for the next read
    quiet: bool = True


@dataclass
class Parsed:
    """What a parser made of one chunk."""

    tables: list[tuple[str, pa.Table]] = field(default_factory=list)  # (table, rows), in order
    # (line_number, reason, raw) rows, as dicts or a table with those columns
    rejects: list[list[dict] | pa.Table] = field(default_factory=list)
    kept_back: tuple[int, int] = (0, 0)  # (bytes, lines) at the chunk's end left for the next chunk
    error: str | None = None  # the object as it is cannot be read: its manifest row says why
    engine_id: str | None = None  # the engine this read's rows belong to, for its manifest row
    learned_engine_id: str | None = None  # an engine id the object states: later slices start with it
    lines: int | None = None  # records read, for an object without lines (Resume.NONE)
    # manifest columns of the format's own (sources.envelope, sources.instances), set on this
    # read's row and on the rows of its later slices
    manifest: dict = field(default_factory=dict)

    def add(self, table: str, rows: pa.Table) -> None:
        if rows.num_rows:
            self.tables.append((table, rows))

    def reject(self, rows: list[dict] | pa.Table) -> None:
        if len(rows):
            self.rejects.append(rows)

    def reject_lines(self, rejects: list[tuple[int, str, str]]) -> None:
        """Rejects as the parsing cores give them: (line number, reason, raw text)."""
        self.reject([{"line_number": n, "reason": why, "raw": raw} for n, why, raw in rejects])

    def add_rows(self, table: str, rows: list[dict]) -> None:
        """Rows as dicts, typed by the table's schema (``schemas/<table>.toml``)."""
        if rows:
            import pyarrow as pa

            from hybridtrace.schema import table_schema

            self.add(table, pa.Table.from_pylist(rows, schema=table_schema(table).arrow_schema()))


class Parser:
    """One object's parser: fed chunk after chunk, it keeps what it needs between them."""

    def feed(self, chunk: Chunk) -> Parsed:
        raise NotImplementedError

    def latest_ts(self) -> float | None:
        """The latest time stamp read so far, when the format resumes by it (a vLLM log
        takes the year of a resumed read from it); None for the others."""
        return None


class WholeParser(Parser):
    """A parser for a format parsed in one go: it keeps each chunk's lines and, once the
    last chunk came, hands them all to ``parse_whole`` (an object read whole is small)."""

    def __init__(self, context: ObjectContext) -> None:
        self.context = context
        self.blocks: list[bytes] = []

    def feed(self, chunk: Chunk) -> Parsed:
        if chunk.lines:
            self.blocks.append(chunk.lines.block)
        if not chunk.final:
            return Parsed()
        return self.parse_whole(chunk)

    def data(self) -> bytes:
        """Every line kept, each with its newline."""
        return b"\n".join(self.blocks) + b"\n"

    def parse_whole(self, chunk: Chunk) -> Parsed:
        raise NotImplementedError


class Format:
    """An input format: subclass it, set the class attributes, add it to ``REGISTRY``."""

    name: ClassVar[str]  # as `sources.format` and the summary's `by_format` name it
    resume: ClassVar[Resume]
    tables: ClassVar[tuple[str, ...]]  # every table the parser may fill (rejects aside), in schemas/
    doc: ClassVar[str]  # the heading of its section in docs/ingest.md

    def sniff(self, head: Head) -> bool:
        """Whether ``head`` is the start of an object of this format."""
        raise NotImplementedError

    def last_line(self, tail: bytes, quiet: bool) -> LastLine:
        """What to do with a last line ``tail`` that no newline ends (never blank).

        ``quiet``: the object can no longer grow (a bucket object, a gzip, a local file
        untouched for a minute). The usual rule: a line is whole once nothing more comes.
        """
        return LastLine.TAKE if quiet else LastLine.WAIT

    def parser(self, context: ObjectContext) -> Parser:
        raise NotImplementedError
