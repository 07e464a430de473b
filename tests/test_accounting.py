"""Byte accounting per read and request: fixture (simulated bundle) + query + expected rows."""

from __future__ import annotations

import pytest

from hybridtrace.ingest.run import ingest
from hybridtrace.simulate import SimOptions, simulate
from hybridtrace.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("accounting")
    # two decode engines: one at prefill's TP, one reading each rank's shard from two prefill ranks
    options = SimOptions(seed=11, prefill_tp=(4,), decode_tp=(4, 2), decode_engines=2, duration_s=30,
                         inject={"padding_leak": 0.3, "unsharded_state": 0.1})  # fmt: skip
    simulate(options, root / "bundle")
    ingest([root / "bundle"], root / "store")
    return Store(root / "store").connect()


def test_every_read_is_accounted(store):
    reads = store.sql("SELECT count(*) FROM transfers").fetchall()[0][0]
    assert store.sql("SELECT count(*) FROM transfer_bytes").fetchall()[0][0] == reads


def test_clean_reads_move_exactly_the_expected_bytes(store):
    # Requests with no injection: transported == expected to the byte, at both TP shapes.
    rows = store.sql(
        """
        SELECT share, count(*), sum(abs(excess_bytes)), min(block_rounding_bytes) >= 0,
               bool_and(attention_transported_bytes = expected_attention_bytes)
        FROM transfer_bytes
        WHERE request_id NOT IN (SELECT request_id FROM transfer_bytes WHERE excess_bytes <> 0)
        GROUP BY share ORDER BY share
        """
    ).fetchall()
    assert [r[0] for r in rows] == [1, 2]
    assert all(r[1] > 0 and r[2] == 0 and r[3] and r[4] for r in rows)


def test_padding_leaks_show_as_the_padding_gap(store):
    # A leaked read carries its state as padded pages: the excess is exactly reserved − expected.
    rows = store.sql(
        """
        SELECT count(*), bool_and(excess_bytes = padding_gap_bytes),
               bool_and(transported_bytes = reserved_bytes)
        FROM transfer_bytes
        WHERE excess_bytes > 0 AND state_transported_bytes = reserved_state_bytes
        """
    ).fetchall()[0]
    assert rows[0] > 0 and rows[1] and rows[2]


def test_unsharded_state_is_one_rank_pulling_every_shard(store):
    # The rank moved S·TP (every rank's shard) over its reads instead of S.
    rows = store.sql(
        """
        SELECT b.share, b.state_transported_bytes, m.state_bytes * m.tp_size // b.share AS whole_state
        FROM transfer_bytes b JOIN engine_models m USING (engine_id)
        WHERE b.excess_bytes > 0 AND b.state_transported_bytes <> b.reserved_state_bytes
        """
    ).fetchall()
    assert rows and {r[0] for r in rows} <= {1, 2}
    assert all(moved == whole for _, moved, whole in rows)


def test_request_sums_are_ratios_of_sums(store):
    row = store.sql(
        """
        SELECT count(*),
               bool_and(abs(transported_over_expected - transported_bytes / expected_bytes) < 1e-12),
               bool_and(reads = ranks * (SELECT max(share) FROM transfer_bytes b
                                         WHERE b.request_id = request_bytes.request_id))
        FROM request_bytes
        """
    ).fetchall()[0]
    assert row[0] > 0 and row[1] and row[2]


def test_group_bytes_of_a_store_written_before_ingest_summed_them(store):
    # Older stores hold only the groups text: the accounting sums it the same way.
    groups = (
        '[{"group": 1, "kind": "mamba", "bytes": 7000}, {"group": 0, "kind": "attention", "bytes": 500},'
        ' {"group": 2, "kind": "sliding_window", "bytes": 30}]'
    )
    got = store.execute("SELECT _group_bytes(?, false), _group_bytes(?, true), _group_bytes('[]', true)",
                        [groups, groups]).fetchall()  # fmt: skip
    assert got == [(530, 7000, None)]


def test_a_read_with_no_valid_tp_size_has_no_share(store):
    # ingest rejects a TP size below 1; a store written before it did must not divide by it
    shares = store.sql("SELECT _share(2, 4), _share(4, 2), _share(0, 4), _share(4, 0), _share(NULL, 4)")
    assert shares.fetchall() == [(2, 1, None, None, None)]


def test_rank_count_counts_distinct_ranks_up_to_126_in_either_word(store):
    # two 64-bit sets: a rank in the second (64..126) counts, one outside 0..126 does not,
    # and a group with no rank in range has no count
    got = store.sql(
        "SELECT g, _rank_count(r) FROM (VALUES (1, 0), (1, 0), (1, 5), (2, NULL), (3, 63), (3, 64), (3, 126),"
        " (4, 127), (4, -1), (5, 3), (5, 70), (6, 65)) t(g, r) GROUP BY g ORDER BY g"
    ).fetchall()
    assert got == [(1, 2), (2, None), (3, 3), (4, None), (5, 2), (6, 1)]


def test_json_int_writes_a_sum_as_json_writes_it_within_64_bits_and_beyond(store):
    # the evidence's sums: 64-bit where they fit, the 128-bit text beyond, null as null
    for value in ("5", "-9223372036854775808", "9223372036854775807", "9223372036854775808",
                  "170141183460469231731687303715884105727", "NULL"):  # fmt: skip
        as_is, converted = store.sql(
            f"SELECT CAST(json_object('x', CAST({value} AS HUGEINT)) AS VARCHAR), "
            f"CAST(json_object('x', _json_int(CAST({value} AS HUGEINT))) AS VARCHAR)"
        ).fetchall()[0]
        assert converted == as_is, value


def test_a_request_recorded_twice_counts_its_reads_once(tmp_path):
    # A connector that writes a request's record again later (here with its final status)
    # must not make every read of it join twice: the latest record stands.
    from tracegen import engine_record, transfer_records, write_jsonl

    records = [engine_record("decode-0", "decode", 2), engine_record("prefill-0", "prefill", 2)]
    records += transfer_records(3, tp=2)
    again = next(r for r in records if r["type"] == "request") | {"status": "failed"}
    again["ts"] += 1.0
    write_jsonl(tmp_path / "in" / "decode-0" / "trace.jsonl", [*records, again])
    ingest([tmp_path / "in"], tmp_path / "store", model="nemotron-nano-12b-v2")
    con = Store(tmp_path / "store").connect()
    assert con.sql("SELECT count(*) FROM request_records").fetchall()[0][0] == 4
    assert con.sql("SELECT count(*) FROM requests").fetchall()[0][0] == 3
    assert con.sql("SELECT count(*) FROM transfer_bytes").fetchall()[0][0] == 6
    assert con.sql("SELECT max(reads) FROM request_bytes").fetchall()[0][0] == 2
    rows = con.sql("SELECT request_id, status FROM handoffs ORDER BY request_id").fetchall()
    assert rows == [("cmpl-0-0", "failed"), ("cmpl-0-1", "ok"), ("cmpl-0-2", "ok")]


def test_a_record_repeated_in_a_later_batch_is_seen_by_a_store_opened_before(tmp_path):
    # Opening a store keeps whether its request records repeat a key (counting them is most of
    # opening a large store). What is kept belongs to the files read: a batch that adds a
    # record of a request already recorded is counted again on the next opening.
    from tracegen import engine_record, transfer_records, write_jsonl

    records = [engine_record("decode-0", "decode", 2), engine_record("prefill-0", "prefill", 2)]
    records += transfer_records(3, tp=2)
    write_jsonl(tmp_path / "in" / "decode-0" / "trace.jsonl", records)
    ingest([tmp_path / "in"], tmp_path / "store", model="nemotron-nano-12b-v2")
    for _ in range(2):  # the second opening reads what the first kept
        con = Store(tmp_path / "store").connect()
        assert con.sql("SELECT count(*) FROM requests").fetchall()[0][0] == 3
        assert con.sql("SELECT max(reads) FROM request_bytes").fetchall()[0][0] == 2
    again = next(r for r in records if r["type"] == "request") | {"status": "failed"}
    again["ts"] += 1.0
    write_jsonl(tmp_path / "in" / "decode-0" / "trace.part-2.jsonl", [again])
    ingest([tmp_path / "in"], tmp_path / "store", model="nemotron-nano-12b-v2")
    con = Store(tmp_path / "store").connect()
    assert con.sql("SELECT count(*) FROM request_records").fetchall()[0][0] == 4
    assert con.sql("SELECT count(*) FROM requests").fetchall()[0][0] == 3
    assert con.sql("SELECT max(reads) FROM request_bytes").fetchall()[0][0] == 2
    status = con.execute("SELECT status FROM requests WHERE request_id = ?", [again["request_id"]]).fetchall()
    assert status == [("failed",)]
