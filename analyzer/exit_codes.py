"""How an analysis ends: the exit code from its findings, ``--fail-on`` and ``--strict``.

``analyze`` and the scheduled job (``run``) decide the same way, here: 2 when inputs could
not be read (the job only: the rest was still analysed and published), else 2 when
``strict`` asks for something to analyze and the store has neither transfers nor intervals,
else 1 when a finding of a ``fail_on`` kind was found, else 0. A scheduler reads 1 as
"alert" and 2 as "the run itself is wrong", so the error cases come first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

NOTHING_TO_ANALYZE = "nothing to analyze: no transfers and no intervals in the store"


@dataclass(frozen=True)
class Outcome:
    """The exit code, the job's status word for it, and the ``fail_on`` kinds found."""

    code: int
    status: str
    matched: list[str] = field(default_factory=list)
    message: str | None = None  # said on stderr when the code is an error


def decide_exit(
    by_kind: Mapping[str, int],
    inputs: Mapping[str, int],
    *,
    fail_on: Collection[str] = (),
    strict: bool = False,
    unreadable: int = 0,
) -> Outcome:
    """The exit code of an analysis: ``by_kind`` counts findings, ``inputs`` rows per input."""
    matched = sorted(kind for kind in fail_on if by_kind.get(kind))
    if unreadable:
        return Outcome(EXIT_ERROR, "unreadable input", matched)
    if strict and not (inputs.get("transfers") or inputs.get("intervals")):
        return Outcome(EXIT_ERROR, "nothing to analyze", matched, NOTHING_TO_ANALYZE)
    if matched:
        return Outcome(EXIT_FINDINGS, "findings", matched)
    return Outcome(EXIT_OK, "ok", matched)
