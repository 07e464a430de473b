"""How a table's rows are split into partition directories (``store.commit.partitions``)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from hybridtrace.schema import table_schema
from hybridtrace.store.commit import _partition_dir, partitions

DAY = dt.date(2026, 4, 21)
NEXT = dt.date(2026, 4, 22)


def _grouped(schema, data: pa.Table) -> dict[str, int]:
    """Rows per directory, as grouping every row names them (the reference)."""
    out: dict[str, int] = {}
    for combo in data.group_by(list(schema.partition)).aggregate([([], "count_all")]).to_pylist():
        directory = schema.name
        for column in schema.partition:
            directory += f"/{column}={_partition_dir(combo[column])}"
        out[directory] = combo["count_all"]
    return out


@pytest.mark.parametrize(
    ("days", "engines"),
    [
        ([DAY] * 3, ["decode-0"] * 3),  # one partition: the usual batch
        ([None] * 3, [None] * 3),  # no time, no engine
        ([DAY, None, DAY], ["decode-0"] * 3),  # some rows without a day
        ([DAY, NEXT, DAY], ["decode-0"] * 3),  # two days
        ([DAY] * 3, ["decode-0", "decode-1", "decode-0"]),  # two engines
        ([DAY] * 3, ["decode-0", None, None]),
    ],
)
def test_each_row_lands_in_the_directory_of_its_own_values(days, engines):
    schema = table_schema("log_events")
    rows = schema.arrow_schema().empty_table()
    data = pa.table({"day": pa.array(days, pa.date32()), "engine_id": pa.array(engines, pa.string())})
    data = schema.conform(pa.concat_tables([rows, data], promote_options="default"))
    split = partitions(schema, data)
    assert {directory: part.num_rows for directory, part in split} == _grouped(schema, data)
    for directory, part in split:  # every row of a part has the part's values
        assert _grouped(schema, part) == {directory: part.num_rows}


def test_no_rows_make_no_partition():
    schema = table_schema("log_events")
    assert partitions(schema, schema.arrow_schema().empty_table()) == []


def test_a_table_sorted_by_its_partition_columns_is_split_without_a_copy():
    """Sorted by its partition columns first (as the analysis state is written), each
    partition is one run of rows: a slice of the table, sharing its buffers. Unsorted, the
    same rows come out, filtered."""
    schema = table_schema("analysis_counts")
    rows = [
        {"seq": 1, "engine_id": engine, "day": day, "counter": "reads", "key": None, "value": n}
        for n, (day, engine) in enumerate([(DAY, "decode-0"), (DAY, "decode-1"), (NEXT, None)] * 3)
    ]
    data = schema.conform(pa.Table.from_pylist(rows))
    order = [("day", "ascending"), ("engine_id", "ascending"), ("value", "ascending")]
    ordered = data.sort_by(order)
    split = dict(partitions(schema, ordered))
    shuffled = dict(partitions(schema, data))
    assert split.keys() == shuffled.keys() == _grouped(schema, data).keys()
    base = ordered.column("value").chunks[0].buffers()[1].address
    for directory, part in split.items():
        assert part.sort_by(order).equals(shuffled[directory].sort_by(order))
        # a slice points into the sorted table's own buffer
        assert part.column("value").chunks[0].buffers()[1].address == base
