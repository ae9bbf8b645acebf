"""The live view of a real sweep: Tune's TensorBoard event files in the run folder as epochs arrive, across a killed
driver and --resume, and each session's provenance."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

from cifar_ray.cli import main
from cifar_ray.cluster.live_view import LIVE_FLUSH_S, TUNE_TAG, live_tensorboard, logged_epochs
from cifar_ray.core import provenance, runlog
from cifar_ray.core.checkpoints import CHECKPOINT_FILE, CHECKPOINTS, epoch_folder
from cifar_ray.core.storage import StoragePath


def tensorboard_scalars(trial_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the trial folder's event files, as TensorBoard's own reader sees them: tag -> (step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(trial_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def epochs_in_metrics(trial_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What metrics.jsonl holds of each numeric epoch metric, as (epoch, value)."""
    by_metric: dict[str, list[tuple[int, float]]] = {}
    for row in runlog.read_epochs(trial_dir):
        for key in runlog.EPOCH_METRICS:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                by_metric.setdefault(key, []).append((row["epoch"], float(value)))
    return by_metric


def assert_tensorboard_holds_every_epoch(trial_dir: Path) -> None:
    scalars, logged = tensorboard_scalars(trial_dir), epochs_in_metrics(trial_dir)
    assert logged, f"{trial_dir} logged no epoch"
    for metric, rows in logged.items():
        seen = scalars.get(TUNE_TAG.format(metric))
        assert seen is not None, (trial_dir.name, metric, sorted(scalars))
        # A driver killed within a flush of a result leaves some of its scalars: the resume writes that epoch whole
        # again, the same points twice. A step with two values stays twice and fails.
        seen = sorted(set(seen))
        assert [step for step, _ in seen] == [epoch for epoch, _ in rows], (trial_dir.name, metric, seen, rows)
        assert [value for _, value in seen] == pytest.approx([value for _, value in rows], rel=1e-6), metric


class FakeTrial:
    """What the callback uses of a Tune Trial: its folder, and hashing by identity (a dict key)."""

    def __init__(self, path: Path):
        self.path, self.evaluated_params = str(path), {}


def epoch_row(epoch: int) -> dict:
    return {"epoch": epoch, "train_loss": 2.0 / epoch, "test_acc": 0.1 * epoch}


def test_a_resumed_session_fills_in_the_epochs_a_killed_driver_never_passed_on(tmp_path):
    """Session 1 passed epoch 1 on to TensorBoard, then its driver died after the training logged epoch 2; session 2
    passes on epoch 3: epoch 2 comes from metrics.jsonl, every epoch once, at step = epoch, in the trial's folder."""
    trial_dir = tmp_path / "live" / "t000"
    trial_dir.mkdir(parents=True)
    [first_session] = live_tensorboard(StoragePath.of(tmp_path / "live"))
    runlog.append_epoch(trial_dir, epoch_row(1))
    first_session.log_trial_result(2, FakeTrial(trial_dir), epoch_row(1) | {"timesteps_total": 1})
    wait_for(lambda: logged_epochs(trial_dir) == {1}, 5 * LIVE_FLUSH_S, "epoch 1 in the trial folder's event file")
    runlog.append_epoch(trial_dir, epoch_row(2))  # never reached the driver: it was killed

    [second_session] = live_tensorboard(StoragePath.of(tmp_path / "live"))
    trial = FakeTrial(trial_dir)
    runlog.append_epoch(trial_dir, epoch_row(3))
    second_session.log_trial_result(1, trial, epoch_row(3) | {"timesteps_total": 3})
    second_session.log_trial_end(trial)
    assert logged_epochs(trial_dir) == {1, 2, 3}
    assert_tensorboard_holds_every_epoch(trial_dir)
    assert len(list(trial_dir.glob("events.out.tfevents.*"))) == 2  # a file per session


def test_epochs_trained_while_no_driver_listened_are_filled_in_as_the_trial_ends(tmp_path):
    """A killed driver's slot went on and logged every epoch; the resumed trial reports none (its slot finds it
    trained) and ends: its end writes them, from metrics.jsonl."""
    trial_dir = tmp_path / "live" / "t000"
    trial_dir.mkdir(parents=True)
    for epoch in (1, 2):
        runlog.append_epoch(trial_dir, epoch_row(epoch))
    [session] = live_tensorboard(StoragePath.of(tmp_path / "live"))
    trial = FakeTrial(trial_dir)
    session.log_trial_start(trial)
    session.log_trial_end(trial)
    assert logged_epochs(trial_dir) == {1, 2}
    assert_tensorboard_holds_every_epoch(trial_dir)


def test_a_run_folder_at_a_uri_keeps_tunes_own_logger(tmp_path):
    assert live_tensorboard(StoragePath.of("s3://bucket/runs/live?endpoint_override=localhost:1")) == []


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_tensorboard_shows_every_epoch_as_it_arrives_and_after_a_killed_driver_resumes(tmp_path, capsys):
    sweep_file, storage = tmp_path / "live.yaml", tmp_path / "runs"
    sweep_file.write_text(
        "name: live\nbase: {dataset: synthetic, train_subset: 2048, test_subset: 256, width: 8, epochs: 3,\n"
        "       batch_size: 64, workers: 1, norm: none}\ngrid:\n  seed: [0, 1]\n"
    )
    run_dir = storage / "live"
    first, second = run_dir / "t000-seed=0", run_dir / "t001-seed=1"
    sweep = ["sweep", str(sweep_file), "--storage", str(storage), "--max-concurrent", "1"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "cifar_ray.cli", *sweep],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(runlog.read_epochs(first)) >= 1, 300, "epoch 1 of the first trial", driver)
        # Live: an epoch in metrics.jsonl is in the run folder's event files within seconds (Tune's own logger
        # copies them there every 10 s or more).
        wait_for(lambda: 1 in logged_epochs(first), 10, "epoch 1 in the run folder's TensorBoard files")
        wait_for(lambda: len(runlog.read_epochs(second)) >= 1, 300, "epoch 1 of the second trial", driver)
        # Its checkpoint too: killed before it, the resumed trial trains epoch 1 again, which then shows twice.
        checkpoint = second / CHECKPOINTS / epoch_folder(1) / CHECKPOINT_FILE
        wait_for(checkpoint.exists, 60, "epoch 1's checkpoint of the second trial", driver)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # at once: the driver and the local Ray it started, no state saved
        driver.wait()
    assert runlog.read_json(second / runlog.TRIAL_FILE)["status"] == "running"
    assert_tensorboard_holds_every_epoch(first)  # all of it there when the driver died

    assert main([*sweep, "--resume", "--json"]) == 0, capsys.readouterr().err
    run = runlog.load_run(run_dir)
    assert [t.status for t in run.trials] == ["finished", "finished"]
    for trial in run.trials:
        assert [row["epoch"] for row in trial.epochs] == [1, 2, 3]
        assert_tensorboard_holds_every_epoch(run_dir / trial.name)

    records = provenance.read_sessions(run_dir, run.sweep)
    assert [r["session"] for r in records] == [1, 2]  # one per session, the first kept
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(provenance.__file__).parent, capture_output=True)
    for record in records:
        assert record["git"]["commit"] == head.stdout.decode().strip()
        assert (run_dir / record["git"]["diff"]).exists()
        assert {"ray", "torch"} <= set(record["packages"])
        assert record["gpu"] == {"gpus": [], "why": "no CUDA GPU visible to the sweep's driver process"}
