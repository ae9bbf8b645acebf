"""`cifar-ray sweep`: a sweep file's grid of trials, run through Ray Tune (or shown with --dry-run)."""

from __future__ import annotations

import argparse
import json

from .common import REPEATS_OPTION, RESUME_OPTION, add_command, add_common, rows_table, run_plan_command

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
    (
        "add seeds to a finished or interrupted run: 5 per grid point in all, only the new trials run",
        "cifar-ray sweep sweeps/quickstart.yaml --resume --repeats 5",
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
    sweep.add_argument(
        REPEATS_OPTION,
        type=int,
        metavar="N",
        help="seeds per grid point, instead of the file's repeats; with --resume, more than the run has adds the "
        "new seeds' trials to it (finished trials are kept as they are)",
    )


def run(args: argparse.Namespace) -> int:
    from ..core import runlog
    from ..core.config import parse_overrides
    from ..core.storage import StoragePath
    from ..core.sweep import load_sweep, resumed_plan, trial_table, work_summary

    overrides = parse_overrides(args.set)
    plan = load_sweep(args.file, overrides, args.name, args.repeats)
    if args.resume:  # the run's trials as it planned them, and new seeds' where --repeats asks for more
        recorded = runlog.read_json(StoragePath.of(args.storage) / plan.name / runlog.SWEEP_FILE)
        if recorded:
            plan = resumed_plan(args.file, overrides, args.name, args.repeats, recorded)
    if not args.dry_run:
        return run_plan_command(plan, args)
    print(f"{plan.name}: {plan.description}".rstrip(": "))
    rows = trial_table(plan)
    print(rows_table(rows, list(rows[0])))
    print(work_summary(plan))
    if args.json:
        print(json.dumps([t.as_dict() for t in plan.trials]))
    return 0
