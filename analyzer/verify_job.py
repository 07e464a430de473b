"""The scheduled job's verify step: ``[verify]`` of ``job.toml``, and its own alert policy.

When the job file has a ``[verify]`` table, each run sends its prompts to the P/D
deployment and the control after the ingest and before the analysis, so the report and
``[alert] fail_on`` (which may name ``output_mismatch``) see this run's comparisons::

    [verify]
    pd = "http://pd-router:8000"
    control = "http://control:8000"
    prompts = "/etc/hybridtrace/prompts.jsonl"   # or lengths = "p50,p95,max" (the default)
    max_tokens = 32
    fail_on = ["mismatch"]                        # or "any" (mismatch and near_tie)

The step's policy is its own: ``fail_on`` makes the run exit 1 when a prompt's outputs
part that way, whatever ``[alert]`` says; a prompt that could not be compared, or a step
that could not run at all (a server down, a model mismatch), makes it exit 2, after the
analysis and the report are done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from hybridtrace.errors import HybridtraceError, UsageError
from hybridtrace.verify import VerifyOptions, parse_outcomes, verify
from hybridtrace.verify_client import base_url

_TEXT = ("pd", "control", "prompts", "lengths", "model")
_WHOLE = ("max_tokens", "logprobs", "concurrency", "retries", "seed")
_NUMBERS = ("tie_tolerance", "timeout_s")
KEYS = (*_TEXT, *_WHOLE, *_NUMBERS, "fail_on")


@dataclass
class VerifyStep:
    options: VerifyOptions
    fail_on: set[str] = field(default_factory=set)


def load_verify_step(raw: object, path: Path, store: str) -> VerifyStep | None:
    """``[verify]`` checked now (a bad key fails the job file, not a later run); None without it."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: [verify] must be a table")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise UsageError(f"{path}: [verify] has unknown keys {unknown} (known: {', '.join(KEYS)})")
    for key in ("pd", "control"):
        if not isinstance(raw.get(key), str):
            raise UsageError(f"{path}: [verify] {key} (the server's URL) is required")
        base_url(raw[key], f"{path}: [verify] {key}")
    for key in _TEXT:
        if key in raw and not isinstance(raw[key], str):
            raise UsageError(f"{path}: [verify] {key} must be a string, not {raw[key]!r}")
    for key in _WHOLE:
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], int)):
            raise UsageError(f"{path}: [verify] {key} must be a whole number, not {raw[key]!r}")
    for key in _NUMBERS:
        value = raw.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if key in raw and not number:
            raise UsageError(f"{path}: [verify] {key} must be a number, not {value!r}")
    known = {f.name for f in fields(VerifyOptions)}
    options = VerifyOptions(store=store, **{k: v for k, v in raw.items() if k in known})
    try:
        options.check()
    except UsageError as exc:
        raise UsageError(f"{path}: [verify]: {exc}") from None
    fail_on = raw.get("fail_on")
    outcomes: set[str] = set()
    if fail_on is not None:
        if not isinstance(fail_on, (str, list)) or not all(isinstance(k, str) for k in fail_on):
            raise UsageError(f"{path}: [verify] fail_on must be a list of outcomes or \"any\"")
        listed = fail_on if isinstance(fail_on, str) else ",".join(fail_on)
        outcomes = parse_outcomes(listed, f"{path}: [verify] fail_on")
    return VerifyStep(options, outcomes)


def run_verify_step(step: VerifyStep) -> dict:
    """Run the step; its part of the job's summary (never raises for what a run can meet)."""
    try:
        done = verify(step.options)
    except HybridtraceError as exc:
        return {"status": "error", "message": str(exc)}
    errors = done.errors
    out = {
        "status": "error" if errors else "ok",
        "run_id": done.run_id,
        "model": done.model,
        "prompts": done.prompts,
        **done.by_status,
        "fail_on_matched": done.matched(step.fail_on),
        "seconds": done.seconds,
    }
    if errors:
        first = errors[0]
        label = first["prompt_id"] or f"#{first['prompt_index']}"
        out["message"] = (f"{len(errors)} of {done.prompts} prompts could not be compared (first, "
                          f"{label}: {first['error']})")  # fmt: skip
    return out


def judge(step: dict | None, code: int, status: str) -> tuple[int, str]:
    """The job's exit code and status with the verify step's outcome weighed in.

    An error the run already has stands; a step that failed comes next (exit 2, ``verify
    error``); then the analysis' own findings (exit 1, ``findings``); then the step's
    ``fail_on`` (exit 1, ``output mismatch``).
    """
    if step is None or code == 2:
        return code, status
    if step["status"] == "error":
        return 2, "verify error"
    if code == 0 and step.get("fail_on_matched"):
        return 1, "output mismatch"
    return code, status
