"""`hybridtrace model` as a user runs it: the installed console script, from another folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("hybridtrace")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hybridtrace"]
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDTRACE_DEBUG"}
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def test_json_by_name_from_another_directory(tmp_path):
    result = run("model", "nemotron-nano-12b-v2", "--tp", "4", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # CONTRACT §2 keys; this model's SSM state is float32 unless told otherwise
    for key in (
        "tp_size",
        "attention_layers",
        "recurrent_layers",
        "attention_bytes_per_token",
        "conv_bytes",
        "ssm_bytes",
        "state_bytes",
        "crossover_tokens",
        "block_tokens",
        "mamba_padding_pct",
        "worksheet",
    ):
        assert key in data
    assert (data["tp_size"], data["attention_bytes_per_token"], data["ssm_bytes"]) == (4, 6144, 36700160)
    assert [row["missing_tokens"] for row in data["worksheet"]] == [512, 4096, 32768]


def test_python_dash_m_works(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hybridtrace", "model", "jamba-v0.1", "--format", "csv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0].split(",")
    assert header[:3] == ["missing_tokens", "state_blocks", "attention_payload_bytes"]


def test_config_path_and_table(tmp_path):
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({**json.loads(_builtin("jamba-v0.1.json")), "_name_or_path": "my/jamba"}))
    result = run("model", str(config.parent), "--missing-tokens", "1000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "my/jamba (JambaForCausalLM)" in result.stdout
    assert "80 tokens" in result.stdout  # the aligned block


def _builtin(name: str) -> str:
    from importlib import resources

    return resources.files("hybridtrace.model.configs").joinpath(name).read_text()


def test_every_contract_dtype_name_is_taken_for_the_kv_cache(tmp_path):
    """float32 is a KV dtype name too (what auto gives a float32 model): 4 bytes an element."""
    widths = {}
    for name in ("bfloat16", "float16", "float32", "fp8"):
        result = run("model", "nemotron-nano-12b-v2", "--kv-dtype", name, "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        widths[name] = json.loads(result.stdout)["attention_bytes_per_token"]
    assert widths == {"bfloat16": 24576, "float16": 24576, "float32": 49152, "fp8": 12288}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("model", "no-such-model"), "not a built-in model"),
        (("model", "--bandwidth", "fast"), "rate"),
        (("model", "--tp", "0"), "--tp"),
        (("model", "--kv-dtype", "int3"), "unknown dtype"),
        (("model", "--ssm-dtype", "fp8"), "KV-cache dtype only"),
        (("model", "jamba-v0.1", "--attention-bytes-per-token", "4KiB"), "not both"),
    ],
)
def test_bad_usage_exits_2_with_one_line(tmp_path, args, message):
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_architecture_exits_2_naming_it(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["FancyNewForCausalLM"], "num_hidden_layers": 2}))
    result = run("model", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "FancyNewForCausalLM" in result.stderr and "JambaForCausalLM" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreadable_config_exits_2(tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(b"\xff\xfe not json")
    result = run("model", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "not a readable config.json" in result.stderr


def test_debug_shows_traceback(tmp_path):
    result = run("--debug", "model", "no-such-model", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr
