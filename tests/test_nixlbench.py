"""nixlbench's text table read as link calibration points, both table shapes."""

from __future__ import annotations

from hybridtrace.ingest.nixlbench import looks_like_nixlbench, parse_nixlbench

STARS, DASHES = "*" * 160, "-" * 160


def config(**options: str) -> list[str]:
    lines = [STARS, "NIXLBench Configuration", STARS]
    for key, value in options.items():
        lines.append(f"{f'{key} (--{key.lower()}=[...])':<60}: {value}")
    return [*lines, STARS]


def table(columns: list[tuple[str, int]], rows: list[list[str]]) -> list[str]:
    header = "".join(f"{name:<{width}}" for name, width in columns)
    out = [header, DASHES]
    for row in rows:
        out.append("".join(f"{cell:<{width}}" for cell, (_, width) in zip(row, columns, strict=True)))
    return out


DEFAULT = [("Block Size (B)", 20), ("Batch Size", 15), ("B/W (GB/Sec)", 15), ("Avg Lat. (us)", 15),
           ("Avg Prep (us)", 15), ("P99 Prep (us)", 15), ("Avg Post (us)", 15), ("P99 Post (us)", 15),
           ("Avg Tx (us)", 15), ("P99 Tx (us)", 15)]


def test_the_default_table_and_its_configuration():
    text = "\n".join([
        *config(Backend="UCX", Op_type="READ", Initiator_seg_type="VRAM"),
        *table(DEFAULT, [
            ["4096", "1", "1.234567", "3.3", "1.0", "2.0", "0.8", "1.5", "2.4", "4.0"],
            ["67108864", "1", "24.500000", "2739.2", "1.1", "2.2", "1.2", "2.0", "2738.0", "2900.0"],
            ["8192", "x", "1", "1", "1", "1", "1", "1", "1", "1"],
        ]),
    ])
    assert looks_like_nixlbench(text.encode())
    bench = parse_nixlbench(text)
    assert bench.config == {"backend": "UCX", "op_type": "READ", "initiator_seg_type": "VRAM"}
    first, big = bench.rows
    assert first["block_bytes"] == 4096 and first["batch_size"] == 1 and first["gb_per_s"] == 1.234567
    assert big["avg_post_us"] == 1.2 and big["avg_tx_us"] == 2738.0 and big["p99_tx_us"] == 2900.0
    (reject,) = bench.rejects
    assert reject[0] == first["line_number"] + 2 and "batch_size is not a number" in reject[1]


def test_the_pairwise_table_with_aggregate_columns():
    columns = [*DEFAULT[:3], ("Aggregate B/W (GB/Sec)", 25), ("Network Util (%)", 20), *DEFAULT[3:]]
    text = "\n".join(table(columns, [["1048576", "4", "10.5", "42.0", "21.0", *["1.0"] * 7]]))
    (row,) = parse_nixlbench(text).rows
    assert row["gb_per_s"] == 10.5 and row["aggregate_gb_per_s"] == 42.0 and row["network_util_pct"] == 21.0
    assert row["avg_latency_us"] == 1.0


def test_other_text_is_not_nixlbench():
    assert not looks_like_nixlbench(b"INFO 04-21 10:02:11 [worker.py:367] hello")


def test_nixlbench_output_is_ingested_as_calibration_points(tmp_path):
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    text = "\n".join([
        *config(Backend="UCX", Op_type="READ", Initiator_seg_type="DRAM", Target_seg_type="DRAM"),
        *table(DEFAULT, [
            ["4096", "16", "1.5", "3.3", "1.0", "2.0", "0.8", "1.5", "40.9", "60.0"],
            ["1048576", "16", "11.0", "95.0", "1.1", "2.2", "1.2", "2.0", "1523.0", "1700.0"],
            ["8192", "x", "1", "1", "1", "1", "1", "1", "1", "1"],
        ]),
    ]) + "\n"
    path = tmp_path / "in" / "rdma-node7-node9" / "nixlbench.out"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    for _ in range(2):  # read again: nothing new
        ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    rows = con.sql("SELECT link, backend, op_type, block_bytes, batch_size, request_bytes, xfer_us "
                   "FROM nixlbench_points ORDER BY block_bytes").fetchall()  # fmt: skip
    assert rows == [
        ("rdma-node7-node9", "UCX", "READ", 4096, 16, 65536, 0.8 + 40.9),
        ("rdma-node7-node9", "UCX", "READ", 1048576, 16, 16777216, 1.2 + 1523.0),
    ]
    assert con.sql("SELECT count(*) FROM rejects").fetchall() == [(1,)]
    assert {r[0] for r in con.sql("SELECT format FROM sources").fetchall()} == {"nixlbench"}


def test_a_links_nixlbench_points_give_its_fit(tmp_path):
    from hybridtrace.ingest.run import ingest
    from hybridtrace.store import Store

    # a link of 10 µs fixed cost, 12.5 GB/s and 0.5 µs a descriptor, swept over block and batch size
    rows = []
    for block in (4096, 65536, 1 << 20, 16 << 20):
        for batch in (1, 4, 16, 64):
            xfer_us = 10.0 + block * batch / 12.5e9 * 1e6 + 0.5 * batch
            post_us = 1.0
            gb_s = block * batch / (xfer_us * 1e3)
            times = [f"{post_us:.3f}", "2.0", f"{xfer_us - post_us:.3f}", f"{xfer_us * 1.1:.3f}"]
            head = [str(block), str(batch), f"{gb_s:.6f}", f"{xfer_us / batch:.3f}", "1.0", "2.0"]
            rows.append([*head, *times])
    text = "\n".join([*config(Backend="UCX", Op_type="READ"), *table(DEFAULT, rows)]) + "\n"
    path = tmp_path / "in" / "node7-node9" / "nixlbench.out"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    ingest([tmp_path / "in"], tmp_path / "s")
    con = Store(tmp_path / "s").connect()
    ((link, points, fixed, bandwidth, per_descriptor),) = con.sql(
        "SELECT link, reads, fixed_s, bandwidth_bytes_per_s, per_descriptor_s FROM link_fits "
        "WHERE scope = 'nixlbench'"
    ).fetchall()
    assert (link, points) == ("node7-node9", 16)
    assert abs(fixed / 10e-6 - 1) < 0.01 and abs(bandwidth / 12.5e9 - 1) < 0.01
    assert abs(per_descriptor / 0.5e-6 - 1) < 0.01
