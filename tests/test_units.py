"""Units as operators type them: binary sizes, decimal rates, bits, durations."""

import pytest

from hybridtrace.errors import UsageError
from hybridtrace.units import (
    format_bytes,
    format_duration,
    parse_bytes,
    parse_duration,
    parse_int_list,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4KiB", 4096),
        ("4 KiB", 4096),
        ("2.57MiB", 2.57 * 2**20),
        ("1GiB", 2**30),
        ("1GB", 1e9),
        ("1.5kb", 1500),
        ("4096", 4096),
        ("4096B", 4096),
        ("1e3", 1000),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == pytest.approx(expected)


def test_fractional_bytes_round_to_nearest():
    # 2.57 MiB = 2694840.32 bytes: whole bytes, rounded.
    assert parse_bytes("2.57MiB") == 2694840


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20GB/s", 20e9),
        ("25GiB/s", 25 * 2**30),
        ("400Gb/s", 50e9),
        ("100Gbps", 12.5e9),
        ("100GBps", 100e9),
        ("1e9/s", 1e9),
        ("512MB/s", 512e6),
    ],
)
def test_rates(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80us", 80e-6), ("80µs", 80e-6), ("1.5ms", 1.5e-3), ("2s", 2.0), ("250ns", 250e-9), ("0.25", 0.25)],
)
def test_durations(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["", "fast", "4XB", "-3KiB", "KiB"])
def test_bad_sizes_are_usage_errors(bad):
    with pytest.raises(UsageError):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["20GB", "0GB/s", "20XB/s"])
def test_bad_rates_are_usage_errors(bad):
    with pytest.raises(UsageError):
        parse_rate(bad)


def test_int_lists():
    assert parse_int_list("512,4096,32768") == [512, 4096, 32768]
    assert parse_int_list("4k, 32Ki") == [4000, 32768]
    with pytest.raises(UsageError):
        parse_int_list("12.5")
    with pytest.raises(UsageError):
        parse_int_list(",")


def test_formatting():
    assert format_bytes(4791992) == "4.57 MiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(None) == "-"
    assert format_duration(0.0003196) == "319.6 us"
    assert format_duration(0.0069256) == "6.93 ms"
