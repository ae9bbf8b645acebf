"""`cifar-ray status`: where a sweep stands, read from its run folder (no Ray)."""

from __future__ import annotations

import argparse
import sys

from ..core.errors import UsageError
from ..core.status import WATCH_INTERVAL_S, WATCH_WAIT_S
from .common import add_command

HELP = "where a sweep stands, from its run folder: a line per trial, totals, an ETA"
EXAMPLES = (
    (
        "a line per trial (finished, running: epoch k of n, ...), the totals and an ETA",
        "cifar-ray status runs/quickstart",
    ),
    ("the same as one JSON object, for scripts", "cifar-ray status runs/quickstart --json"),
    (
        "the table refreshed in place every 10 s until the sweep ends (plain lines when piped); Ctrl-C stops",
        "cifar-ray status runs/quickstart --watch --interval 10",
    ),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    status = add_command(subparsers, "status", HELP, EXAMPLES)
    status.add_argument("run_dir", help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart")
    status.add_argument("--json", action="store_true", help="print it as one JSON object")
    status.add_argument(
        "--watch",
        action="store_true",
        help="refresh the table in place until the sweep ends (appended plain lines when stdout is no terminal); "
        f"a folder that holds no run yet is waited for, up to {WATCH_WAIT_S:g} s (start it with the sweep)",
    )
    status.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds between refreshes with --watch (default: {WATCH_INTERVAL_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    from ..core.status import render, watch

    if args.interval is not None and not args.watch:
        raise UsageError("--interval sets how often --watch refreshes; pass --watch too, or leave --interval out")
    if args.watch and args.json:
        raise UsageError("--watch refreshes a table; --json prints one object: pass one of them")
    interval = WATCH_INTERVAL_S if args.interval is None else args.interval
    if not interval > 0:
        raise UsageError(f"--interval must be a number of seconds above 0, got {args.interval:g}")
    if not args.watch:
        print(render(args.run_dir, args.json))
        return 0
    try:
        watch(args.run_dir, interval, lambda text: print(text, end="", flush=True), in_place=sys.stdout.isatty())
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends early: no traceback, not an error
        pass
    return 0
