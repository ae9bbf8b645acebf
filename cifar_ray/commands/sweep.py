"""`cifar-ray sweep`: a sweep file's grid of trials, run through Ray Tune (or shown with --dry-run)."""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING

from ..core.errors import UsageError
from ..settling import DEFAULT_MAX_SEEDS
from .common import REPEATS_OPTION, RESUME_OPTION, add_command, add_common, rows_table, run_plan_command

if TYPE_CHECKING:
    from ..core.sweep import SweepPlan

ESTIMATE_OPTION = "--estimate"
UNTIL_SETTLED_OPTION = "--until-settled"

HELP = "run a sweep file (a grid of trials) through Ray Tune"
EXAMPLES = (
    (
        "the trial table, the work to do and how long it will take (each distinct step timed here, in seconds), "
        "without running anything",
        "cifar-ray sweep sweeps/quickstart.yaml --dry-run --estimate",
    ),
    ("the demo: synthetic data, 4 trials; logs in runs/quickstart", "cifar-ray sweep sweeps/quickstart.yaml"),
    (
        "every trial shorter, on synthetic data (--set before or after the file); logs in runs/batch-size-short",
        "cifar-ray sweep --set dataset=synthetic epochs=1 sweeps/batch_size.yaml --name batch-size-short",
    ),
    (
        "finish an interrupted run (with the --storage, --name and --set it was started with); --repeats 5: and add "
        "seeds, to 5 per grid point in all (only the new trials run)",
        "cifar-ray sweep sweeps/quickstart.yaml --resume --repeats 5",
    ),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    sweep = add_command(subparsers, "sweep", HELP, EXAMPLES)
    sweep.add_argument("file", help="sweep YAML file, e.g. sweeps/quickstart.yaml")
    add_common(sweep)
    sweep.add_argument("--dry-run", action="store_true", help="print the trial table and exit")
    sweep.add_argument(
        ESTIMATE_OPTION,
        action="store_true",
        help="time a few training steps of each distinct model and batch on this machine (seconds, no Ray) and "
        "estimate the sweep's wall time: printed with --dry-run, else in the sweep's header",
    )
    sweep.add_argument(
        RESUME_OPTION,
        action="store_true",
        help="finish an interrupted run of this sweep: finished trials are kept, "
        "the rest continue from their checkpoints",
    )
    sweep.add_argument(
        UNTIL_SETTLED_OPTION,
        action="store_true",
        help="after the grid, add seeds round by round to the configurations of the comparisons still open, until "
        "each is settled (a real effect, or equivalent within the margin), with tests valid under these repeated "
        "looks (docs/settle.md)",
    )
    sweep.add_argument(
        "--max-seeds",
        type=int,
        metavar="N",
        help=f"with {UNTIL_SETTLED_OPTION}: at most N seeds per configuration (default: the larger of "
        f"{DEFAULT_MAX_SEEDS} and the file's repeats; a resumed run's own); it fixes how strict each look's tests are",
    )
    sweep.add_argument(
        "--budget",
        type=parse_budget,
        metavar="TIME",
        help=f"with {UNTIL_SETTLED_OPTION}: no round starts that this run's trial times say would take the sweep's "
        "wall time past TIME (90s, 30m, 2h; the grid's own estimate must fit it)",
    )
    sweep.add_argument(
        REPEATS_OPTION,
        type=int,
        metavar="N",
        help="seeds per grid point, instead of the file's repeats; with --resume, more than the run has adds the "
        "new seeds' trials to it (finished trials are kept as they are)",
    )


def parse_budget(text: str) -> float:
    """`30m` -> 1800.0: a number of seconds (s, or none), minutes (m) or hours (h)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a wall time; allowed: a number with s, m or h, e.g. 30m")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def estimate_refusal(args: argparse.Namespace) -> str | None:
    """Why --estimate cannot answer for this command line, in one line; None when it can."""
    from ..cluster.session import cluster_address  # imports no Ray

    if args.resume:
        return (
            f"{ESTIMATE_OPTION} times a whole sweep before it starts, {RESUME_OPTION} continues one; drop one of them"
        )
    if cluster_address(args.address) is not None:
        return (
            f"{ESTIMATE_OPTION} times the steps on this machine, but --address (or RAY_ADDRESS) runs the trials on a "
            "Ray cluster; drop one of them (RAY_ADDRESS=local for this machine)"
        )
    return None


def run(args: argparse.Namespace) -> int:
    from ..api import check_max_concurrent, resumed_sweep_plan, settle_options, sweep_plan
    from ..core.work import trial_table, work_summary
    from ..settling import default_max_seeds

    if args.resume:  # the run's trials as it planned them, and new seeds' where --repeats asks for more
        plan = resumed_sweep_plan(args.file, args.set, args.name, args.repeats, args.storage)
    else:
        plan = sweep_plan(args.file, args.set, args.name, args.repeats)
    refusal = estimate_refusal(args) if args.estimate else None
    if refusal:
        raise UsageError(refusal)
    check_max_concurrent(args.max_concurrent)
    args.settle = settle_options(
        plan,
        args.file,
        args.set,
        name=args.name,
        until_settled=args.until_settled,
        max_seeds=args.max_seeds,
        budget_s=args.budget,
    )
    if not args.dry_run:
        return run_plan_command(plan, args)
    print(f"{plan.name}: {plan.description}".rstrip(": "))
    rows = trial_table(plan)
    print(rows_table(rows, list(rows[0])))
    print(work_summary(plan))
    if not args.estimate:
        print(rough_estimate_line(plan, args))
    if args.settle:
        print(settle_plan_line(plan, args.settle.max_seeds or default_max_seeds(plan)))
    if args.estimate:
        print_estimate(plan, args)
    if args.json:
        print(json.dumps([t.as_dict() for t in plan.trials]))
    return 0


def settle_plan_line(plan: SweepPlan, max_seeds: int) -> str:
    """What --until-settled will do after the grid, for the dry run."""
    from ..report.sequential import describe, grid_comparisons, max_looks

    count = len(grid_comparisons(plan.grid))
    return (
        f"{UNTIL_SETTLED_OPTION}: then seeds added where a comparison is open, up to {max_seeds} per configuration; "
        f"{describe(count, max_looks(plan.repeats, max_seeds))}"
    )


def rough_estimate_line(plan: SweepPlan, args: argparse.Namespace) -> str:
    """The dry run's rough wall time without --estimate: the header's (cluster/progress.sweep_header) on this
    machine's CPUs as the embedded Ray would have them, no GPU counted, nothing timed and neither torch nor Ray
    imported."""
    from ..cluster.placement import capacity_of, trials_at_once
    from ..cluster.session import local_resources
    from ..core.estimate import rough_estimate, rough_line
    from ..core.sysinfo import machine_load
    from ..core.text import counted
    from .common import rerun_command

    cpus = local_resources(num_gpus=0)
    capacity = capacity_of([{key: float(value) for key, value in cpus.items()}])
    limit = args.max_concurrent or plan.max_concurrent
    at_once = {label: fit for label, (_, fit) in trials_at_once(plan, capacity, limit).items()}
    rough = rough_estimate([t.config for t in plan.trials], at_once, args.isolate)
    line = rough_line(rough, len(plan.trials), f"{rerun_command(args.argv)} --estimate", machine_load())
    return f"on this machine's {counted(cpus['CPU'], 'CPU')}: {line}"


def print_estimate(plan: SweepPlan, args: argparse.Namespace) -> None:
    """The timed steps and the estimate of the dry run."""
    from ..cluster.estimate import estimate_plan
    from ..core.estimate import estimate_line

    estimate = estimate_plan(plan, args.max_concurrent or plan.max_concurrent, args.isolate, print)
    print(rows_table(estimate.timings, list(estimate.timings[0])))
    print(estimate_line(estimate.sweep))
