"""The report as a document: a list of blocks that the layout (the template) builds once from a `Report`, and that
each output format renders whole. Text in blocks is inline Markdown of one small subset: `code`, **bold**, *italic*
and [text](url); every renderer understands exactly that subset."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.text import markdown_table


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2  # 1: the report's title


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]  # cells already formatted for people
    align: str = ""  # one letter per column: l, r or c; "" for all left
    name: str = ""  # what the table is ("trials", "effects-optimizer"): an anchor for HTML, a handle for tests


@dataclass(frozen=True)
class Figure:
    file: str  # a PNG beside the report
    caption: str


Block = Heading | Paragraph | Bullets | Table | Figure
Document = Sequence[Block]


def block_markdown(block: Block) -> str:
    if isinstance(block, Heading):
        return "#" * block.level + " " + block.text
    if isinstance(block, Paragraph):
        return block.text
    if isinstance(block, Bullets):
        return "\n".join(f"- {item}" for item in block.items)
    if isinstance(block, Table):
        return markdown_table(block.headers, block.rows, block.align or None)
    if isinstance(block, Figure):
        return f"![{block.caption}]({block.file})"
    raise TypeError(f"not a report block: {block!r}")


def to_markdown(document: Document) -> str:
    """The document as GitHub-flavoured Markdown: blocks separated by one blank line, ending in a newline."""
    return "\n\n".join(block_markdown(block) for block in document) + "\n"
