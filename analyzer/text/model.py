"""``hybridtrace model``: the byte model of one model per rank and its transfer worksheet, as text."""

from __future__ import annotations

from hybridtrace.output import to_pairs, to_table
from hybridtrace.units import format_bytes, format_duration, format_rate


def model_text(m: dict) -> str:
    """The figures of ``model --format json`` as label/value lines and the worksheet table."""
    pairs: list[tuple[str, str]] = []
    if m["source"] == "raw":
        pairs.append(("model", "raw figures (no config)"))
    else:
        pairs.append(("model", f"{m['model']} ({m['architecture']})"))
    pairs.append(("tensor parallel", f"TP {m['tp_size']}; every figure is per rank"))
    if m["source"] == "config":
        dt = []
        if m["kv_cache_dtype"]:
            dt.append(f"kv {m['kv_cache_dtype']}")
        if m["mamba_cache_dtype"]:
            dt.append(f"conv {m['mamba_cache_dtype']}, ssm {m['mamba_ssm_cache_dtype']}")
        pairs.append(("dtypes", ", ".join(dt)))
        kind = f" ({m['recurrent_kind']})" if m["recurrent_kind"] else ""
        pairs.append(
            ("layers", f"{m['attention_layers']} attention, {m['recurrent_layers']} recurrent{kind}")
        )
    b = m["attention_bytes_per_token"]
    b_line = f"{b:,} B/token ({format_bytes(b)})"
    if m.get("attention_bytes_per_token_per_layer"):
        b_line += (
            f" = {m['attention_layers']} layers x {m['attention_bytes_per_token_per_layer']:,} B"
            f" ({m['kv_heads_per_rank']} KV heads x head {m['head_size']})"
        )
    pairs.append(("B attention", b_line))
    s = m["state_bytes"]
    s_line = f"{s:,} B ({format_bytes(s)})"
    if m.get("conv_bytes") is not None and m.get("recurrent_layers"):
        s_line += f" = conv {m['conv_bytes']:,} + ssm {m['ssm_bytes']:,}"
        s_line += f"; per layer {m['mamba_page_bytes']:,} B ({format_bytes(m['mamba_page_bytes'])})"
    pairs.append(("S state/snapshot", s_line))
    if m["block_tokens"]:
        blk = f"{m['block_tokens']} tokens"
        if m.get("attention_page_bytes"):
            blk += f"; attention page {m['attention_page_bytes']:,} B per layer"
        pairs.append(("block", blk))
    if m["mamba_padding_pct"] is not None:
        pairs.append(
            (
                "mamba padding",
                f"{m['mamba_padding_pct']:.2f}% (page {m['mamba_page_bytes']:,} B padded to "
                f"{m['mamba_padded_page_bytes']:,} B)",
            )
        )
    groups = m.get("kv_cache_groups")
    if groups:
        pairs.append(
            (
                "kv-cache groups",
                f"{groups['group_size']} layers each: {groups['attention_groups']} attention, "
                f"{groups['recurrent_groups']} recurrent, {groups['padding_layers']} padding layers",
            )
        )
    cross = m["crossover_tokens"]
    pairs.append(
        (
            "crossover",
            f"{cross:,.2f} tokens (S·J/B, J={m['state_blocks']})"
            if cross is not None
            else "none (B or S is 0)",
        )
    )
    pairs.append(
        (
            "link model",
            f"{format_rate(m['bandwidth_bytes_per_s'])} effective + {format_duration(m['fixed_cost_s'])}",
        )
    )
    for note in m["notes"]:
        pairs.append(("note", note))
    rows = [
        {
            "missing": r["missing_tokens"],
            "J": r["state_blocks"],
            "attention B·T": format_bytes(r["attention_payload_bytes"]),
            "state S·J": format_bytes(r["state_payload_bytes"]),
            "logical": format_bytes(r["logical_bytes"]),
            "logical bytes": r["logical_bytes"],
            "expected": format_bytes(r["expected_bytes"]),
            "reserved": format_bytes(r["reserved_bytes"]),
            "link time": format_duration(r["link_seconds"]),
        }
        for r in m["worksheet"]
    ]
    if m["block_tokens"] is None:
        for r in rows:
            del r["expected"], r["reserved"]
    return to_pairs(pairs) + "\n\n" + to_table(rows, right_align=list(rows[0]) if rows else [])
