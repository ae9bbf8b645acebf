"""docs/measurements.md, the one page of the project's timings, rendered from reports/measurements.json (measured
by hand: installs, the test suite, commands) beside a pointer to the benchmark's own page.
`cifar-ray bench --render` writes it; tests/test_readme.py fails when the page and its record disagree."""

from __future__ import annotations

import textwrap

from ..core.text import markdown_table

RECORD = "reports/measurements.json"
PAGE = "docs/measurements.md"
COLUMNS = ("what", "command", "measured", "date", "commit")
WIDTH = 115  # prose lines, as the other docs pages wrap them


def _paragraph(text: str) -> str:
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def _bullet(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_long_words=False)


def render(record: dict) -> str:
    """The page: where timings are kept, the machine, and a table per section."""
    lines = [
        "# Measurements",
        "",
        _paragraph(
            "Every timing of this project is here or in the benchmark's report; the other pages link here instead "
            "of quoting a number."
        ),
        "",
        _bullet(
            "**The benchmark** (the loop in Ray vs bare PyTorch, a trial's start-up in a Ray Train run and in a warm "
            "slot, a warm pool, a cold start and its processes against plain Ray Train, a shape switch, the data "
            "path, scaling, batch size): [reports/bench/README.md](../reports/bench/README.md), "
            "written by `cifar-ray bench` from `bench.json` beside it, with its date, commit and machine."
        ),
        _bullet(
            f"**Everything else**, measured by hand, is recorded in `{RECORD}`, from which `cifar-ray bench --render` "
            "writes this page (`tests/test_readme.py` fails when they disagree). Re-measure before you rely on a "
            "number, and update its row when you do."
        ),
        "",
        _paragraph(
            f'Machine for every row: {record["machine"]} "Busy" marks rows measured while other jobs shared the '
            'cores; "commit" is the commit that recorded the number.'
        ),
    ]
    for table in record["tables"]:
        rows = [[row[column] for column in COLUMNS] for row in table["rows"]]
        lines += ["", f"## {table['title']}", "", markdown_table(COLUMNS, rows)]
    return "\n".join(lines) + "\n"
