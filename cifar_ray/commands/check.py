"""`cifar-ray check`: the training semantics proven on this machine, one PASS/FAIL line per check."""

from __future__ import annotations

import argparse

from .common import add_command

HELP = "prove the training semantics on this machine (accumulation, DDP, seeds, AMP); one PASS/FAIL line each"
EXAMPLES = (
    ("every check, on the GPU when torch sees one", "cifar-ray check"),
    ("every check on the CPU, with Ray's own logs", "cifar-ray check --use-gpu false -v"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    check = add_command(subparsers, "check", HELP, EXAMPLES)
    check.add_argument("--workers", type=int, default=2, metavar="N", help="DDP workers of the DDP check (default: 2)")
    check.add_argument(
        "--use-gpu",
        default="auto",
        choices=("auto", "true", "false"),
        help="run the checks on the GPU (DDP with nccl): auto (if CUDA is there), true, false",
    )
    check.add_argument("--address", default=None, help="Ray cluster to use (default: start a local Ray)")
    check.add_argument("-v", "--verbose", action="store_true", help="show Ray's own logs")


def run(args: argparse.Namespace) -> int:
    from ..cluster.checks import run_checks

    results = run_checks(
        workers=args.workers,
        use_gpu=args.use_gpu,
        address=args.address,
        verbose=args.verbose,
        print_line=lambda line: print(line, flush=True),
    )
    return 1 if any(r.status == "FAIL" for r in results) else 0
