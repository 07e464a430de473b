"""``hybridtrace verify``: greedy outputs of a P/D deployment against a colocated control.

Each prompt goes to both servers alike (temperature 0, a fixed seed, logprobs, the same
max_tokens, EOS ignored so both run the full length), a bounded number at a time; the
answers are compared token by token (``verify_compare``) and each comparison becomes a
``verifications`` row, committed in batches (``verify_store``). The P/D deployment's
answer id is the key that joins a row to the trace (``requests.external_request_id``), so
a divergent request finds its transfers, per-rank reads and log events, and the analyzer
raises ``output_mismatch`` with them as evidence.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import TextIO

from hybridtrace.errors import UsageError
from hybridtrace.store import Store
from hybridtrace.verify_client import Answer, ModelNotServed, PromptError, Side, api_key, base_url
from hybridtrace.verify_compare import LogprobsMissing, compare, output_of
from hybridtrace.verify_prompts import (
    DEFAULT_LENGTHS,
    Prompt,
    parse_lengths,
    read_prompts,
    traffic_lengths,
    traffic_prompts,
    vocab_size,
)
from hybridtrace.verify_store import LOCK_WAIT_S, VerifyWriter

STATUSES = ("match", "near_tie", "mismatch", "error")
# What a verify can be told to fail on (--fail-on, a job's [verify] fail_on).
OUTCOMES = ("mismatch", "near_tie")


@dataclass
class VerifyOptions:
    pd: str
    control: str
    store: str
    prompts: str | None = None  # a JSON Lines file; else prompts built at the traffic's lengths
    lengths: str | None = None  # p50,p95,max (the default without a file)
    max_tokens: int = 32
    logprobs: int = 5
    concurrency: int = 4
    tie_tolerance: float = 0.01
    timeout_s: float = 120.0
    retries: int = 3
    model: str | None = None
    seed: int = 0
    progress: bool = False

    def check(self) -> None:
        if self.prompts is not None and self.lengths is not None:
            raise UsageError("give --prompts or --lengths, not both")
        if not 1 <= self.max_tokens <= 1_000_000:
            raise UsageError("--max-tokens must be at least 1")
        if not 2 <= self.logprobs <= 100:
            # two candidates per token is the least that tells a near tie from a divergence
            raise UsageError("--logprobs must be between 2 and 100 (a near tie needs the top two)")
        if not 1 <= self.concurrency <= 1024:
            raise UsageError("--concurrency must be between 1 and 1024")
        if not (math.isfinite(self.tie_tolerance) and self.tie_tolerance >= 0):
            raise UsageError("--tie-tolerance must be a non-negative number of nats")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise UsageError("--timeout must be a positive number of seconds")
        if not 0 <= self.retries <= 20:
            raise UsageError("--retries must be between 0 and 20")
        if not 0 <= self.seed < 2**63:
            raise UsageError("--seed must be a non-negative whole number")


@dataclass
class VerifySummary:
    run_id: str
    store: str
    model: str | None = None
    pd_url: str = ""
    control_url: str = ""
    prompts: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    results: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    batches: int = 0
    seconds: float = 0.0

    @property
    def errors(self) -> list[dict]:
        return [r for r in self.results if r["status"] == "error"]

    def matched(self, outcomes: set[str]) -> list[str]:
        return sorted(k for k in outcomes if self.by_status.get(k))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Progress:
    """Prompts done so far, on stderr: one rewritten line on a terminal, else a line per tenth."""

    def __init__(self, enabled: bool, total: int, stream: TextIO | None = None) -> None:
        self.enabled, self.total = enabled, total
        self.stream = stream or sys.stderr
        self.tty = enabled and self.stream.isatty()
        self.step = max(1, total // 10)
        self.done = 0

    def note(self, message: str) -> None:
        if self.enabled:
            self.stream.write(("\n" if self.tty else "") + f"hybridtrace verify: {message}\n")
            self.stream.flush()

    def update(self, counts: dict[str, int]) -> None:
        self.done += 1
        if not self.enabled:
            return
        line = (f"hybridtrace verify: {self.done}/{self.total} prompts · {counts['mismatch']} mismatch · "
                f"{counts['near_tie']} near tie · {counts['error']} error")  # fmt: skip
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done == self.total else ""))
        elif self.done % self.step == 0 or self.done == self.total:
            self.stream.write(line + "\n")
        self.stream.flush()


def parse_outcomes(text: str, where: str) -> set[str]:
    """What to fail on: "mismatch", "near_tie" (comma-separated), or "any"."""
    if text.strip() == "any":
        return set(OUTCOMES)
    outcomes = {part.strip() for part in text.split(",") if part.strip()}
    if not outcomes or outcomes - set(OUTCOMES):
        raise UsageError(f"{where}: give {', '.join(OUTCOMES)} (comma-separated) or any, not {text!r}")
    return outcomes


def verify(options: VerifyOptions) -> VerifySummary:
    """Send every prompt to both servers, compare, and commit the rows to the store."""
    options.check()
    pd_url, control_url = base_url(options.pd, "--pd"), base_url(options.control, "--control")
    store = Store(options.store)
    prompts: list[Prompt] | None = None
    lengths: dict[str, int] | None = None
    con = None
    if options.prompts is not None:
        prompts = read_prompts(options.prompts)
    else:
        labels = parse_lengths(options.lengths or DEFAULT_LENGTHS)
        from hybridtrace.store.analysis import open_analysis

        con = open_analysis(
            store, views=False,
            missing=" to take prompt lengths from (ingest the trace first, or give --prompts FILE.jsonl)",
        )  # fmt: skip
        lengths = traffic_lengths(con, labels, str(store))
    summary = VerifySummary(run_id=uuid.uuid4().hex, store=str(store), pd_url=pd_url, control_url=control_url)
    started = time.monotonic()
    asyncio.run(_run(options, summary, store, prompts, lengths, con))
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def _choose_model(
    asked: str | None, pd: list[dict] | None, control: list[dict], sides: tuple[Side, Side]
) -> dict:
    """The model card both servers serve under one name; a clear error when they do not.

    ``pd`` is None when the P/D's router lists no models: the name is then the one asked,
    or the control's only model, and the P/D's answers are checked against it.
    """
    listed = pd if pd is not None else control
    pd_names, control_names = [m["id"] for m in listed], [m["id"] for m in control]
    who = "the P/D deployment" if pd is not None else "the control"
    if asked is not None:
        name = asked
        if name not in pd_names:
            served = ", ".join(pd_names) or "nothing"
            raise UsageError(f"{who} does not serve {name!r} (it serves {served})")
    elif len(pd_names) == 1:
        name = pd_names[0]
    else:
        raise UsageError(
            f"{who} serves {len(pd_names)} models ({', '.join(pd_names) or 'none'}): name one with --model"
        )
    if name not in control_names:
        raise UsageError(
            f"model mismatch: the P/D deployment serves {name!r}, the control at {sides[1].url} serves "
            f"{', '.join(repr(n) for n in control_names) or 'nothing'}; a colocated control runs the same "
            "model under the same name (vllm serve MODEL --served-model-name NAME)"
        )
    card = next(m for m in listed if m["id"] == name)
    other = next(m for m in control if m["id"] == name)
    limits = [c.get("max_model_len") for c in (card, other) if isinstance(c.get("max_model_len"), int)]
    return {"id": name, "max_model_len": min(limits) if limits else None}


async def _run(
    options: VerifyOptions,
    summary: VerifySummary,
    store: Store,
    prompts: list[Prompt] | None,
    lengths: dict[str, int] | None,
    con,
) -> None:
    progress = _Progress(options.progress, 0)
    limits = (options.timeout_s, options.retries)
    pd = Side("P/D deployment", "HYBRIDTRACE_PD_API_KEY", True, summary.pd_url, *limits, api_key("pd"),
              progress.note)  # fmt: skip
    control = Side("control", "HYBRIDTRACE_CONTROL_API_KEY", False, summary.control_url, *limits,
                   api_key("control"), progress.note)  # fmt: skip
    try:
        pd_models, control_models = await asyncio.gather(pd.models(), control.models())
        card = _choose_model(options.model, pd_models, control_models, (pd, control))
        summary.model = card["id"]
        if prompts is None:
            assert lengths is not None and con is not None
            vocab = vocab_size(con, card["id"], str(store))
            longest = card["max_model_len"] - options.max_tokens if card["max_model_len"] else None
            if longest is not None and longest < 1:
                raise UsageError(f"--max-tokens {options.max_tokens} leaves no room for a prompt in "
                                 f"{card['id']}'s {card['max_model_len']}-token window")  # fmt: skip
            prompts = traffic_prompts(lengths, vocab, options.seed, longest)
            for prompt in prompts:
                missing = prompt.missing_tokens
                if longest is not None and missing is not None and missing + 1 > longest:
                    summary.notes.append(
                        f"{prompt.id}: {missing} missing tokens do not fit {card['id']}'s window with "
                        f"--max-tokens {options.max_tokens}; sent {longest} prompt tokens"
                    )
        summary.prompts = len(prompts)
        progress.total, progress.step = len(prompts), max(1, len(prompts) // 10)
        store.init()
        writer = VerifyWriter(store, summary.run_id, on_wait=progress.note)
        await _compare_all(options, summary, prompts, (pd, control), writer, progress)
        summary.batches = writer.batches
    finally:
        await asyncio.gather(pd.close(), control.close())


async def _compare_all(
    options: VerifyOptions,
    summary: VerifySummary,
    prompts: list[Prompt],
    sides: tuple[Side, Side],
    writer: VerifyWriter,
    progress: _Progress,
) -> None:
    gate = asyncio.Semaphore(options.concurrency)
    committing = asyncio.Lock()

    async def one(prompt: Prompt) -> dict:
        async with gate:
            return await _verify_one(options, summary, prompt, sides)

    tasks = [asyncio.create_task(one(p)) for p in prompts]
    try:
        for finished in asyncio.as_completed(tasks):
            row = await finished
            summary.results.append(row)
            summary.by_status[row["status"]] += 1
            writer.add(row)
            progress.update(summary.by_status)
            if writer.due() and not committing.locked():
                async with committing:
                    await asyncio.to_thread(writer.commit)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # what was compared is kept, whether the run ended or stopped on an error
        async with committing:
            await asyncio.to_thread(writer.commit, wait_s=LOCK_WAIT_S)
    summary.results.sort(key=lambda r: r["prompt_index"])


async def _verify_one(options: VerifyOptions, summary: VerifySummary, prompt: Prompt,
                      sides: tuple[Side, Side]) -> dict:  # fmt: skip
    body = {
        "model": summary.model,
        "prompt": prompt.payload,
        "max_tokens": options.max_tokens,
        "temperature": 0.0,
        "seed": options.seed,
        "n": 1,
        "logprobs": options.logprobs,
        "echo": False,
        "stream": False,
        # vLLM: run both to max_tokens, and name each token by its id rather than its text
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    answers = await asyncio.gather(*(side.complete(body) for side in sides), return_exceptions=True)
    for side, answer in zip(sides, answers, strict=True):
        if isinstance(answer, ModelNotServed):
            other = "control" if side is sides[0] else "P/D deployment"
            raise UsageError(f"model mismatch: the {side.name} does not serve {summary.model!r}, which the "
                             f"{other} serves ({answer})")  # fmt: skip
        if isinstance(answer, BaseException) and not isinstance(answer, PromptError):
            raise answer
    row: dict = {
        "run_id": summary.run_id, "prompt_index": prompt.index, "prompt_id": prompt.id,
        "prompt_sha256": prompt.sha256, "prompt_kind": prompt.kind,
        "missing_tokens_target": prompt.missing_tokens, "model": summary.model,
        "pd_url": summary.pd_url, "control_url": summary.control_url,
        "max_tokens": options.max_tokens, "logprobs": options.logprobs, "seed": options.seed,
        "tie_tolerance": options.tie_tolerance,
    }  # fmt: skip
    failures = []
    for prefix, side, answer in zip(("pd", "control"), sides, answers, strict=True):
        if isinstance(answer, PromptError):
            failures.append(str(answer))
            row[f"{prefix}_attempts"] = answer.attempts
            continue
        assert isinstance(answer, Answer)
        if answer.model is not None and answer.model != summary.model:
            raise UsageError(f"model mismatch: asked for {summary.model!r}, the {side.name} answered as "
                             f"{answer.model!r}")  # fmt: skip
        row.update({f"{prefix}_response_id": answer.response_id, f"{prefix}_attempts": answer.attempts,
                    f"{prefix}_seconds": round(answer.seconds, 6),
                    f"{prefix}_finish_reason": answer.body.get("finish_reason")})  # fmt: skip
        if prefix == "control":
            row["prompt_tokens"] = answer.prompt_tokens
    if prompt.token_ids is not None and row.get("prompt_tokens") is None:
        row["prompt_tokens"] = len(prompt.token_ids)
    row["ts"] = time.time()
    if failures:
        row.update(status="error", error="; ".join(failures))
        return row
    outputs = []
    for side, answer in zip(sides, answers, strict=True):
        assert isinstance(answer, Answer)
        try:
            outputs.append(output_of(answer.body))
        except LogprobsMissing:
            raise UsageError(
                f"the {side.name} at {side.url} ignored logprobs: its answer has no per-token logprobs "
                "(tokens, token_logprobs, top_logprobs), so the outputs cannot be compared token by token"
            ) from None
    result = compare(outputs[0], outputs[1], options.tie_tolerance)
    row.update(
        status=result.status,
        tokens_compared=result.tokens_compared,
        pd_tokens=len(outputs[0].tokens),
        control_tokens=len(outputs[1].tokens),
        first_divergence=result.first_divergence,
        max_logprob_diff=result.max_logprob_diff,
        control_top_gap=result.control_top_gap,
        pd_token_control_logprob=result.pd_token_control_logprob,
        pd_token_id=result.pd_token_id,
        control_token_id=result.control_token_id,
    )
    return row
