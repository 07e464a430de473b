"""Configs attach to the engines that serve them; each engine is sized at its own TP."""

from __future__ import annotations

from pathlib import Path

from tracegen import engine_record, write_jsonl

from hybridtrace.ingest.run import ingest
from hybridtrace.store import Store

CONFIGS = Path(__file__).parent.parent / "analyzer" / "model" / "configs"


def nemotron_config(folder: Path) -> None:
    """The model's config.json in a folder named after it, as a bucket of logs holds it."""
    (folder / "NVIDIA-Nemotron-Nano-12B-v2").mkdir()
    (folder / "NVIDIA-Nemotron-Nano-12B-v2" / "config.json").write_text(
        (CONFIGS / "nemotron-nano-12b-v2.json").read_text()
    )


def sized(tmp_path: Path, record: dict, columns: str) -> list[tuple]:
    """``columns`` of engine_models for one engine record and the Nemotron config."""
    write_jsonl(tmp_path / "in" / "d" / "trace.jsonl", [record])
    nemotron_config(tmp_path / "in")
    ingest([tmp_path / "in"], tmp_path / "s")
    return Store(tmp_path / "s").connect().sql(f"SELECT {columns} FROM engine_models").fetchall()


def models(store: Path) -> list[tuple]:
    return (
        Store(store)
        .connect()
        .sql(
            "SELECT engine_id, model, matched_by, tp_size, attention_bytes_per_token, state_bytes, "
            "block_tokens, error FROM engine_models ORDER BY engine_id"
        )
        .fetchall()
    )


def test_single_config_applies_to_every_engine(tmp_path):
    write_jsonl(tmp_path / "in" / "d" / "trace.jsonl", [engine_record("decode-0", "decode", 2)])
    write_jsonl(tmp_path / "in" / "p" / "trace.jsonl", [engine_record("prefill-0", "prefill", 4)])
    nemotron_config(tmp_path / "in")
    ingest([tmp_path / "in"], tmp_path / "s")
    got = models(tmp_path / "s")
    # TP 2, bf16 KV: 4 KV heads x 256 x 2 B = 2048 per layer, x 6 layers = 12288;
    # SSM float32 by vLLM's default: 28 x (3*6144*2 + 64*80*128*4) = 28 x 2658304
    assert got[0] == ("decode-0", "NVIDIA-Nemotron-Nano-12B-v2", "only", 2, 12288, 28 * 2658304, 1312, None)
    assert got[1][:5] == ("prefill-0", "NVIDIA-Nemotron-Nano-12B-v2", "only", 4, 6144)


def test_names_pick_among_several_configs_and_explicit_model_wins(tmp_path):
    write_jsonl(tmp_path / "in" / "d" / "trace.jsonl", [engine_record("decode-0", "decode", 1)])
    for name, file in (
        ("NVIDIA-Nemotron-Nano-12B-v2", "nemotron-nano-12b-v2.json"),
        ("Jamba", "jamba-v0.1.json"),
    ):
        (tmp_path / "in" / name).mkdir()
        (tmp_path / "in" / name / "config.json").write_text((CONFIGS / file).read_text())
    ingest([tmp_path / "in"], tmp_path / "s")
    assert models(tmp_path / "s")[0][1:3] == ("NVIDIA-Nemotron-Nano-12B-v2", "name")
    ingest([tmp_path / "in"], tmp_path / "s", model="jamba-v0.1")
    got = models(tmp_path / "s")[0]
    assert got[1:3] == ("ai21labs/Jamba-v0.1", "explicit")
    assert got[4] == 4 * 4096  # Jamba at TP 1, bf16


def test_unknown_tp_is_said_not_guessed(tmp_path):
    from loggen import ENGINE_ID, vllm_line

    # a log without process names (VLLM_CONFIGURE_LOGGING=0): its TP size is unknown, so it
    # is not sized (an engine core naming the NIXL worker would say TP 1)
    log = vllm_line(f"Initializing NIXL worker {ENGINE_ID}", process=None) + "\n"
    log += vllm_line("Setting attention block size to 1312 tokens to ensure that attention page size is >= "
                     "mamba page size.", process=None) + "\n"  # fmt: skip
    (tmp_path / "in" / "x").mkdir(parents=True)
    (tmp_path / "in" / "x" / "vllm.log").write_text(log)
    ingest([tmp_path / "in"], tmp_path / "s", model="nemotron-nano-12b-v2")
    got = models(tmp_path / "s")
    assert got == [(ENGINE_ID, "nvidia/NVIDIA-Nemotron-Nano-12B-v2", "explicit", None, None, None, None,
                    "TP size unknown (no trace engine record or worker names in the log)")]  # fmt: skip


def test_an_engine_setting_only_the_mamba_dtype_keeps_the_families_ssm_dtype(tmp_path):
    # vLLM's --mamba-cache-dtype alone leaves Nemotron-H's SSM state in float32
    record = {**engine_record("decode-0", "decode", 2), "mamba_cache_dtype": "bfloat16"}
    record.pop("mamba_ssm_cache_dtype", None)
    got = sized(tmp_path, record, "mamba_ssm_cache_dtype, state_bytes, block_tokens")
    assert got == [("float32", 28 * 2658304, 1312)]


def test_an_engine_reporting_a_larger_block_is_sized_with_it(tmp_path):
    # the engine ran with --block-align 64: its attention block is 1344 tokens, not 1312
    record = engine_record("decode-0", "decode", 2)
    record["groups"][0]["block_tokens"] = 1344
    got = sized(tmp_path, record, "block_tokens, logged_block_tokens, mamba_padded_page_bytes")
    # the Mamba page is padded to the block's attention page: 1344 tokens × 2,048 B per layer
    assert got == [(1344, 1344, 1344 * 2048)]


def test_an_engine_naming_a_shipped_model_is_sized_without_a_config(tmp_path):
    # The trace's engine record names nvidia/NVIDIA-Nemotron-Nano-12B-v2 and no config.json
    # was ingested: the packaged copy sizes it (the same numbers as the file would give).
    # An engine naming a model hybridtrace does not ship stays unsized, as before.
    unknown = engine_record("decode-x", "decode", 2) | {"model": "acme/unknown-model"}
    write_jsonl(tmp_path / "in" / "d" / "trace.jsonl", [engine_record("decode-0", "decode", 2), unknown])
    ingest([tmp_path / "in"], tmp_path / "s")
    assert models(tmp_path / "s") == [
        ("decode-0", "nvidia/NVIDIA-Nemotron-Nano-12B-v2", "builtin", 2, 12288, 28 * 2658304, 1312, None)
    ]


def test_the_newest_engine_record_sets_the_engine(tmp_path):
    # decode-0 restarted under the same id: TP 4 with an fp8 cache, then TP 2 with bf16.
    old = engine_record("decode-0", "decode", 4, ts=1764400000.0) | {"kv_cache_dtype": "fp8"}
    new = engine_record("decode-0", "decode", 2, ts=1764403600.0)
    write_jsonl(tmp_path / "in" / "d" / "trace.jsonl", [new, old])
    nemotron_config(tmp_path / "in")
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    got = con.sql("SELECT tp_size, kv_cache_dtype, attention_bytes_per_token FROM engine_models").fetchall()
    assert got == [(2, "bfloat16", 12288)]
    # the settings the pair check compares, and the report's table, say the same
    assert con.sql("SELECT tp_size, kv_cache_dtype FROM _engine_settings").fetchall() == [(2, "bfloat16")]
    assert con.sql("SELECT tp_size, kv_cache_dtype FROM report_engines").fetchall() == [(2, "bfloat16")]


def test_choosing_a_model_again_makes_it_current(tmp_path):
    from tracegen import transfer_records

    write_jsonl(
        tmp_path / "in" / "trace.jsonl", [engine_record("decode-0", "decode", 2), *transfer_records(1)]
    )
    for model in ("nemotron-nano-12b-v2", "zamba2-7b", "nemotron-nano-12b-v2"):
        ingest([tmp_path / "in"], tmp_path / "s", model=model)
    con = Store(tmp_path / "s").connect()
    latest = "SELECT model FROM models WHERE applies_to = '*' ORDER BY ingested_at DESC LIMIT 1"
    assert con.sql(latest).fetchall() == [("nvidia/NVIDIA-Nemotron-Nano-12B-v2",)]
    assert con.sql("SELECT model FROM engine_models").fetchall() == [("nvidia/NVIDIA-Nemotron-Nano-12B-v2",)]
