"""`cifar-ray report`: a Markdown report with plots (or CSV/JSON tables) from one run folder, or several compared."""

from __future__ import annotations

import argparse

from .common import add_command

HELP = "write a Markdown (or one-file HTML) report with plots from a run folder, or compare several"
EXAMPLES = (
    ("README.md with tables and plots in runs/quickstart/report", "cifar-ray report runs/quickstart"),
    (
        "deltas measured against batch size 128, written into a folder of its own",
        "cifar-ray report runs/batch-size --baseline batch_size=128 --out runs/batch-size-report",
    ),
    (
        "one file to attach or publish: runs/quickstart/report/report.html",
        "cifar-ray report runs/quickstart --format html",
    ),
    (
        "the quickstart run here vs the same sweep run on a GPU box (its run folder copied into gpu-runs/): "
        "one more factor, run; -> reports/runs-quickstart-vs-gpu-runs-quickstart",
        "cifar-ray report runs/quickstart gpu-runs/quickstart",
    ),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    report = add_command(subparsers, "report", HELP, EXAMPLES)
    report.add_argument(
        "run_dir",
        nargs="+",
        help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart; several: the runs become one "
        "more factor, run (labelled by folder name), their trials paired where their configs agree on every key but "
        "the run-level ones (constant within each run, different between runs)",
    )
    report.add_argument(
        "--out",
        default=None,
        help="output folder (default: RUN_DIR/report; for a run at a URI reports/<sweep name>, for several runs "
        "reports/<label>-vs-<label>...; a default folder holding files tracked by git is refused, see --force)",
    )
    report.add_argument(
        "--force",
        action="store_true",
        help="write into the default output folder even when git tracks files there (they are replaced)",
    )
    report.add_argument(
        "--baseline",
        default=None,
        metavar="KEY=VALUE",
        help="grid value the deltas are measured against (default: each factor's first value; for several runs, "
        "run=LABEL picks the run, default the first)",
    )
    report.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="PP",
        help="equivalence margin of accuracy effects in percentage points: an effect whose interval lies within ±PP "
        "is called equivalent (two one-sided tests; default 1)",
    )
    report.add_argument(
        "--target",
        type=float,
        metavar="ACC",
        help="a test accuracy as a fraction (0.85): compare the time each configuration takes to reach it "
        "(default: the sweep file's `target`, if any)",
    )
    report.add_argument(
        "--format",
        default="md",
        metavar="FORMAT",
        help="md (default): README.md + PNG plots; html: report.html, one self-contained file (plots inside, "
        "tables sortable); csv/json: the aggregated tables",
    )


def run(args: argparse.Namespace) -> int:
    from ..core.report_options import check_report_options

    check_report_options(args.format, args.target)  # before the report's imports: a bad option is refused at once
    from ..api import report

    runs = args.run_dir if len(args.run_dir) > 1 else args.run_dir[0]
    judging = {} if args.margin is None else {"margin_pp": args.margin}
    judging |= {} if args.target is None else {"target": args.target}
    print(report(runs, out=args.out, baseline=args.baseline, fmt=args.format, force=args.force, **judging))
    return 0
