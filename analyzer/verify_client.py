"""The HTTP side of ``hybridtrace verify``: two OpenAI-compatible servers, asked alike.

One ``Side`` per server (the P/D deployment behind its router or proxy, and the colocated
control), each with its own httpx client, API key and retry budget. A request that meets
429 or a 5xx answer, or a dropped connection, is tried again after a growing pause (or
the server's ``Retry-After``); a request that times out is not, since a server that hung
once on a generation will most likely hang again and each try costs a whole generation.
Errors name the side, the URL and what happened, never an API key, a prompt or an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from hybridtrace.errors import UsageError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_S = 0.5  # first pause; doubled after each try
BACKOFF_MAX_S = 30.0  # a Retry-After beyond this is not waited for in full
CONNECT_TIMEOUT_S = 10.0
ERROR_TEXT = 200  # characters of a server's own error message kept in ours


class ModelNotServed(UsageError):
    """The server answered 404 to a completion: it serves no model of that name."""


class PromptError(Exception):
    """One prompt could not be answered by one side: recorded, and the run goes on."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


@dataclass
class Answer:
    """One completion as the API returned it (the parts a comparison needs)."""

    response_id: str | None
    model: str | None
    body: dict  # the first choice
    attempts: int
    seconds: float
    prompt_tokens: int | None = None  # as the answer's usage counts them


def api_key(side: str) -> str | None:
    """The key for ``side`` ("pd" or "control"): its own variable, else OPENAI_API_KEY."""
    own = os.environ.get(f"HYBRIDTRACE_{side.upper()}_API_KEY")
    return own or os.environ.get("OPENAI_API_KEY") or None


def base_url(url: str, option: str) -> str:
    """The server's root URL: http(s), no credentials in it, any trailing ``/v1`` dropped."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option} {url!r}: give the server's http:// or https:// URL")
    if parts.username or parts.password:
        # a URL gets printed and stored; a key in it would be too
        raise UsageError(
            f"{option}: the URL holds credentials; give the API key in the environment "
            "(HYBRIDTRACE_PD_API_KEY, HYBRIDTRACE_CONTROL_API_KEY or OPENAI_API_KEY)"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"{option} {url!r}: give the server's base URL, without a query")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass
class Side:
    """One server: its name in messages, its URL, and a client with its key and limits."""

    name: str  # "P/D deployment" or "control"
    key_variable: str  # where its own key comes from, for messages
    models_optional: bool  # a router or proxy need not list its models
    url: str
    timeout_s: float
    retries: int
    key: str | None = field(default=None, repr=False)
    on_retry: Callable[[str], None] | None = None
    client: httpx.AsyncClient = field(init=False, repr=False)

    def __post_init__(self) -> None:
        headers = {"Accept": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        self.client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(CONNECT_TIMEOUT_S, self.timeout_s)),
            follow_redirects=False,  # a redirect elsewhere would carry the key along
        )

    async def close(self) -> None:
        await self.client.aclose()

    def scrub(self, text: str) -> str:
        """``text`` without this side's API key (a server may echo a header back)."""
        return text.replace(self.key, "***") if self.key and len(self.key) >= 4 else text

    async def _send(self, method: str, path: str, body: dict | None) -> tuple[httpx.Response, int, float]:
        """The response, tries made and seconds of the last try; raises PromptError."""
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                response = await self.client.request(method, path, json=body)
            except httpx.TimeoutException as exc:
                what = "connecting" if isinstance(exc, httpx.ConnectTimeout) else "waiting for the answer"
                if isinstance(exc, httpx.ConnectTimeout) and attempt <= self.retries:
                    await self._pause(attempt, None, f"no connection within {CONNECT_TIMEOUT_S:g} s")
                    continue
                raise PromptError(
                    f"{self.name} timed out {what} after {self.timeout_s:g} s (try {attempt})", attempt
                ) from None
            except httpx.TransportError as exc:
                reason = self.scrub(str(exc) or type(exc).__name__)
                if attempt <= self.retries:
                    await self._pause(attempt, None, reason)
                    continue
                raise PromptError(
                    f"cannot reach the {self.name} at {self.url}: {reason} ({attempt} tries)", attempt
                ) from None
            seconds = time.monotonic() - started
            if response.status_code in RETRY_STATUSES and attempt <= self.retries:
                retry_after = response.headers.get("retry-after")
                await self._pause(attempt, retry_after, f"HTTP {response.status_code}")
                continue
            return response, attempt, seconds

    async def _pause(self, attempt: int, retry_after: str | None, why: str) -> None:
        wait = BACKOFF_S * 2 ** (attempt - 1) * (1 + random.random() / 4)  # jitter: clients apart
        if retry_after is not None:
            with contextlib.suppress(ValueError):  # an HTTP date: the backoff stands
                wait = max(wait, min(float(retry_after), BACKOFF_MAX_S))
        if self.on_retry is not None:
            self.on_retry(f"{self.name}: {why}; try {attempt + 1} of {self.retries + 1} in {wait:.1f} s")
        await asyncio.sleep(wait)

    def _failure(self, response: httpx.Response, what: str, attempts: int) -> str:
        detail = _error_text(response)
        tries = f" after {attempts} tries" if attempts > 1 else ""
        return self.scrub(f"{self.name} answered {what} with HTTP {response.status_code}{tries}"
                          + (f": {detail}" if detail else ""))  # fmt: skip

    async def models(self) -> list[dict] | None:
        """The models the server lists (GET /v1/models); None when it has no such route.

        vLLM's P/D proxies route completions only (GET /v1/models is a 404 there); the model
        is then checked on the answers. Any other failure is a UsageError.
        """
        try:
            response, attempts, _ = await self._send("GET", "/v1/models", None)
        except PromptError as exc:
            raise UsageError(str(exc)) from None
        if response.status_code in (401, 403):
            raise UsageError(
                f"the {self.name} at {self.url} refused the API key (HTTP {response.status_code}); "
                f"set {self.key_variable} or OPENAI_API_KEY"
            )
        if response.status_code == 404 and self.models_optional:
            return None
        if response.status_code != 200:
            raise UsageError(
                f"{self.url} does not look like an OpenAI-compatible server: "
                + self._failure(response, "GET /v1/models", attempts)
            )
        try:
            listed = response.json()["data"]
            return [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                f"{self.url} does not look like an OpenAI-compatible server: GET /v1/models did not "
                "answer with a model list"
            ) from None

    async def complete(self, body: dict) -> Answer:
        """POST /v1/completions; PromptError for anything short of a well-formed answer."""
        response, attempts, seconds = await self._send("POST", "/v1/completions", body)
        if response.status_code == 404:
            raise ModelNotServed(self._failure(response, "POST /v1/completions", attempts))
        if response.status_code in (401, 403):
            # the same for every prompt: the run cannot go on
            raise UsageError(self._failure(response, "POST /v1/completions", attempts))
        if response.status_code != 200:
            raise PromptError(self._failure(response, "the completion", attempts), attempts)
        try:
            parsed = response.json()
            choice = parsed["choices"][0]
            if not isinstance(choice, dict):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            what = f"{self.name} answered with something other than a completion"
            raise PromptError(what, attempts) from None
        model = parsed.get("model")
        usage = parsed.get("usage")
        counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return Answer(parsed.get("id"), model if isinstance(model, str) else None, choice, attempts, seconds,
                      counted if isinstance(counted, int) else None)  # fmt: skip


def _error_text(response: httpx.Response) -> str:
    """A server's own error message, short (vLLM: {"error": {"message": ...}} or {"message": ...})."""
    try:
        parsed: Any = response.json()
    except ValueError:
        return ""
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        message = inner.get("message") if isinstance(inner, dict) else parsed.get("message", inner)
        if isinstance(message, str):
            message = " ".join(message.split())
            return message if len(message) <= ERROR_TEXT else message[: ERROR_TEXT - 1] + "…"
    return ""
