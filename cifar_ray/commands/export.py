"""`cifar-ray export`: a run folder written into TensorBoard event files or an MLflow experiment."""

from __future__ import annotations

import argparse

from ..export.viewers import TARGETS  # export/viewers.py imports its viewer packages only when it writes
from .common import add_command

HELP = "write a run folder into TensorBoard logs or an MLflow experiment"
EXAMPLES = (
    (
        "TensorBoard logs in runs/quickstart/tensorboard (open: tensorboard --logdir runs/quickstart/tensorboard)",
        "cifar-ray export runs/quickstart --to tensorboard",
    ),
    (
        "an MLflow experiment in runs/quickstart/mlflow.db (SQLite, offline)",
        "cifar-ray export runs/quickstart --to mlflow",
    ),
    ("to an MLflow tracking server", "cifar-ray export runs/quickstart --to mlflow --out http://localhost:5000"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    export = add_command(subparsers, "export", HELP, EXAMPLES)
    export.add_argument("run_dir", help="a run folder or URI, e.g. runs/quickstart or s3://bucket/runs/quickstart")
    export.add_argument("--to", required=True, choices=TARGETS, help="the viewer to write for")
    export.add_argument(
        "--out",
        default=None,
        help="tensorboard: a folder (default: RUN_DIR/tensorboard); mlflow: a tracking URI such as "
        "http://host:5000 or file:/path/mlruns (default: sqlite:///RUN_DIR/mlflow.db); required for a run at a URI. "
        "A local --out inside, holding or being a run folder is refused: only the defaults, which export makes, lie "
        "in one. Exporting again replaces only what an export of the same run wrote (marked; MLflow: tagged)",
    )


def run(args: argparse.Namespace) -> int:
    from ..export.viewers import export_run

    print(export_run(args.run_dir, args.to, args.out))
    return 0
