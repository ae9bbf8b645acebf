"""`cifar-ray train`: one configuration, trained data-parallel through Ray Train."""

from __future__ import annotations

import argparse

from .common import add_command, add_common, run_plan_command

HELP = "train one configuration data-parallel through Ray Train"
EXAMPLES = (
    (
        "synthetic data (nothing to download), 2 data-parallel workers, 3 epochs",
        "cifar-ray train --set dataset=synthetic train_subset=5000 test_subset=1000 workers=2 epochs=3",
    ),
    (
        "CIFAR-10 (downloaded on first use) with ResNet-9; logs in runs/resnet9",
        "cifar-ray train --set model=resnet9 epochs=5 --name resnet9",
    ),
    (
        "on the Ray cluster that `ray start` runs on this machine, logs in a folder every node mounts",
        "cifar-ray train --address auto --storage /mnt/shared/runs --set workers=2",
    ),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_common(add_command(subparsers, "train", HELP, EXAMPLES))


def run(args: argparse.Namespace) -> int:
    from ..api import train_plan

    return run_plan_command(train_plan(args.set, args.name), args)
