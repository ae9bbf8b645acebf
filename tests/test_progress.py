"""The sweep's progress lines (the Tune callback), without running a sweep: fake Tune trials over real run logs."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from cifar_ray.cluster import progress
from cifar_ray.core import runlog, status
from cifar_ray.core.storage import StoragePath


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
    from cifar_ray.cluster.slots import STARTED

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
    assert [line.split("  ")[1] for line in printed[:2]] == ["epoch 1/2", "epoch 2/2"]
    assert printed[2:] == ["[1/1 done]"]  # where the sweep stands (this run folder has no sweep.json)


def test_a_diverged_epoch_marks_the_trial_diverged(tmp_path, printed):
    run_dir = StoragePath.of(tmp_path)
    trial = fake_trial(run_dir, epochs=5)
    runlog.append_epoch(run_dir / "t000-lr=0.1", epoch_row(1) | {"diverged": True})
    progress.progress_callback().on_trial_result(0, [], trial, epoch_row(1) | {"diverged": True})
    meta = runlog.read_json(run_dir / "t000-lr=0.1" / runlog.TRIAL_FILE)
    assert meta["status"] == "diverged" and meta["diverged_epoch"] == 1
    assert printed[0].endswith("DIVERGED")


def test_after_each_trial_ends_the_sweep_says_where_it_stands(tmp_path, printed):
    """The counting and the ETA of `cifar-ray status` (status.sweep_state): t000 ends at 30 s of wall time per
    epoch, t001's 2 epochs are left, one trial at a time: ETA 60 s."""
    run_dir, now = StoragePath.of(tmp_path), time.time()
    started_at = time.strftime(status.ISO_FORMAT, time.localtime(now - 60))
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": started_at})
    trial = fake_trial(run_dir, epochs=2)
    runlog.update_json(run_dir / "t000-lr=0.1" / runlog.TRIAL_FILE, started_unix=now - 60)
    for epoch, end in ((1, now - 30), (2, now)):
        runlog.append_epoch(run_dir / "t000-lr=0.1", epoch_row(epoch) | {"end_unix": end})
    other = {"name": "t001-lr=0.2", "swept": {"lr": 0.2}, "config": {"epochs": 2}}
    runlog.write_json(run_dir / other["name"] / runlog.TRIAL_FILE, other | {"status": "pending"})
    callback = progress.progress_callback()

    callback.on_trial_result(0, [], trial, epoch_row(2))
    assert re.fullmatch(r"\[1/2 done · 1 pending\] 6\d s elapsed · ETA ~60 s", printed[-1]), printed

    runlog.update_json(run_dir / other["name"] / runlog.TRIAL_FILE, status="failed", error="RuntimeError: boom")
    callback.on_trial_error(0, [], SimpleNamespace(config={"trial": other, "run_dir": run_dir}))
    assert printed[-2] == "t001-lr=0.2  FAILED: RuntimeError: boom"
    assert re.fullmatch(r"\[1/2 done · 1 failed\] 6\d s elapsed", printed[-1]), printed
