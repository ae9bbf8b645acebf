"""`cifar-ray keys`: every config key --set and sweep files take."""

from __future__ import annotations

import argparse
import shutil

from .common import add_command

HELP = "list every config key (--set, sweep files): type, allowed values, default, meaning"
EXAMPLES = (
    ("every key --set and sweep files take: type, allowed values, default, meaning", "cifar-ray keys"),
    ("the same as the Markdown table in docs/config-keys.md", "cifar-ray keys --markdown"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    keys = add_command(subparsers, "keys", HELP, EXAMPLES)
    keys.add_argument("--markdown", action="store_true", help="print the Markdown table of docs/config-keys.md instead")


def run(args: argparse.Namespace) -> int:
    from ..core.keys import format_keys_text, key_rows, markdown_keys_table

    rows = key_rows()
    text = markdown_keys_table(rows) if args.markdown else format_keys_text(rows, shutil.get_terminal_size().columns)
    print(text, end="")
    return 0
