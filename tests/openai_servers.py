"""OpenAI-compatible completion servers on loopback, speaking /v1/completions as vLLM does.

A tiny deterministic "model" stands behind each: the next token and its logprobs follow
from the context (prompt and output so far), so two servers give the same greedy output
unless told otherwise. One plays the colocated control; the other the P/D deployment,
which can be told, per prompt, to part from the control after a chosen output token (a
token the control gives little weight), to meet a near tie there (the control's top two
within a few thousandths of a nat, and the P/D takes the second), to answer 500 a number
of times before it answers, or to hang.

Answers have vLLM's shape: ``id`` ``cmpl-<uuid hex>``, ``object`` ``text_completion``,
``usage``, and per choice ``logprobs`` = ``{text_offset, token_logprobs, tokens,
top_logprobs}`` (``token_id:N`` tokens when ``return_tokens_as_token_ids`` is asked, the
top-logprob dict holding the chosen token and the top ``logprobs``); ``prompt`` may be
text or a list of token ids; ``echo`` puts the prompt's tokens first.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
TIE_GAP = 0.004  # nats between the top two at a near tie


@dataclass
class Behaviour:
    diverge_at: int | None = None  # P/D: its own token from this output token on
    tie_at: int | None = None  # both: a near tie at this output token; the P/D takes the runner-up
    fail_times: int = 0  # answer HTTP 500 this many times before answering
    hang: bool = False  # never answer (within any sensible client timeout)


@dataclass
class Served:
    """What a server answered: the id it returned, the prompt (key) and its length."""

    response_id: str
    key: str
    prompt_tokens: int


def tokenize(text: str, vocab: int) -> list[int]:
    return [zlib.crc32(word.encode()) % vocab for word in text.split()]


class FakeVllm:
    def __init__(
        self,
        role: str,
        *,
        model: str = "acme/hybrid-tiny",
        behaviours: dict[str, Behaviour] | None = None,
        vocab: int = 50_000,
        max_model_len: int = 8192,
        ignore_logprobs: bool = False,
        id_prefix: str = "cmpl-",
        lists_models: bool = True,
    ) -> None:
        assert role in ("control", "pd")
        self.role, self.model, self.vocab = role, model, vocab
        self.behaviours = behaviours or {}
        self.max_model_len = max_model_len
        self.ignore_logprobs = ignore_logprobs
        self.id_prefix = id_prefix
        self.lists_models = lists_models  # vLLM's P/D proxies route completions only
        self.answers: list[Served] = []
        self.bodies: list[dict] = []
        self.authorization: list[str | None] = []
        self.failed: dict[str, int] = {}
        self._release = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeVllm:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    # --- the model ------------------------------------------------------------------------

    def _candidates(self, context: list[int], k: int) -> list[tuple[int, float]]:
        """The top ``k`` (token, logprob) after ``context``, best first."""
        seed = zlib.crc32(json.dumps([len(context), *context[-6:]]).encode())
        out, logprob = [], -0.05 - (seed % 1000) / 10_000
        for j in range(k):
            out.append(((seed + 7919 * (j + 1)) % self.vocab, logprob))
            logprob -= 1.5 + (seed >> (j % 16) & 7) / 10
        return out

    def _generate(self, prompt: list[int], n: int, k: int, behaviour: Behaviour) -> list[dict]:
        steps, context = [], list(prompt)
        for i in range(n):
            top = self._candidates(context, max(k, 2))
            chosen = top[0]
            if behaviour.tie_at == i:
                # the same near tie on both servers; the P/D's kernels tip it the other way
                top[1] = (top[1][0], top[0][1] - TIE_GAP)
                chosen = top[1] if self.role == "pd" else top[0]
            if self.role == "pd" and behaviour.diverge_at is not None and i >= behaviour.diverge_at:
                # resumed from the wrong state: its own distribution, far from the control's
                own = (zlib.crc32(json.dumps(context[-4:]).encode()) + 12345) % self.vocab
                top = [(own, -0.02), *[(t, lp - 1.0) for t, lp in top[1:]]]
                chosen = top[0]
            if self.role == "pd":
                top = [(t, lp + 1e-4) for t, lp in top]  # other batch shapes: logprobs drift a little
                chosen = (chosen[0], chosen[1] + 1e-4)
            steps.append({"token": chosen[0], "logprob": chosen[1], "top": top[:k]})
            context.append(chosen[0])
        return steps

    # --- HTTP -----------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, kind: str) -> None:
                error = {"message": message, "type": kind, "param": None, "code": status}
                self._send(status, {"error": error})

            def do_GET(self) -> None:
                if self.path != "/v1/models" or not fake.lists_models:
                    self._error(404, "Not Found", "NotFoundError")
                    return
                card = {"id": fake.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                        "root": f"/models/{fake.model}", "parent": None, "max_model_len": fake.max_model_len,
                        "permission": []}  # fmt: skip
                self._send(200, {"object": "list", "data": [card]})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/completions":
                    self._error(404, "Not Found", "NotFoundError")
                    return
                with fake._lock:
                    fake.bodies.append(body)
                    fake.authorization.append(self.headers.get("Authorization"))
                fake._complete(self, body)

        return Handler

    def _complete(self, handler, body: dict) -> None:
        if body.get("model") != self.model:
            handler._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
            return
        k = body.get("logprobs")
        if k is not None and k > MAX_LOGPROBS:
            handler._error(400, f"Requested sample logprobs of {k}, which is greater than max of "
                                f"{MAX_LOGPROBS}", "BadRequestError")  # fmt: skip
            return
        prompt = body.get("prompt")
        key = prompt if isinstance(prompt, str) else f"ids:{len(prompt)}"
        ids = tokenize(prompt, self.vocab) if isinstance(prompt, str) else list(prompt)
        behaviour = self.behaviours.get(key, Behaviour())
        with self._lock:
            failed = self.failed.get(key, 0)
            if failed < behaviour.fail_times:
                self.failed[key] = failed + 1
        if failed < behaviour.fail_times:
            handler._error(500, "EngineCore encountered an issue", "InternalServerError")
            return
        if behaviour.hang:
            self._release.wait(60)
            return
        if len(ids) + body.get("max_tokens", 16) > self.max_model_len:
            handler._error(400, f"This model's maximum context length is {self.max_model_len} tokens.",
                           "BadRequestError")  # fmt: skip
            return
        n = body.get("max_tokens", 16)
        steps = self._generate(ids, n, k or 1, behaviour)
        as_ids = bool(body.get("return_tokens_as_token_ids"))

        def name(token: int) -> str:
            return f"token_id:{token}" if as_ids else f" w{token}"

        tokens = [name(s["token"]) for s in steps]
        chosen = [s["logprob"] for s in steps]
        tops: list[dict | None] = [
            {name(s["token"]): s["logprob"], **{name(t): lp for t, lp in s["top"]}} for s in steps
        ]
        if body.get("echo"):
            tokens = [name(t) for t in ids] + tokens
            chosen = [None] * len(ids) + chosen
            tops = [None] * len(ids) + tops
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        logprobs = None if self.ignore_logprobs or k is None else {
            "text_offset": offsets, "token_logprobs": chosen, "tokens": tokens, "top_logprobs": tops,
        }  # fmt: skip
        response_id = f"{self.id_prefix}{uuid.uuid4().hex}"
        with self._lock:
            self.answers.append(Served(response_id, key, len(ids)))
        handler._send(200, {
            "id": response_id, "object": "text_completion", "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "text": "".join(f" w{s['token']}" for s in steps), "logprobs": logprobs,
                         "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None}],
            "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + n, "completion_tokens": n,
                      "prompt_tokens_details": None},
            "system_fingerprint": None, "kv_transfer_params": None,
        })  # fmt: skip

