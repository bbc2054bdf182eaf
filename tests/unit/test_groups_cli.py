"""logstore/cli/groups.py: ``reset-offsets --to-offset`` clamps the offset to each partition's
range, as kafka-consumer-groups does. Pure: no broker (tests/integration/test_groups.py runs
the command against one)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logstore.cli import build_parser
from logstore.cli.groups import clamp_offset
from logstore.model import TopicPartition

TP = TopicPartition("orders", 3)


def test_an_offset_outside_the_log_is_moved_to_its_nearer_end_with_a_warning() -> None:
    """Goal: below the log start is the log start, above the log end the log end, each with a
    warning naming the partition and both offsets; inside (ends included) it is kept without
    one. Method: a log holding [100, 250)."""
    assert clamp_offset(TP, 5, 100, 250) == (
        100, "new offset 5 is lower than the earliest offset of orders-3; it is set to 100")
    assert clamp_offset(TP, 900, 100, 250) == (
        250, "new offset 900 is higher than the latest offset of orders-3; it is set to 250")
    assert clamp_offset(TP, -1, 0, 0)[0] == 0
    for kept in (100, 180, 250):
        assert clamp_offset(TP, kept, 100, 250) == (kept, None)


@given(st.integers(-10, 10**6), st.integers(0, 10**5), st.integers(0, 10**5))
def test_the_clamped_offset_is_always_in_the_partitions_range(offset: int, start: int,
                                                              size: int) -> None:
    """Goal: whatever is asked, the result lies in [earliest, latest], is the request when
    that does, and a warning comes exactly when it moved. Method: hypothesis over requests
    and ranges."""
    end = start + size
    clamped, warning = clamp_offset(TP, offset, start, end)
    assert start <= clamped <= end
    assert (clamped == offset) == (warning is None) == (start <= offset <= end)


def test_a_bad_to_datetime_is_a_usage_error_naming_the_option(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It was exit 1 with a message naming no option."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["groups", "reset-offsets", "g", "--topic", "t",
                                   "--to-datetime", "yesterday"])
    assert exited.value.code == 2
    assert "--to-datetime" in capsys.readouterr().err
    args = build_parser().parse_args(["groups", "reset-offsets", "g", "--topic", "t",
                                      "--to-datetime", "2024-05-01T12:00:00"])
    assert args.to_datetime == datetime(2024, 5, 1, 12, tzinfo=UTC)  # naive: UTC


def test_an_empty_key_separator_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["produce", "t", "--key-separator", ""])
    assert exited.value.code == 2
    assert "--key-separator" in capsys.readouterr().err
