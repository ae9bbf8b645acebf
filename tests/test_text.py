"""core.text: the one duration formatter of each precision and the one table writer of each format."""

from __future__ import annotations

import pytest

from cifar_ray.core.text import counted, markdown_table, precise_duration, rough_duration, text_table


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(26.4, "26 s"), (119.4, "119 s"), (840, "14 min"), (7199, "120 min"), (7200, "2 h 00 min"), (7530, "2 h 06 min")],
)
def test_rough_duration_is_whole_seconds_then_minutes_then_hours(seconds, text):
    assert rough_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(9.54, "9.5 s"), (59.9, "59.9 s"), (95, "1 min 35 s"), (3599.4, "59 min 59 s"), (3600, "1 h 00 min")],
)
def test_precise_duration_keeps_tenths_then_seconds_then_minutes(seconds, text):
    assert precise_duration(seconds) == text


def test_text_table_aligns_columns_under_the_header():
    table = text_table([["t000", "finished"], ["t1", "failed"]], header=["trial", "status"])
    assert table.splitlines() == ["trial  status  ", "t000   finished", "t1     failed  "]


def test_text_table_can_leave_the_last_column_unpadded():
    table = text_table([["t000", "3/3 epochs"], ["t1", "0/3"]], pad_last=False)
    assert table.splitlines() == ["t000  3/3 epochs", "t1    0/3"]
    assert text_table([]) == ""


def test_markdown_table_aligns_and_keeps_cells_on_one_line():
    table = markdown_table(["key", "n"], [["a\nb", 1]], "lr")
    assert table == "| key | n |\n|---|---:|\n| a b | 1 |"


def test_counted_says_one_thing_in_the_singular():
    assert [counted(1, "epoch"), counted("1", "epoch"), counted(0, "epoch"), counted("1,000", "trial")] == [
        "1 epoch",
        "1 epoch",
        "0 epochs",
        "1,000 trials",
    ]
    assert counted("1-3", "epoch") == "1-3 epochs"
