"""The prompts ``hybridtrace verify`` sends: read from a JSON Lines file, or built from traffic.

A file holds one object per line, ``{"prompt": "text"}`` or ``{"prompt_token_ids": [...]}``,
with an optional ``id`` that the results and findings carry.

Without a file, prompts are built at the missing-prefix lengths the store's traffic shows
(``requests.missing_tokens``): p50, p95 and max by default, the lengths at which transfer
and recompute are worth comparing, since an average hides the tail. Each is a list of
token ids, so no tokenizer is needed: drawn at random below the served model's vocabulary
size, from its config in the store, one token longer than the missing prefix it stands for
(vLLM's decoder computes the last prompt token itself, so the prefill engine hands over
N-1 tokens).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

from hybridtrace.errors import UsageError

DEFAULT_LENGTHS = "p50,p95,max"
_PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?|100)$")


@dataclass(frozen=True)
class Prompt:
    index: int
    id: str | None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    missing_tokens: int | None = None  # the traffic length a built prompt stands for

    @property
    def kind(self) -> str:
        return "text" if self.text is not None else "token_ids"

    @property
    def payload(self) -> str | list[int]:
        """What goes in the request's ``prompt`` (vLLM takes token ids there as a list)."""
        return self.text if self.text is not None else list(self.token_ids or ())

    @property
    def sha256(self) -> str:
        raw = self.text if self.text is not None else json.dumps(list(self.token_ids or ()))
        return hashlib.sha256(raw.encode()).hexdigest()

    @property
    def label(self) -> str:
        return self.id if self.id is not None else f"#{self.index}"


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a JSON Lines file; any malformed line is a UsageError naming it."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"--prompts {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"--prompts {path}: cannot read it: {reason}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{where}: each line is an object with prompt or prompt_token_ids")
        text, ids = record.get("prompt"), record.get("prompt_token_ids")
        if (text is None) == (ids is None):
            raise UsageError(f"{where}: give one of prompt (text) and prompt_token_ids (a list of ints)")
        if text is not None and (not isinstance(text, str) or not text):
            raise UsageError(f"{where}: prompt must be non-empty text")
        if ids is not None and not (isinstance(ids, list) and ids and all(_token(t) for t in ids)):
            raise UsageError(f"{where}: prompt_token_ids must be a non-empty list of non-negative ints")
        raw_id = record.get("id")
        if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
            raise UsageError(f"{where}: id must be text or a number")
        prompt_id = None if raw_id is None else str(raw_id)
        if prompt_id is not None:
            if prompt_id in seen:
                raise UsageError(f"{where}: id {prompt_id!r} is used on line {seen[prompt_id]} too")
            seen[prompt_id] = number
        prompts.append(Prompt(len(prompts), prompt_id, text=text, token_ids=tuple(ids) if ids else None))
    if not prompts:
        raise UsageError(f"--prompts {path}: the file holds no prompt")
    return prompts


def _token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_lengths(text: str) -> list[str]:
    """``p50,p95,max`` (any pNN, ``max``, or a number of tokens) as a checked list."""
    labels = [part.strip() for part in text.split(",") if part.strip()]
    if not labels:
        raise UsageError("--lengths: give p50, p95, max or numbers of tokens, comma-separated")
    for label in labels:
        if label != "max" and not _PERCENTILE.match(label) and not (label.isdigit() and int(label) > 0):
            raise UsageError(f"--lengths: {label!r} is not a percentile (p50, p95), max or a token count")
    return labels


def traffic_lengths(con: duckdb.DuckDBPyConnection, labels: list[str], where: str) -> dict[str, int]:
    """The missing-prefix length each label stands for in the store's request records."""
    count = con.execute("SELECT count(*) FROM requests WHERE missing_tokens > 0").fetchall()[0][0]
    if not count and any(not label.isdigit() for label in labels):
        raise UsageError(
            f"{where}: the store holds no traffic to take prompt lengths from (no request record with "
            "missing_tokens); ingest the connector trace first, or give --prompts FILE.jsonl"
        )
    lengths: dict[str, int] = {}
    for label in labels:
        if label.isdigit():
            lengths[label] = int(label)
            continue
        share = 1.0 if label == "max" else float(label[1:]) / 100
        value = con.execute(
            "SELECT quantile_disc(missing_tokens, ?) FROM requests WHERE missing_tokens > 0", [share]
        ).fetchall()[0][0]
        lengths[label] = int(value)
    return lengths


def vocab_size(con: duckdb.DuckDBPyConnection, served: str, where: str) -> int:
    """The served model's vocabulary size, from its config in the store's ``models`` table.

    The config named like the served model, else the one the traffic's decode engines are
    sized with, else the store's only config, else a built-in config of that name.
    """
    from hybridtrace.model.catalog import read_builtin

    def key(name: str | None) -> str | None:
        return name.rsplit("/", 1)[-1].lower() if name else None

    models = con.execute("SELECT model, config FROM models ORDER BY ingested_at").fetchall()
    sized = {
        row[0]
        for row in con.execute(
            "SELECT DISTINCT m.model FROM engine_models m JOIN requests r USING (engine_id) "
            "WHERE m.model IS NOT NULL"
        ).fetchall()
    }
    chosen = (
        [c for m, c in models if key(m) == key(served)]
        or [c for m, c in models if m in sized]
        or ([models[-1][1]] if len({m for m, _ in models}) == 1 else [])
    )
    configs = [json.loads(chosen[-1])] if chosen else []
    if not configs:
        for name in (served, *sorted(sized)):
            builtin = read_builtin(name)
            if builtin is not None:
                configs.append(builtin[0])
                break
    for config in configs:
        for section in (config, config.get("text_config"), config.get("llm_config")):
            size = section.get("vocab_size") if isinstance(section, dict) else None
            if isinstance(size, int) and size > 0:
                return size
    raise UsageError(
        f"{where}: no model config in the store gives {served}'s vocabulary size; ingest its config.json "
        "(hybridtrace ingest --model CONFIG), or give --prompts FILE.jsonl"
    )


def traffic_prompts(lengths: dict[str, int], vocab: int, seed: int, longest: int | None) -> list[Prompt]:
    """One prompt of random token ids per length; ``longest`` caps the prompt (the model's window).

    Ids come from the middle of the vocabulary: the lowest are special and byte tokens in
    most tokenizers, and a config's vocab_size often rounds the embedding up past the
    tokenizer's last real token.
    """
    low, high = vocab // 100, vocab - vocab // 20
    if high <= low:
        low, high = 0, vocab
    prompts = []
    for index, (label, missing) in enumerate(lengths.items()):
        tokens = missing + 1
        if longest is not None:
            tokens = max(1, min(tokens, longest))
        draw = random.Random(f"{seed}:{label}:{missing}")  # the same store and seed: the same prompts
        ids = tuple(draw.randrange(low, high) for _ in range(tokens))
        prompts.append(Prompt(index, label, token_ids=ids, missing_tokens=missing))
    return prompts
