"""An engine's newest settings: one row per engine id from its ``engines`` records.

An engine id can be reused after a restart with other flags, so a setting is the newest
record's that says it (records without a time count as oldest). The TP size is the newest
trace record's, else the most workers a log showed (a lower bound); the attention block is
the newest logged or recorded one, else the largest block of its trace records' attention
groups. ``engine_models`` sizes engines from this view; the finding and report views that
compare or show settings can read it instead of aggregating ``engines`` again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

# Settings taken as the newest record gives them.
NEWEST_SETTINGS = (
    "role", "model", "kv_cache_dtype", "kv_buffer_device", "kv_layout", "mamba_cache_dtype",
    "mamba_ssm_cache_dtype", "mamba_cache_mode", "conv_layout", "vllm_version", "mamba_padding_pct",
    "use_host_buffer",
)  # fmt: skip


def _newest(column: str) -> str:
    return (
        f"coalesce(arg_max({column}, ts) FILTER (WHERE {column} IS NOT NULL), "
        f"any_value({column}) FILTER (WHERE {column} IS NOT NULL)) AS {column}"
    )


# Columns: engine_id; each of NEWEST_SETTINGS; tp_size; block_tokens (the attention block
# the engine reports); hybrid_allocator (true when any record says it ran with vLLM's
# hybrid allocator).
ENGINE_NEWEST_SQL = f"""
CREATE OR REPLACE VIEW _engine_newest AS
SELECT engine_id,
       {", ".join(_newest(c) for c in NEWEST_SETTINGS)},
       coalesce(arg_max(tp_size, ts) FILTER (WHERE source_kind = 'trace' AND tp_size IS NOT NULL),
                max(tp_size)) AS tp_size,
       coalesce(arg_max(block_tokens, ts) FILTER (WHERE block_tokens IS NOT NULL),
                any_value(block_tokens) FILTER (WHERE block_tokens IS NOT NULL),
                max(list_max([g.block_tokens
                    FOR g IN json_transform(groups, '[{{"kind": "VARCHAR", "block_tokens": "BIGINT"}}]')
                    IF g.kind <> 'mamba']))) AS block_tokens,
       bool_or(hybrid_allocator) AS hybrid_allocator
FROM engines
GROUP BY engine_id
"""


def install_engine_newest(con: duckdb.DuckDBPyConnection) -> None:
    """Create ``_engine_newest`` over the ``engines`` view of ``con``."""
    con.execute(ENGINE_NEWEST_SQL)
