"""The sweep's progress lines (the Tune callback), without running a sweep: fake Tune trials over real run logs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cifar_ray import progress, runlog
from cifar_ray.storage import StoragePath


@pytest.fixture
def printed(monkeypatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(progress, "progress_printer", [lines.append])
    return lines


def fake_trial(run_dir: StoragePath, epochs: int = 2, status: str = "running", logged: int = 0) -> SimpleNamespace:
    spec = {"name": "t000-lr=0.1", "swept": {"lr": 0.1}, "config": {"epochs": epochs}}
    runlog.write_json(run_dir / spec["name"] / runlog.TRIAL_FILE, spec | {"status": status})
    for epoch in range(1, logged + 1):
        runlog.append_epoch(run_dir / spec["name"], epoch_row(epoch))
    return SimpleNamespace(config={"trial": spec, "run_dir": run_dir})


def epoch_row(epoch: int) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 1.0,
        "train_acc": 0.5,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "epoch_time_s": 1.0,
        "samples_per_s": 100.0,
        "peak_mem_mb": 10.0,
        "diverged": False,
    }


def test_tune_adds_no_progress_printer_of_its_own():
    """Tune's default TrialProgressCallback printed `Trial ... completed. Last result:` during --resume, even
    with verbose=0; it is added only when no TrialProgressCallback is among the callbacks."""
    from ray.tune.progress_reporter import TrialProgressCallback
    from ray.tune.utils.callback import _create_default_callbacks

    ours = progress.progress_callback()
    callbacks = _create_default_callbacks([ours], metric=None)
    assert [c for c in callbacks if isinstance(c, TrialProgressCallback)] == [ours]


def test_a_trial_start_says_whether_it_starts_or_continues(tmp_path, printed):
    run_dir = StoragePath.of(tmp_path)
    callback = progress.progress_callback()
    callback.on_trial_start(0, [], fake_trial(run_dir))
    callback.on_trial_start(0, [], fake_trial(run_dir, epochs=3, logged=1))
    callback.on_trial_start(0, [], fake_trial(run_dir, status="finished", logged=2))  # run_trial returns at once
    assert printed == ["t000-lr=0.1  starts  lr=0.1", "t000-lr=0.1  continues after epoch 1/3  lr=0.1"]


def test_a_warm_trial_starts_when_its_slot_takes_it_not_when_tune_starts_it(tmp_path, printed):
    from cifar_ray.slots import STARTED

    run_dir = StoragePath.of(tmp_path)
    callback = progress.progress_callback(warm=True)
    trial = fake_trial(run_dir, epochs=3, logged=1)
    callback.on_trial_start(0, [], trial)
    assert printed == []
    callback.on_trial_result(0, [], trial, {STARTED: 1})
    assert printed == ["t000-lr=0.1  continues after epoch 1/3  lr=0.1"]


def test_the_last_epochs_result_marks_the_trial_finished(tmp_path, printed):
    """A sweep interrupted while the workers shut down (after the last epoch was logged and checkpointed)
    keeps the trial as finished, not `running 2/2`."""
    run_dir = StoragePath.of(tmp_path)
    trial = fake_trial(run_dir, epochs=2, logged=1)
    callback = progress.progress_callback()
    callback.on_trial_result(0, [], trial, epoch_row(1))
    assert runlog.read_json(run_dir / "t000-lr=0.1" / runlog.TRIAL_FILE)["status"] == "running"
    runlog.append_epoch(run_dir / "t000-lr=0.1", epoch_row(2))
    callback.on_trial_result(0, [], trial, epoch_row(2))
    meta = runlog.read_json(run_dir / "t000-lr=0.1" / runlog.TRIAL_FILE)
    assert meta["status"] == "finished" and meta["finished_at"] and meta["diverged_epoch"] is None
    assert [line.split("  ")[1] for line in printed] == ["epoch 1/2", "epoch 2/2"]


def test_a_diverged_epoch_marks_the_trial_diverged(tmp_path, printed):
    run_dir = StoragePath.of(tmp_path)
    trial = fake_trial(run_dir, epochs=5)
    runlog.append_epoch(run_dir / "t000-lr=0.1", epoch_row(1) | {"diverged": True})
    progress.progress_callback().on_trial_result(0, [], trial, epoch_row(1) | {"diverged": True})
    meta = runlog.read_json(run_dir / "t000-lr=0.1" / runlog.TRIAL_FILE)
    assert meta["status"] == "diverged" and meta["diverged_epoch"] == 1
    assert printed[0].endswith("DIVERGED")
