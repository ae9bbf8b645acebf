"""`cifar-ray sweep`: a sweep file's grid of trials, run through Ray Tune (or shown with --dry-run)."""

from __future__ import annotations

import argparse
import json

from .common import RESUME_OPTION, add_command, add_common, rows_table, run_plan_command

HELP = "run a sweep file (a grid of trials) through Ray Tune"
EXAMPLES = (
    (
        "the trial table and the work to do, without running anything",
        "cifar-ray sweep sweeps/batch_size.yaml --dry-run",
    ),
    ("the demo: synthetic data, 4 trials; logs in runs/quickstart", "cifar-ray sweep sweeps/quickstart.yaml"),
    (
        "every trial shorter, on synthetic data (--set before or after the file); logs in runs/batch-size-short",
        "cifar-ray sweep --set dataset=synthetic epochs=1 sweeps/batch_size.yaml --name batch-size-short",
    ),
    (
        "finish an interrupted run (with the --storage, --name and --set it was started with)",
        "cifar-ray sweep sweeps/quickstart.yaml --resume",
    ),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    sweep = add_command(subparsers, "sweep", HELP, EXAMPLES)
    sweep.add_argument("file", help="sweep YAML file, e.g. sweeps/quickstart.yaml")
    add_common(sweep)
    sweep.add_argument("--dry-run", action="store_true", help="print the trial table and exit")
    sweep.add_argument(
        RESUME_OPTION,
        action="store_true",
        help="finish an interrupted run of this sweep: finished trials are kept, "
        "the rest continue from their checkpoints",
    )


def run(args: argparse.Namespace) -> int:
    from ..api import sweep_plan
    from ..core.sweep import trial_table, work_summary

    plan = sweep_plan(args.file, args.set, args.name)
    if not args.dry_run:
        return run_plan_command(plan, args)
    print(f"{plan.name}: {plan.description}".rstrip(": "))
    rows = trial_table(plan)
    print(rows_table(rows, list(rows[0])))
    print(work_summary(plan))
    if args.json:
        print(json.dumps([t.as_dict() for t in plan.trials]))
    return 0
