"""The seed article's worksheet: payload and link time for a list of missing prefixes.

For T missing tokens and J state snapshots, per rank:
  logical   = B·T + S·J                       (what had to move)
  expected  = ceil(T / block)·block·B + S·J   (attention blocks move whole)
  reserved  = allocator pages behind those blocks, Mamba pages padded
  link time = fixed cost + logical / effective bandwidth
Expected and reserved need the allocator's block size, so raw mode (no config) leaves
them null rather than pretend.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridtrace.model.sizing import ByteModel


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class WorksheetRow:
    missing_tokens: int
    state_blocks: int
    attention_payload_bytes: int
    state_payload_bytes: int
    logical_bytes: int
    expected_bytes: int | None
    reserved_bytes: int | None
    attention_blocks: int | None
    link_seconds: float

    def as_dict(self) -> dict[str, int | float | None]:
        return dict(self.__dict__)


def worksheet_row(
    model: ByteModel,
    missing_tokens: int,
    state_blocks: int,
    bandwidth_bytes_per_s: float,
    fixed_cost_s: float,
) -> WorksheetRow:
    if missing_tokens < 0 or state_blocks < 0:
        raise ValueError("token and block counts cannot be negative")
    attention = model.attention_bytes_per_token * missing_tokens
    state = model.state_bytes * state_blocks
    logical = attention + state
    expected = reserved = blocks = None
    if model.block_tokens:
        blocks = _ceil_div(missing_tokens, model.block_tokens)
        whole_blocks = blocks * model.block_tokens * model.attention_bytes_per_token
        expected = whole_blocks + state
        reserved = whole_blocks + state_blocks * model.reserved_state_bytes
    return WorksheetRow(
        missing_tokens=missing_tokens,
        state_blocks=state_blocks,
        attention_payload_bytes=attention,
        state_payload_bytes=state,
        logical_bytes=logical,
        expected_bytes=expected,
        reserved_bytes=reserved,
        attention_blocks=blocks,
        link_seconds=fixed_cost_s + logical / bandwidth_bytes_per_s,
    )


def worksheet(
    model: ByteModel,
    missing_tokens: list[int],
    state_blocks: int = 1,
    bandwidth_bytes_per_s: float = 20e9,
    fixed_cost_s: float = 80e-6,
) -> list[WorksheetRow]:
    return [
        worksheet_row(model, t, state_blocks, bandwidth_bytes_per_s, fixed_cost_s) for t in missing_tokens
    ]


def crossover_tokens(model: ByteModel, state_blocks: int = 1) -> float | None:
    """Missing-prefix length at which attention bytes equal state bytes: S·J / B."""
    if not model.attention_bytes_per_token or not model.state_bytes:
        return None
    return model.state_bytes * state_blocks / model.attention_bytes_per_token
