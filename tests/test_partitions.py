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
