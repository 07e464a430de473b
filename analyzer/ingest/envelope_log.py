"""A vLLM log inside an envelope: unwrap each chunk, then parse it per instance.

One collector object can hold many pods' lines, interleaved. Each instance the envelope
names gets a parser context of its own (its own unfinished event, year, TP size and
engine id), so its lines become rows of its own engine: the NIXL engine id its log states,
else the pod's name, else (no instance named) the object's folder, as for a bare log.

What the reader must hold back for the next read is the earliest envelope line any part
is still waiting on: a partial line (CRI ``P``, Docker's split records) or the last,
perhaps unfinished, event of any instance. A read resumed from there parses some lines of
other instances again; their rows have the keys already stored and are dropped as
duplicates, so nothing is counted twice. The engine id of each instance is kept in the
manifest (``sources.instances``) so that a resumed read names the same engines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl

from hybridtrace.ingest import vllm_log
from hybridtrace.ingest.envelopes import NO_INSTANCE, Instance, Unwrapper

# An instance's unfinished last event is taken as whole once this many envelope lines have
# followed it (other instances' lines): a read then holds back only what may still grow.
SETTLED_LINES = 256


def instance_key(instance: Instance) -> str:
    """How the manifest names an instance: ``namespace/pod/container``, parts left empty."""
    return "/".join(part or "" for part in (instance.namespace, instance.pod, instance.container))


@dataclass
class InstanceResult:
    engine_id: str
    ctx: vllm_log.LogContext
    result: vllm_log.LogResult


@dataclass
class EnvelopeLog:
    kind: str
    uri: str
    mtime: float
    year: int | None
    tz: str
    folder_engine_id: str
    path_instance: Instance = NO_INSTANCE
    # from the manifest of an earlier read: instance key -> the engine id its log stated
    engine_ids: dict[str, str] = field(default_factory=dict)
    resume_ts: float | None = None
    contexts: dict[Instance, vllm_log.LogContext] = field(default_factory=dict)
    _unwrapper: Unwrapper | None = None
    # byte size of each envelope line from the earliest one still held back (line -> bytes)
    _sizes: dict[int, int] = field(default_factory=dict)
    # The parser tells lines apart by number, but one envelope line can hold many vLLM
    # lines (a Loki push, a CloudWatch payload): each unwrapped line gets a number of its
    # own, and its rows get back the envelope line's number (virtual -> envelope line).
    _origin: dict[int, int] = field(default_factory=dict)
    _next_virtual: int = 1

    def __post_init__(self) -> None:
        self._unwrapper = Unwrapper(self.kind, self.path_instance)

    def _context(self, instance: Instance) -> vllm_log.LogContext:
        ctx = self.contexts.get(instance)
        if ctx is None:
            ctx = vllm_log.LogContext(
                uri=self.uri,
                mtime=self.mtime,
                year=self.year,
                tz=self.tz,
                engine_id=self.engine_ids.get(instance_key(instance)),
                fallback_engine_id=instance.name or self.folder_engine_id,
            )
            ctx.resume_ts = self.resume_ts
            self.contexts[instance] = ctx
        return ctx

    def parse(
        self, texts: list[str], first_line: int, final: bool, sizes: list[int] | None = None
    ) -> tuple[list[InstanceResult], list[dict]]:
        """Rows per instance, and the envelope's rejects, for the lines ``texts``.

        ``sizes``: each line's length in bytes as read (its text's UTF-8 length when not given).
        """
        assert self._unwrapper is not None
        for i, text in enumerate(texts):
            self._sizes[first_line + i] = (sizes[i] if sizes is not None else len(text.encode())) + 1
        out = self._unwrapper.feed(texts, first_line, final)
        last_line = first_line + len(texts) - 1
        results: list[InstanceResult] = []
        # every context sees every chunk, so that at the end each one's last event is read
        instances = list(dict.fromkeys([*self.contexts, *out.groups]))
        for instance in instances:
            ctx = self._context(instance)
            lines = out.groups.get(instance, [])
            if not lines and not ctx.carry:
                continue
            numbers = list(range(self._next_virtual, self._next_virtual + len(lines)))
            self._next_virtual += len(lines)
            self._origin.update(zip(numbers, (n for n, _ in lines), strict=True))
            frame = pl.DataFrame(
                {"line_number": numbers, "raw": [t for _, t in lines]},
                schema={"line_number": pl.Int64, "raw": pl.String},
            )
            result = vllm_log.LogResult()
            vllm_log.parse_chunk(ctx, frame, final, result)
            if not final and ctx.carry and self._origin.get(ctx.carry[0][0], 0) < last_line - SETTLED_LINES:
                # vLLM writes a multi-line event at once: an instance's last event that many
                # lines of others have followed is whole, and is read now, not held back
                vllm_log.parse_chunk(ctx, frame.clear(), True, result)
            self._renumber(result)
            engine_id = vllm_log.finish(ctx, result)
            if result.engine.get("engine_id"):
                ctx.engine_id = result.engine["engine_id"]
                self.engine_ids[instance_key(instance)] = ctx.engine_id
            results.append(InstanceResult(engine_id, ctx, result))
        held = self.held_from()
        for number in [n for n in self._sizes if held is None or n < held]:
            del self._sizes[number]
        carried = min((ctx.carry[0][0] for ctx in self.contexts.values() if ctx.carry), default=None)
        for number in [n for n in self._origin if carried is None or n < carried]:
            del self._origin[number]
        return results, out.rejects

    def _renumber(self, result: vllm_log.LogResult) -> None:
        origin = self._origin
        for rows in (result.events, result.intervals, result.rejects):
            for row in rows:
                if row.get("line_number") is not None:
                    row["line_number"] = origin.get(row["line_number"], row["line_number"])
        if result.event_frames:
            old, new = list(origin), list(origin.values())
            result.event_frames = [
                frame.with_columns(pl.col("line_number").replace(old, new)) for frame in result.event_frames
            ]

    def held_from(self) -> int | None:
        """The first envelope line that a later read must read again."""
        assert self._unwrapper is not None
        firsts = [self._origin.get(c.carry[0][0], c.carry[0][0]) for c in self.contexts.values() if c.carry]
        partial = self._unwrapper.held_from()
        if partial is not None:
            firsts.append(partial)
        return min(firsts, default=None)

    def kept_back(self, next_line: int) -> tuple[int, int]:
        """(bytes, lines) held back before ``next_line``, the line after the chunk just parsed."""
        held = self.held_from()
        if held is None:
            return 0, 0
        return sum(size for n, size in self._sizes.items() if n >= held), next_line - held

    def latest_ts(self) -> float | None:
        stamps = [ctx.latest_ts for ctx in self.contexts.values() if ctx.latest_ts is not None]
        return max(stamps, default=None)

    def instances_json(self) -> str | None:
        """The manifest's record of each instance's engine id (None for a single unnamed one)."""
        named = {key: value for key, value in self.engine_ids.items() if key != instance_key(NO_INSTANCE)}
        return json.dumps(named, sort_keys=True) if named else None
