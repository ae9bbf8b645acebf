"""The report's document model renders to Markdown block by block."""

import pytest

from cifar_ray.report.document import Bullets, Figure, Heading, Paragraph, Table, to_markdown


def test_each_block_renders_once_separated_by_blank_lines():
    doc = [
        Heading("Sweep `x`", 1),
        Paragraph("A **bold** claim."),
        Bullets(("one", "two")),
        Table(("a", "b"), (("1", "x|y"),), "rl", name="trials"),
        Figure("plot.png", "A plot"),
    ]
    assert to_markdown(doc) == (
        "# Sweep `x`\n\nA **bold** claim.\n\n- one\n- two\n\n"
        "| a | b |\n|---:|---|\n| 1 | x\\|y |\n\n![A plot](plot.png)\n"
    )


def test_an_unknown_block_is_refused():
    with pytest.raises(TypeError, match="not a report block"):
        to_markdown(["plain string"])
