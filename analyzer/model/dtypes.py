"""Element sizes of the dtypes vLLM accepts for caches, and how ``auto`` resolves."""

from __future__ import annotations

from hybridtrace.errors import UsageError

# Canonical name → bytes per element. fp8 caches store one byte per element whatever
# the exponent split.
_ELEMENT_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# Spellings seen in vLLM flags and Hugging Face configs.
_ALIASES: dict[str, str] = {
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bf16": "bfloat16",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "torch.float32": "float32",
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
}

FP8_NAMES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
STATE_DTYPES = ("auto", "bfloat16", "float16", "float32")
KV_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")


def canonical(name: str) -> str:
    """The canonical spelling of a dtype name, or ``auto``."""
    lowered = name.strip().lower()
    if lowered == "auto":
        return "auto"
    lowered = _ALIASES.get(lowered, lowered)
    if lowered not in _ELEMENT_BYTES:
        raise UsageError(f"unknown dtype {name!r} (known: auto, {', '.join(_ELEMENT_BYTES)})")
    return lowered


def element_bytes(name: str) -> int:
    """Bytes per element of a resolved (non-``auto``) dtype."""
    resolved = canonical(name)
    if resolved == "auto":
        raise ValueError("resolve 'auto' before asking for its size")
    return _ELEMENT_BYTES[resolved]


def check_kv_dtype(name: str) -> str:
    return canonical(name)


def check_state_dtype(name: str, option: str) -> str:
    resolved = canonical(name)
    if resolved in FP8_NAMES:
        raise UsageError(f"{option}: fp8 is a KV-cache dtype only; recurrent state uses {STATE_DTYPES}")
    return resolved
