"""The seed article's worked example, pinned: B = 4 KiB/token, S = 2.57 MiB, J = 1.

512 / 4,096 / 32,768 missing tokens give 4.57 / 18.57 / 130.57 MiB; on a 20 GB/s link
with 80 us fixed cost the short and long prefixes take ~0.32 ms and ~6.93 ms; the
crossover S/B is ~658 tokens.
"""

import json

import pytest
from typer.testing import CliRunner

from hybridtrace.cli import app
from hybridtrace.model import crossover_tokens, raw_byte_model, worksheet

MIB = 2**20
B = 4 * 1024
S = 2694840  # 2.57 MiB = 2,694,840.32 B, rounded to whole bytes


def test_logical_payloads_and_link_times():
    model = raw_byte_model(B, S)
    rows = worksheet(
        model, [512, 4096, 32768], state_blocks=1, bandwidth_bytes_per_s=20e9, fixed_cost_s=80e-6
    )
    # B*T + S*J, exactly:
    assert [r.logical_bytes for r in rows] == [512 * B + S, 4096 * B + S, 32768 * B + S]
    assert [round(r.logical_bytes / MIB, 2) for r in rows] == [4.57, 18.57, 130.57]
    # fixed + bytes / bandwidth: 80us + 4,791,992 B / 20e9 B/s = 0.3196 ms
    assert rows[0].link_seconds == pytest.approx(80e-6 + (512 * B + S) / 20e9)
    assert round(rows[0].link_seconds * 1e3, 2) == 0.32
    assert round(rows[2].link_seconds * 1e3, 2) == 6.93
    # raw mode has no block size, so no expected/reserved figures: null, not a guess.
    assert rows[0].expected_bytes is None and rows[0].reserved_bytes is None


def test_crossover():
    model = raw_byte_model(B, S)
    assert crossover_tokens(model) == pytest.approx(S / B)
    assert round(crossover_tokens(model)) == 658
    assert crossover_tokens(model, state_blocks=3) == pytest.approx(3 * S / B)


def test_cli_raw_mode_json():
    result = CliRunner().invoke(
        app,
        [
            "model",
            "--attention-bytes-per-token",
            "4KiB",
            "--state-bytes",
            "2.57MiB",
            "--missing-tokens",
            "512,4096,32768",
            "--bandwidth",
            "20GB/s",
            "--fixed-cost",
            "80us",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["attention_bytes_per_token"] == 4096
    assert data["state_bytes"] == 2694840
    assert data["crossover_tokens"] == 657.92
    assert [row["logical_bytes"] for row in data["worksheet"]] == [4791992, 19472056, 136912568]
    assert [round(row["link_seconds"] * 1e3, 2) for row in data["worksheet"]] == [0.32, 1.05, 6.93]
    # unknown in raw mode: explicit nulls, never zeros
    assert data["attention_layers"] is None and data["block_tokens"] is None
