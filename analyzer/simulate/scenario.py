"""What a simulated deployment looks like: model, engines, link, workload, injections."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridtrace.errors import UsageError
from hybridtrace.kinds import KINDS

# Every finding kind of the contract can be injected; RATE is the share of requests (or,
# for engine- and rank-scoped kinds, whether it happens at all).
INJECTABLE = KINDS
DEFAULT_RATES = {
    "padding_leak": 0.1,
    "staging_copy": 0.05,
    "useless_boundary": 0.05,
    "slow_rank": 1.0,
    "descriptor_bound": 0.05,
    "kv_expired": 0.02,
    "transfer_failed": 0.02,
    "unsharded_state": 0.05,
    "config_mismatch": 1.0,
    "recompute_cheaper": 0.05,
}


@dataclass(frozen=True)
class EngineSpec:
    engine_id: str
    role: str  # prefill | decode
    tp_size: int
    kv_dtype: str = "auto"


@dataclass(frozen=True)
class SimOptions:
    model: str = "nemotron-nano-12b-v2"
    prefill_engines: int = 1
    decode_engines: int = 1
    prefill_tp: tuple[int, ...] = (2,)  # one per prefill engine, cycled
    decode_tp: tuple[int, ...] = (2,)
    kv_dtype: str = "auto"
    ssm_dtype: str = "auto"
    bandwidth_gb_s: float = 20.0  # effective per-read bandwidth, decimal GB/s
    bandwidth_jitter: float = 0.08  # lognormal sigma of per-read bandwidth
    fixed_cost_s: float = 80e-6  # median fixed cost per read
    fixed_cost_jitter: float = 0.25  # lognormal sigma of the per-read fixed cost
    post_s_per_descriptor: float = 0.1e-6
    poll_interval_s: float = 0.005  # engine step: completion is seen only when polled
    duration_s: float = 120.0
    request_rate: float = 5.0  # requests per second
    requests: int | None = None  # exactly this many requests over the duration (the rate follows)
    median_prompt_tokens: int = 2000
    prompt_sigma: float = 1.0  # lognormal: a long tail of long prompts
    max_prompt_tokens: int = 32768
    cache_hit_rate: float = 0.2  # share of requests the decoder already holds a prefix of
    prefill_tokens_per_s: float = 20000.0  # destination prefill rate, for prefill_s
    stats_interval_s: float = 10.0
    scrape_interval_s: float = 15.0
    era: str = "lease"  # abort | lease (vLLM's expiry wording)
    colour: bool = False
    seed: int = 0
    inject: dict[str, float] = field(default_factory=dict)
    start_ts: float = 1_776_765_600.0  # 2026-04-21 10:00:00 UTC

    def check(self) -> None:
        """Refuse options no deployment has, naming the ``simulate`` option to change."""
        if self.era not in ("abort", "lease"):
            raise UsageError("--era must be abort or lease")
        if self.requests is not None and self.requests < 1:
            raise UsageError("--requests must be at least 1")
        if not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise UsageError("--rate must be a positive number of requests per second")
        if self.median_prompt_tokens < 1:
            raise UsageError("--median-prompt must be at least 1 token")
        if not 0 <= self.cache_hit_rate <= 1:
            raise UsageError("--cache-hit-rate must be between 0 and 1")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed {self.seed}: give a whole number from 0 to {2**32 - 1}")
        if self.duration_s <= 0:
            raise UsageError("--duration must be positive")
        if self.prefill_engines < 1 or self.decode_engines < 1:
            raise UsageError("--prefill and --decode need at least one engine each")

    def engines(self) -> list[EngineSpec]:
        out = []
        for i in range(self.prefill_engines):
            out.append(
                EngineSpec(
                    f"prefill-{i}", "prefill", self.prefill_tp[i % len(self.prefill_tp)], self.kv_dtype
                )
            )
        for i in range(self.decode_engines):
            out.append(
                EngineSpec(f"decode-{i}", "decode", self.decode_tp[i % len(self.decode_tp)], self.kv_dtype)
            )
        return out


def parse_inject(text: str | None) -> dict[str, float]:
    """``padding_leak=0.2,slow_rank`` → rates; ``all`` injects every kind at its default."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, rate = part.partition("=")
        names = INJECTABLE if name == "all" else (name,)
        for kind in names:
            if kind not in INJECTABLE:
                raise UsageError(f"--inject: unknown kind {kind!r} (known: all, {', '.join(INJECTABLE)})")
            try:
                value = float(rate) if rate else DEFAULT_RATES[kind]
            except ValueError as exc:
                raise UsageError(f"--inject: {part!r} needs a number after '='") from exc
            if not 0 <= value <= 1:
                raise UsageError(f"--inject: the rate of {kind} must be between 0 and 1")
            out[kind] = value
    return out
