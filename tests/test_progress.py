"""The sweep's progress lines (the Tune callback), without running a sweep: fake Tune trials over real run logs."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from cifar_ray.cluster import progress
from cifar_ray.cluster.dispatcher import tune_trial
from cifar_ray.cluster.slots import STARTED
from cifar_ray.core import runlog, status
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.storage import StoragePath
from cifar_ray.core.sweep import TrialSpec


@pytest.fixture
def printed(monkeypatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(progress, "progress_printer", [lines.append])
    return lines


def fake_trial(run_dir: StoragePath, epochs: int = 2, status: str = "running", logged: int = 0) -> SimpleNamespace:
    trial = TrialSpec(0, "t000-lr=0.1", {"lr": 0.1}, TrainConfig(lr=0.1, epochs=epochs))
    runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": status})
    for epoch in range(1, logged + 1):
        runlog.append_epoch(run_dir / trial.name, epoch_row(epoch))
    return SimpleNamespace(config={"trial": tune_trial(trial, run_dir)})


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


def test_a_trial_starts_when_its_slot_takes_it_not_when_tune_starts_it(tmp_path, printed):
    run_dir = StoragePath.of(tmp_path)
    callback = progress.progress_callback()
    trial = fake_trial(run_dir, epochs=3, logged=1)
    callback.on_trial_start(0, [], trial)
    assert printed == []
    callback.on_trial_result(0, [], trial, {STARTED: 0})
    callback.on_trial_result(0, [], trial, {STARTED: 1})
    assert printed == ["t000-lr=0.1  starts  lr=0.1", "t000-lr=0.1  continues after epoch 1/3  lr=0.1"]


def test_the_progress_callback_only_prints(tmp_path, printed):
    """The Dispatcher alone writes run state: every event the callback gets, a trial's last epoch and a
    diverged one included, leaves the run folder byte for byte as it was."""
    run_dir = StoragePath.of(tmp_path)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "p", "started_at": runlog.now_iso()})
    trial = fake_trial(run_dir, epochs=2, logged=2)
    before = folder_bytes(tmp_path)
    callback = progress.progress_callback()
    callback.on_trial_start(0, [], trial)
    callback.on_trial_result(0, [], trial, {STARTED: 0})
    callback.on_trial_result(0, [], trial, epoch_row(1))
    callback.on_trial_result(0, [], trial, epoch_row(2))
    callback.on_trial_result(0, [], trial, epoch_row(2) | {"diverged": True})
    callback.on_trial_error(0, [], trial)
    callback.on_trial_complete(0, [], trial)
    assert folder_bytes(tmp_path) == before
    assert [line.split("  ")[1] for line in printed if "  epoch " in line] == ["epoch 1/2", "epoch 2/2", "epoch 2/2"]


def folder_bytes(root) -> dict:
    return {str(path): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


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
    runlog.record_outcome(run_dir / "t000-lr=0.1")  # as the Dispatcher does before the last epoch's news
    other = TrialSpec(1, "t001-lr=0.2", {"lr": 0.2}, TrainConfig(lr=0.2, epochs=2))
    runlog.write_json(run_dir / other.name / runlog.TRIAL_FILE, other.as_dict() | {"status": "pending"})
    callback = progress.progress_callback()

    callback.on_trial_result(0, [], trial, epoch_row(2))
    assert re.fullmatch(r"\[1/2 done · 1 pending\] 6\d s elapsed · ETA ~60 s", printed[-1]), printed

    runlog.update_json(run_dir / other.name / runlog.TRIAL_FILE, status="failed", error="RuntimeError: boom")
    callback.on_trial_error(0, [], SimpleNamespace(config={"trial": tune_trial(other, run_dir)}))
    assert printed[-2] == "t001-lr=0.2  FAILED: RuntimeError: boom"
    assert re.fullmatch(r"\[1/2 done · 1 failed\] 6\d s elapsed", printed[-1]), printed
