"""The live view: TensorBoard event files in each trial's folder, an epoch at a time, filled in from metrics.jsonl after
a killed driver. A real sweep's (live, across a killed driver and --resume): test_reliability.py."""

from __future__ import annotations

from pathlib import Path

from helpers import assert_tensorboard_holds_every_epoch, tensorboard_scalars, wait_for

from cifar_ray.cluster.live_view import LIVE_FLUSH_S, fill_in_ended, live_tensorboard, logged_epochs
from cifar_ray.core import runlog
from cifar_ray.core.storage import StoragePath

WRITTEN_S = 60  # the longest wait for the writer's thread to write its file: a hang, not a slow machine


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
    first = FakeTrial(trial_dir)
    first_session.log_trial_result(2, first, epoch_row(1) | {"timesteps_total": 1})
    # Live: the thread that writes the file writes every LIVE_FLUSH_S (Tune's own: every 30 s). The interval is
    # checked, not timed; the file is waited for (the deadline bounds a hang, not a speed).
    assert first_session._trial_writer[first].file_writer.event_writer._worker._flush_secs == LIVE_FLUSH_S
    wait_for(lambda: logged_epochs(trial_dir) == {1}, WRITTEN_S, "epoch 1 in the trial folder's event file")
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


def test_a_resume_fills_in_the_trials_it_will_not_train_and_writes_no_epoch_twice(tmp_path):
    """A trial that ended (finished or diverged) while its driver was being killed is not trained again, so no
    result of it reaches the live view: its event file missed epochs for good, or was cut mid-record. The resume
    fills each one in from metrics.jsonl before its trials start (fill_in_ended), once: a second resume writes
    nothing; and an epoch retrained after a checkpoint fallback is not written a second time."""
    run_dir = tmp_path / "live"
    ended, cut = run_dir / "t000", run_dir / "t001"
    for trial_dir in (ended, cut):
        trial_dir.mkdir(parents=True)
        runlog.append_epoch(trial_dir, epoch_row(1))
    assert fill_in_ended(StoragePath.of(run_dir), ["t000", "t001"]) == 2
    for trial_dir in (ended, cut):
        for epoch in (2, 3):
            runlog.append_epoch(trial_dir, epoch_row(epoch))  # the last epochs the dying driver never passed on
    [events] = cut.glob("events.out.tfevents.*")
    events.write_bytes(events.read_bytes()[:-7])  # cut mid-record by the kill: epoch 1 is no longer whole
    assert logged_epochs(cut) == set()
    assert fill_in_ended(StoragePath.of(run_dir), ["t000", "t001"]) == 2 + 3
    assert fill_in_ended(StoragePath.of(run_dir), ["t000", "t001"]) == 0
    for trial_dir in (ended, cut):
        assert logged_epochs(trial_dir) == {1, 2, 3}
        assert_tensorboard_holds_every_epoch(trial_dir)

    [session] = live_tensorboard(StoragePath.of(run_dir))
    trial = FakeTrial(ended)
    session.log_trial_start(trial)
    session.log_trial_result(1, trial, epoch_row(3) | {"timesteps_total": 3})  # epoch 3 again, from a fallback
    session.log_trial_end(trial)
    assert_tensorboard_holds_every_epoch(ended)
    assert sorted(step for step, _ in tensorboard_scalars(ended)["ray/tune/test_acc"]) == [1, 2, 3]
