"""The engine↔model tie: each engine's config.json, and its byte model at its TP (``engine_models``).

A config applies to the engines whose ``model`` names it (whole name or the part after
the last ``/``, ignoring case); when the store holds exactly one config, to every
engine; ``ingest --model`` applies one to every engine explicitly. An engine that no
ingested config serves, but names a model hybridtrace ships (its Hugging Face id, as a
trace's ``engine`` record carries it), is sized with that built-in config. The
engine's settings are its newest record's (``_engine_newest``, ``engine_settings.py``: an
engine id can be reused after a restart with other flags). The result is the
``engine_models`` view: B, S, block size and padding per engine and rank, which the
analyzer measures transfers against.
"""

from __future__ import annotations

import json
from dataclasses import replace

import duckdb
import pyarrow as pa

from hybridtrace.errors import HybridtraceError
from hybridtrace.model import SizingOptions, geometry_from_config, size_model
from hybridtrace.model.catalog import read_builtin
from hybridtrace.schema import table_schema


def _key(name: str | None) -> str | None:
    return name.rsplit("/", 1)[-1].lower() if name else None


def engine_models(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """One row per engine: the config it is sized with, how it was matched, B, S, block and padding."""
    schema = table_schema("engine_models")
    # each engine's newest settings, as engine_settings.py resolves them for every view
    engines = con.execute(
        "SELECT engine_id, model, tp_size, kv_cache_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype, "
        "mamba_cache_mode, block_tokens FROM _engine_newest ORDER BY engine_id"
    ).fetchall()
    models = con.execute(
        "SELECT model, architecture, config, applies_to FROM models ORDER BY ingested_at"
    ).fetchall()
    if not engines:
        return schema.arrow_schema().empty_table()
    explicit = [m for m in models if m[3] == "*"]
    rows = []
    for engine_id, model, tp, kv, conv, ssm, mode, logged_block in engines:
        if explicit:
            chosen, how = explicit[-1], "explicit"
        elif len({m[0] for m in models}) == 1:
            chosen, how = models[-1], "only"
        elif matches := [m for m in models if _key(m[0]) == _key(model)]:
            chosen, how = matches[-1], "name"
        elif model and (builtin := read_builtin(model)) is not None:
            config, entry = builtin
            architecture = (config.get("architectures") or [None])[0]
            chosen, how = (entry.hf_id, architecture, json.dumps(config), None), "builtin"
        else:
            continue
        row = {"engine_id": engine_id, "model": chosen[0], "architecture": chosen[1], "matched_by": how,
               "tp_size": tp, "logged_block_tokens": logged_block}  # fmt: skip
        if tp is None:
            row["error"] = "TP size unknown (no trace engine record or worker names in the log)"
            rows.append(row)
            continue
        try:
            geometry = geometry_from_config(json.loads(chosen[2]), chosen[0])
            options = SizingOptions(
                tp_size=int(tp),
                kv_dtype=kv or "auto",
                mamba_dtype=conv or "auto",
                ssm_dtype=ssm or "auto",
                mamba_cache_mode=mode if mode in ("none", "align", "all") else "none",
            )
            sized = size_model(geometry, options)
            if logged_block and sized.block_tokens and logged_block > sized.block_tokens:
                # The engine reports a larger block than the defaults give (a --block-size or
                # --block-align of its own): sized with that alignment, when it reproduces
                # the block, so whole blocks and padded pages are the engine's.
                aligned = size_model(geometry, replace(options, block_align=int(logged_block)))
                if aligned.block_tokens == logged_block:
                    sized = aligned
        except HybridtraceError as exc:
            row["error"] = str(exc)
            rows.append(row)
            continue
        groups = sized.kv_cache_groups
        row.update(
            kv_cache_dtype=sized.kv_cache_dtype,
            mamba_cache_dtype=sized.mamba_cache_dtype,
            mamba_ssm_cache_dtype=sized.mamba_ssm_cache_dtype,
            attention_layers=sized.attention_layers,
            recurrent_layers=sized.recurrent_layers,
            attention_bytes_per_token=sized.attention_bytes_per_token,
            state_bytes=sized.state_bytes,
            conv_bytes=sized.conv_bytes,
            ssm_bytes=sized.ssm_bytes,
            block_tokens=sized.block_tokens,
            mamba_padding_pct=sized.mamba_padding_pct,
            attention_page_bytes=sized.attention_page_bytes,
            mamba_page_bytes=sized.mamba_page_bytes,
            mamba_padded_page_bytes=sized.mamba_padded_page_bytes,
            group_size=groups.group_size if groups else None,
            padding_layers=groups.padding_layers if groups else None,
        )
        rows.append(row)
    if not rows:
        return schema.arrow_schema().empty_table()
    # typed as it is built: a cast would import pyarrow.compute, a tenth of a second at every open
    return pa.Table.from_pylist(rows, schema=schema.arrow_schema())


def register_engine_models(con: duckdb.DuckDBPyConnection) -> None:
    """Size every engine of ``con`` once and serve the result as the ``engine_models`` view."""
    con.register("_engine_models_table", engine_models(con))
    con.execute("CREATE VIEW engine_models AS SELECT * FROM _engine_models_table")
