"""`cifar-ray` command line: the top-level parser over the subcommands of cifar_ray/commands/ (a module each: its
parser, examples and handler), one line and exit 2 for a UserError, 130 for an interrupt.

torch, Ray, pyarrow and pydantic are imported only by the commands that use them, so `--help`, `--version`,
usage errors, `--dry-run` and the refusals before a run answer in well under a second instead of 3-4 s.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import os
import sys
from collections.abc import Sequence

from .commands import COMMANDS
from .commands.common import PROG, Parser, stopped_status
from .core.errors import UsageError, UserError

USAGE_ERROR = 2


class VersionAction(argparse.Action):
    """--version: the installed package's version, looked up only when asked (importlib.metadata imports email,
    zipfile and more: tens of ms that every other command would pay)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"{PROG} {version(PROG)}")
        except PackageNotFoundError:
            raise UsageError(f"the {PROG} package is not installed, so it has no version; pip install -e .") from None
        parser.exit()


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Ray-based sweep orchestrator for CIFAR-10 CNN training.")
    parser.add_argument("--version", action=VersionAction, help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(subparsers)
    return parser


def unrecognized(parser: Parser, command: str, extras: Sequence[str]) -> UsageError:
    """argparse's "unrecognized arguments" with the nearest option of the subcommand and where the allowed ones are."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    options = [o for action in sub._actions for o in action.option_strings]
    near = [m for word in extras if word.startswith("-") for m in difflib.get_close_matches(word, options, n=1)]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return UsageError(
        f"unrecognized arguments: {' '.join(extras)}{hint}; allowed: the options of `{PROG} {command} --help`"
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = _main(argv)
    finally:
        if argv is None:  # the program, about to exit (tests pass argv and go on)
            # The interpreter's last garbage collection scans every object left (torch, Ray, pandas): 3 to 6 s
            # after a Ctrl-C'd sweep on a busy 2-core machine. Frozen objects are not scanned; none needs it to exit.
            gc.freeze()
    if argv is None and getattr(sys.modules.get("cifar_ray.cluster.ray_start"), "cut_short", False):
        # Ray's start was cut short and its processes stopped (ray_start.ray_starting): exit without the teardown
        # its half-built core worker crashes in, so the status is the command's, not a SIGSEGV's.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # bare `cifar-ray`: what it can do, not "the following arguments are required"
        print(parser.format_help(), end="", file=sys.stderr)
        return USAGE_ERROR
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:
            raise unrecognized(parser, args.command, extras)
        args.argv = argv  # the words as given: a run records them (common.rerun_command)
        return COMMANDS[args.command].run(args)
    except UserError as error:
        prog = getattr(error, "prog", None) or PROG
        print(f"{prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return stopped_status()


if __name__ == "__main__":
    sys.exit(main())
