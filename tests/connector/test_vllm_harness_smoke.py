"""The in-process harness drives vLLM's stock NixlConnector over real NIXL correctly.

Attention-only and hybrid (Mamba + attention) requests cross from a prefill engine to a
decode engine byte for byte, NIXL's telemetry agrees with the bytes the tensors' specs
say must move, a read NIXL rejects is reported failed by the decode, and a lease that
runs out is released by the prefill. The numbers written out below are worked from
the tiny models' shapes, independently of the harness and of vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import vllm_harness as harness

pytestmark = [pytest.mark.vllm, pytest.mark.connector]

# Llama-like: 2 layers, 2 KV heads of 16 dims, bf16, 32-token blocks:
# K and V x 2 heads x 32 tokens x 16 dims x 2 bytes.
ATTENTION_PAGE = 2 * 2 * 32 * 16 * 2
# NemotronH "M*M*": the attention block grows to 64 tokens so one page holds a Mamba
# state; the state is conv (3 x (64 + 2*16) bf16) + SSM (4 heads x 16 x 16 fp32).
HYBRID_ATTENTION_PAGE = 2 * 2 * 64 * 16 * 2
MAMBA_STATE = 3 * (64 + 2 * 16) * 2 + 4 * 16 * 16 * 4


@pytest.fixture(scope="module")
def attention_pair() -> Iterator[harness.Pair]:
    pair = harness.make_pair("attention")
    yield pair
    pair.close()


@pytest.fixture(scope="module")
def hybrid_pair() -> Iterator[harness.Pair]:
    pair = harness.make_pair("hybrid")
    yield pair
    pair.close()


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> harness.Pair:
    return request.getfixturevalue(f"{request.param}_pair")


def test_attention_request_crosses_byte_for_byte(attention_pair: harness.Pair) -> None:
    pair = attention_pair
    assert pair.block_size == 32 and pair.group_kinds == ["attention"]
    assert pair.prefill_kv_cache_config.kv_cache_layout == "LBHNC"

    result = pair.transfer("attn-0", num_tokens=100)

    assert result.ok, result
    assert result.received and result.sent and not result.failed
    # 100 tokens fill 4 blocks; the two pools hand out different ids, so a read that
    # mixed local and remote ids would not pass the byte check.
    assert [len(group) for group in result.decode_blocks] == [4]
    assert result.prefill_blocks != result.decode_blocks
    assert pair.decode_mismatches(result) == []
    expected = harness.expected_read_bytes(pair, result.decode_blocks)
    assert expected == 4 * 2 * ATTENTION_PAGE
    assert result.nixl_bytes == expected


def test_hybrid_request_crosses_byte_for_byte(hybrid_pair: harness.Pair) -> None:
    pair = hybrid_pair
    # The Mamba group comes first; block ids always follow this order.
    assert pair.group_kinds == ["mamba", "attention"]
    assert pair.block_size == 64
    assert pair.prefill_config.cache_config.mamba_page_size_padded == HYBRID_ATTENTION_PAGE
    assert not pair.prefill_config.scheduler_config.disable_hybrid_kv_cache_manager

    result = pair.transfer("hyb-0", num_tokens=100)

    assert result.ok, result
    # The prefill computes 99 tokens (the decode recomputes the last one to rebuild
    # the Mamba state): 2 attention blocks and 1 state block.
    assert result.kv_transfer_params["remote_num_tokens"] == 99
    assert [len(group) for group in result.decode_blocks] == [1, 2]
    # Byte for byte, and the Mamba pages' padding still holds the decode's own bytes.
    assert pair.decode_mismatches(result) == []
    expected = harness.expected_read_bytes(pair, result.decode_blocks)
    assert expected == 1 * 2 * MAMBA_STATE + 2 * 2 * HYBRID_ATTENTION_PAGE
    assert result.nixl_bytes == expected


def test_byte_check_catches_a_swapped_group_order(hybrid_pair: harness.Pair) -> None:
    pair = hybrid_pair
    result = pair.transfer("hyb-order", num_tokens=160)
    assert pair.decode_matches(result)

    # The same blocks read back under the other group's ids are not what was written.
    mamba, attention = result.decode_blocks
    swapped = (attention[-1:], [mamba[0], *attention[:-1]])
    assert pair.decode_mismatches(result.prefill_blocks, swapped)
    # One flipped byte in a decode page is seen too.
    layer = pair.decode_kv_cache_config.kv_cache_groups[1].layer_names[0]
    page = pair.decode_kv_caches[layer][attention[0]].view(torch.uint8).view(-1)
    page[0] = 255 - int(page[0])
    problems = pair.decode_mismatches(result)
    assert len(problems) == 1 and layer in problems[0]


@pytest.mark.parametrize("pair", ["attention", "hybrid"], indirect=True)
def test_rejected_read_is_reported_failed(pair: harness.Pair) -> None:
    result = pair.transfer_failing(f"{pair.kind}-fail", num_tokens=70)

    assert result.failed == {result.decode_request_id}
    assert not result.received and not result.sent
    assert result.nixl_bytes == 0
    if pair.kind == "attention":
        # Without the hybrid manager the decode also names the blocks to recompute.
        assert result.invalid_block_ids == set(result.decode_blocks[0])

    # The failure leaves the pair usable.
    after = pair.transfer(f"{pair.kind}-after-fail", num_tokens=40)
    assert after.ok and pair.decode_matches(after)


@pytest.mark.parametrize("pair", ["attention", "hybrid"], indirect=True)
def test_expired_lease_is_released(pair: harness.Pair) -> None:
    free_before = pair.prefill_engine.pool.num_free

    lease = pair.expire_lease(f"{pair.kind}-lease", num_tokens=64, lease_s=0.3)

    assert lease.released
    assert lease.seconds >= 0.25
    assert any(
        message.startswith(f"Releasing expired KV blocks for request {lease.request_id} ")
        for message in lease.log_messages
    ), lease.log_messages
    assert pair.prefill_engine.pool.num_free == free_before
