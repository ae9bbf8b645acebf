"""End-to-end: real Ray, real Ray Train workers (gloo), tiny data."""

import json
import re

import pytest

from cifar_ray.cli import main
from cifar_ray.core import runlog
from cifar_ray.report import write_report

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


def test_train_two_workers_on_cifar_fixture(cifar_dir, tmp_path, capsys):
    code = main(
        [
            "train",
            "--storage",
            str(tmp_path),
            "--name",
            "fixture",
            "--json",
            "--set",
            "dataset=cifar10",
            f"data_dir={cifar_dir}",
            "workers=2",
            "epochs=2",
            "batch_size=64",
            "width=8",
            "augment=flip_crop_cutout",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = last_json(out)
    assert result["status"] == "finished" and result["epochs_done"] == 2
    assert result["workers"] == 2 and result["backend"] == "gloo" and result["use_gpu"] == "false"
    # 600 fixture images, global batch 64: 9 steps x 64 over BOTH ranks, not rank 0's 288
    assert result["train_samples"] == 9 * 64
    # the whole 200-image test set is evaluated (split over the 2 ranks)
    assert round(result["test_acc"] * 200, 6) == int(round(result["test_acc"] * 200))
    epoch_lines = [line for line in err.splitlines() if " epoch " in line]
    assert len(epoch_lines) == 2 and "epoch 2/2" in epoch_lines[-1] and "img/s" in epoch_lines[-1]

    run = runlog.load_run(tmp_path / "fixture")
    trial = run.trials[0]
    assert [row["epoch"] for row in trial.epochs] == [1, 2]
    for row in trial.epochs:
        for key in (
            "train_loss",
            "train_acc",
            "test_loss",
            "test_acc",
            "epoch_time_s",
            "samples_per_s",
            "peak_mem_mb",
            "lr_last",
            "lr_max",
        ):
            assert isinstance(row[key], float) and row[key] >= 0, key
    assert trial.meta["system"]["world_size"] == 2 and trial.meta["system"]["device_type"] == "cpu"
    assert len(trial.meta["system"]["nodes"]) == 2 and all(trial.meta["system"]["nodes"])  # gathered from both ranks
    assert run.sweep["versions"]["torch"] and run.sweep["finished_at"]


def test_sweep_grid_mixing_one_and_two_workers_learns(tmp_path, capsys):
    sweep = tmp_path / "mixed.yaml"
    sweep.write_text(
        "name: mixed\n"
        "description: tiny grid for the test suite\n"
        "base: {dataset: synthetic, train_subset: 1024, test_subset: 256, "
        "width: 8, epochs: 3, batch_size: 32, augment: none}\n"
        "grid:\n  workers: [1, 2]\n  optimizer: [{optimizer: momentum, lr: 0.05}, {optimizer: adam, lr: 0.003}]\n"
    )
    code = main(["sweep", str(sweep), "--storage", str(tmp_path / "runs"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    results = last_json(out)
    assert len(results) == 4
    assert sorted(r["workers"] for r in results) == [1, 1, 2, 2]
    for result in results:
        assert result["status"] == "finished" and result["epochs_done"] == 3, result
        assert result["test_acc"] > 0.3, f"{result['trial']} did not learn: {result['test_acc']}"  # chance is 0.1
        epochs = runlog.read_epochs(tmp_path / "runs" / "mixed" / result["trial"])
        assert [row["epoch"] for row in epochs] == [1, 2, 3]
        assert epochs[-1]["test_acc"] == result["test_acc"]
    assert sum(re.search(r"  epoch [123]/3  ", line) is not None for line in err.splitlines()) == 12

    # the report reads these real logs without Ray
    readme = write_report(tmp_path / "runs" / "mixed", out_dir=tmp_path / "report")
    text = readme.read_text()
    assert "tiny grid for the test suite" in text and "4 finished" in text
    for result in results:
        assert f"`{result['trial']}`" in text
    for png in tmp_path.joinpath("report").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "report" / "curves_loss.png").exists()
