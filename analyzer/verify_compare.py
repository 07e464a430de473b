"""Two greedy outputs of the same prompt, compared token by token.

vLLM's /v1/completions answers with ``logprobs`` = ``{tokens, token_logprobs,
top_logprobs, text_offset}``: per output token its text (``token_id:N`` when the request
asked ``return_tokens_as_token_ids``), the logprob of the token chosen, and a dict of the
top candidates' logprobs (the chosen one among them). The comparison says where the two
outputs part and whether that parting is a near tie: the control's best two candidates
within a tolerance, and the P/D deployment took the other one. Greedy decoding resolves
such a tie by the last bits of a logit, which batch composition alone can change, so a
near tie says nothing about the handoff; a real divergence does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class LogprobsMissing(Exception):
    """The answer carries no per-token logprobs: the server ignored ``logprobs``."""


@dataclass(frozen=True)
class Output:
    tokens: list[str]
    logprobs: list[float | None]
    top: list[dict[str, float]]
    finish_reason: str | None


@dataclass(frozen=True)
class Comparison:
    status: str  # match, near_tie or mismatch
    tokens_compared: int
    first_divergence: int | None
    max_logprob_diff: float | None
    control_top_gap: float | None
    pd_token_control_logprob: float | None
    pd_token_id: int | None
    control_token_id: int | None


def output_of(choice: dict) -> Output:
    """The tokens and logprobs of one answer's first choice; LogprobsMissing without them."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise LogprobsMissing
    tokens, chosen, top = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    if not (isinstance(tokens, list) and isinstance(chosen, list) and isinstance(top, list)):
        raise LogprobsMissing
    if not (len(tokens) == len(chosen) == len(top)):
        raise LogprobsMissing
    tops = [
        {str(k): float(v) for k, v in entry.items() if _number(v)} if isinstance(entry, dict) else {}
        for entry in top
    ]
    values = [float(v) if _number(v) else None for v in chosen]
    finish = choice.get("finish_reason")
    return Output([str(t) for t in tokens], values, tops, finish if isinstance(finish, str) else None)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def token_id(token: str) -> int | None:
    match = _TOKEN_ID.match(token)
    return int(match.group(1)) if match else None


def compare(pd: Output, control: Output, tie_tolerance: float) -> Comparison:
    """Where ``pd`` parts from ``control``, and whether the parting is a near tie."""
    common = min(len(pd.tokens), len(control.tokens))
    first = next((i for i in range(common) if pd.tokens[i] != control.tokens[i]), None)
    if first is None and len(pd.tokens) != len(control.tokens):
        first = common  # one side stopped (a stop condition) where the other went on
    prefix = common if first is None else first
    diffs = [
        abs(a - b)
        for a, b in zip(pd.logprobs[:prefix], control.logprobs[:prefix], strict=True)
        if a is not None and b is not None
    ]
    max_diff = max(diffs) if diffs else None
    if first is None:
        return Comparison("match", common, None, max_diff, None, None, None, None)
    gap = theirs = None
    pd_token = pd.tokens[first] if first < len(pd.tokens) else None
    control_token = control.tokens[first] if first < len(control.tokens) else None
    status = "mismatch"
    if pd_token is not None and control_token is not None:
        ranked = sorted(control.top[first].values(), reverse=True)
        gap = ranked[0] - ranked[1] if len(ranked) >= 2 else None
        theirs = control.top[first].get(pd_token)
        best = control.logprobs[first] if control.logprobs[first] is not None else (ranked or [None])[0]
        # a near tie: the P/D's token was (nearly) as likely as the control's own
        if theirs is not None and best is not None and best - theirs <= tie_tolerance:
            status = "near_tie"
    return Comparison(
        status,
        common,
        first,
        max_diff,
        gap,
        theirs,
        token_id(pd_token) if pd_token is not None else None,
        token_id(control_token) if control_token is not None else None,
    )
