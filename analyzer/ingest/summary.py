"""What one ``ingest`` run did, as it returns it (and the CLI and the job print it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IngestSummary:
    objects_seen: int = 0
    objects_read: int = 0
    objects_skipped: int = 0
    bytes_read: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    rejects: int = 0
    duplicates: int = 0
    recovered_files: int = 0
    objects_gone: int = 0
    compacted_batches: int = 0
    compaction_error: str | None = None
    errors: int = 0  # objects (or folders) that could not be read; the run went on without them
    error_messages: list[str] = field(default_factory=list)  # the first few, "uri: why"
    objects_left_out: int = 0  # listed but not to be read (a link out of the input, a FIFO), said once
    left_out_messages: list[str] = field(default_factory=list)  # the first few, "uri: why"
    seconds: float = 0.0
    by_format: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["mb_per_s"] = round(self.bytes_read / 1e6 / self.seconds, 1) if self.seconds else None
        return out
