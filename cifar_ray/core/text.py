"""Text for people, written once: durations, Markdown tables and plain-text tables (terminal output)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def counted(number: int | str, noun: str) -> str:
    """`number` and `noun`, plural unless the number is one: '1 epoch', '3 epochs', '1,000 trials', '2-3 epochs' (a
    number already written as text is taken as it is)."""
    return f"{number} {noun}" if str(number) == "1" else f"{number} {noun}s"


def first_line(error: BaseException) -> str:
    """The first non-blank line of `error`'s message, or its type's name where it has none."""
    return next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)


SHOWN_MAX = 60  # characters of a refused value echoed back: a 1 MB name is named, not printed


def shown(value: Any) -> str:
    """`value` as Python writes it (repr), cut to SHOWN_MAX characters: `'abc'`, `[1, 2, 3, 4, …] (1,000 values)`."""
    text = repr(value)
    if len(text) <= SHOWN_MAX:
        return text
    size = f" ({len(value):,} values)" if isinstance(value, (list, tuple, dict)) else f" ({len(text):,} characters)"
    return text[: SHOWN_MAX - 1] + "…" + size


def rough_duration(seconds: float) -> str:
    """A duration for an estimate or an age: `26 s` under 2 min, `14 min` under 2 h, else `2 h 05 min`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min"


def precise_duration(seconds: float) -> str:
    """A measured duration: `9.5 s` under a minute, `1 min 35 s` under an hour, else `2 h 05 min`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table; `align` is one letter per column: l, r or c."""

    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    align = align or "l" * len(headers)
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, pad_last: bool = True) -> str:
    """Columns aligned with two spaces between them, under `header` when given; `pad_last=False` leaves the last
    column unpadded (no trailing spaces)."""
    table = ([list(header)] if header is not None else []) + [list(row) for row in rows]
    if not table:
        return ""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    if not pad_last:
        widths[-1] = 0
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in table)
