"""`cifar-ray status`: where a sweep stands, read from its run folder (no Ray)."""

from __future__ import annotations

import argparse

from .common import add_command

HELP = "where a sweep stands, from its run folder: a line per trial, totals, an ETA"
EXAMPLES = (
    (
        "a line per trial (finished, running: epoch k of n, ...), the totals and an ETA",
        "cifar-ray status runs/quickstart",
    ),
    ("the same as one JSON object, for scripts", "cifar-ray status runs/quickstart --json"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    status = add_command(subparsers, "status", HELP, EXAMPLES)
    status.add_argument("run_dir", help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart")
    status.add_argument("--json", action="store_true", help="print it as one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..core.status import render

    print(render(args.run_dir, args.json))
    return 0
