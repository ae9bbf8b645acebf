"""A trial's checkpoints: the newest complete one is chosen, by number; a folder a killed writer left holding only
a temp file is never chosen; the newest `keep` stay. On a disk and through a non-local filesystem alike. A stored
checkpoint that does not load (cut in half) is passed over for the one before; when none loads the trial starts again
from epoch 1, once."""

from __future__ import annotations

from pathlib import Path

import pytest
from faults import FaultyFiles, faulty_storage

from cifar_ray.core import runlog
from cifar_ray.core.checkpoints import (
    CHECKPOINT_FILE,
    CHECKPOINTS,
    UNLOADABLE,
    complete_checkpoints,
    epoch_folder,
    fetch_checkpoint,
    store_checkpoint,
)
from cifar_ray.core.run import RunFolder
from cifar_ray.core.storage import StoragePath


@pytest.fixture(params=["local", "pyarrow"])
def trial_dir(request, tmp_path) -> StoragePath:
    if request.param == "local":
        return StoragePath.of(tmp_path / "runs" / "t000")
    return faulty_storage(tmp_path / "runs", FaultyFiles(tmp_path / "faults", share=0.0)) / "t000"


def saved(tmp_path: Path, epoch: int) -> Path:
    """state.save_checkpoint's folder, its state naming the epoch."""
    folder = tmp_path / "scratch" / str(epoch)
    folder.mkdir(parents=True)
    (folder / CHECKPOINT_FILE).write_bytes(f"state of epoch {epoch}".encode())
    return folder


def fetched(trial_dir: StoragePath, tmp_path: Path) -> str | None:
    into = tmp_path / "fetched"
    into.mkdir(exist_ok=True)
    epochs = complete_checkpoints(trial_dir)
    return (fetch_checkpoint(trial_dir, into, epochs[0]) / CHECKPOINT_FILE).read_text() if epochs else None


def cut_short(trial_dir: StoragePath, epoch: int) -> Path:
    """The folder a worker killed while writing epoch's state leaves: a temp file only."""
    folder = Path(trial_dir.path) / CHECKPOINTS / epoch_folder(epoch)
    folder.mkdir(parents=True)
    (folder / f"{CHECKPOINT_FILE}abc123.tmp").write_bytes(b"half a sta")
    return folder


def test_the_newest_complete_checkpoint_is_chosen_never_one_cut_short(trial_dir, tmp_path):
    assert fetched(trial_dir, tmp_path) is None
    store_checkpoint(trial_dir, saved(tmp_path, 1), 1, keep=2)
    store_checkpoint(trial_dir, saved(tmp_path, 2), 2, keep=2)
    torn = cut_short(trial_dir, 3)
    assert fetched(trial_dir, tmp_path) == "state of epoch 2"
    store_checkpoint(trial_dir, saved(tmp_path, 3), 3, keep=2)  # the restarted trial writes epoch 3 again
    assert fetched(trial_dir, tmp_path) == "state of epoch 3"
    assert sorted(path.name for path in torn.iterdir()) == [CHECKPOINT_FILE, f"{CHECKPOINT_FILE}abc123.tmp"]


def test_past_epoch_9999_the_order_is_numeric_and_the_newest_keep_stay(trial_dir, tmp_path):
    for epoch in (9998, 9999, 10000, 10001):
        store_checkpoint(trial_dir, saved(tmp_path, epoch), epoch, keep=2)
    assert (trial_dir / CHECKPOINTS).subfolders() == ["epoch-10000", "epoch-10001"]
    assert fetched(trial_dir, tmp_path) == "state of epoch 10001"


@pytest.mark.parametrize("keep", [1, 3])
def test_keep_leaves_the_newest_complete_ones_and_removes_only_stale_folders_of_ours(trial_dir, tmp_path, keep):
    checkpoints = Path(trial_dir.path) / CHECKPOINTS
    stale = cut_short(trial_dir, 2)  # a killed writer's, older than what is stored next: removed
    ahead = cut_short(trial_dir, 9)  # later than the epochs stored: its epoch is still to be written
    (checkpoints / "mine").mkdir()  # not a checkpoint folder: never ours to delete
    for epoch in (3, 4, 5, 6):
        store_checkpoint(trial_dir, saved(tmp_path, epoch), epoch, keep=keep)
    assert not stale.exists() and ahead.exists() and (checkpoints / "mine").exists()
    complete = [f"epoch-{epoch:04d}" for epoch in (3, 4, 5, 6)][-keep:]
    assert (trial_dir / CHECKPOINTS).subfolders() == sorted([*complete, ahead.name, "mine"])
    assert fetched(trial_dir, tmp_path) == "state of epoch 6"


def test_a_checkpoint_that_cannot_be_read_for_a_while_is_read_again(tmp_path, monkeypatch):
    """A storage timeout while a restarted trial fetches its checkpoint failed the attempt (the fault-injection
    sweep lost a trial to it): the read is retried like every other run-file read."""
    from cifar_ray.core import storage

    monkeypatch.setattr(storage, "RETRY_S", 0.0)
    handler = FaultyFiles(tmp_path / "faults", share=0.0)
    trial_dir = faulty_storage(tmp_path / "runs", handler) / "t000"
    store_checkpoint(trial_dir, saved(tmp_path, 1), 1, keep=2)
    handler.share, handler.burst = 1.0, 2  # the next read fails twice, then works
    assert fetched(trial_dir, tmp_path) == "state of epoch 1"


def trained_checkpoints(trial_dir: StoragePath, tmp_path: Path, epochs: int):
    """A tiny model's real checkpoints of epochs 1..`epochs` stored in the trial's folder, each epoch logged as
    training logs it; returns (the config, the weights after each epoch)."""
    import torch

    from cifar_ray.training import loop
    from cifar_ray.training.check_runs import make_config
    from cifar_ray.training.distributed import Worker
    from cifar_ray.training.models import build_model
    from cifar_ray.training.state import save_checkpoint

    cfg, weights = make_config(), {}
    training = loop.build_training(cfg, build_model(cfg), 4, Worker.single(torch.device("cpu")))
    for epoch in range(1, epochs + 1):
        with torch.no_grad():
            for parameter in training.raw_model.parameters():
                parameter.add_(0.01)
        weights[epoch] = [p.detach().clone() for p in training.raw_model.parameters()]
        folder = tmp_path / "scratch" / f"real-{epoch}"
        folder.mkdir(parents=True)
        save_checkpoint(folder, epoch, training)
        runlog.append_epoch(trial_dir, {"epoch": epoch})
        store_checkpoint(trial_dir, folder, epoch, keep=2)
    return cfg, weights


def cut_in_half(trial_dir: StoragePath, epoch: int) -> None:
    stored = Path(trial_dir.path) / CHECKPOINTS / epoch_folder(epoch) / CHECKPOINT_FILE
    data = stored.read_bytes()
    stored.write_bytes(data[: len(data) // 2])


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before_and_none_loading_starts_again_once(
    trial_dir, tmp_path
):
    """None loading: on a disk the trial starts again from epoch 1 at once, its checkpoints kept aside, a note saying
    why (the first --resume failed it, and only a second restarted it); should its new ones not load either, or in an
    object store (no rename), it fails, naming each checkpoint and why."""
    import torch

    from cifar_ray.training import loop
    from cifar_ray.training.distributed import Worker
    from cifar_ray.training.models import build_model
    from cifar_ray.training.state import NoCheckpointLoadsError, resume_newest

    cfg, weights = trained_checkpoints(trial_dir, tmp_path, 3)
    cpu, notes = torch.device("cpu"), []

    def fresh():
        return loop.build_training(cfg, build_model(cfg), 4, Worker.single(cpu))

    training = fresh()
    assert resume_newest(trial_dir, training, Worker.single(cpu), note=notes.append) == 3 and notes == []
    cut_in_half(trial_dir, 3)
    training = fresh()
    assert resume_newest(trial_dir, training, Worker.single(cpu), note=notes.append) == 2
    assert all(torch.equal(a, b) for a, b in zip(training.raw_model.parameters(), weights[2]))
    [line] = notes
    assert line.startswith("checkpoint epoch-0003 (RuntimeError: ") and line.endswith(
        "does not load: continues from epoch-0002"
    )
    cut_in_half(trial_dir, 2)
    if trial_dir.is_local:
        assert resume_newest(trial_dir, fresh(), Worker.single(cpu), note=notes.append) == 0
        assert notes[1].startswith("no checkpoint of t000 loads: epoch-0003 (RuntimeError: ")
        assert notes[1].endswith(f": starts again from epoch 1, its checkpoints kept in {UNLOADABLE}/")
        kept = Path(trial_dir.path) / UNLOADABLE
        assert sorted(p.name for p in kept.iterdir()) == ["epoch-0002", "epoch-0003"]
        assert not (trial_dir / CHECKPOINTS).exists()
        trained_checkpoints(trial_dir, tmp_path / "again", 1)  # its new checkpoint does not load either
        cut_in_half(trial_dir, 1)
    with pytest.raises(NoCheckpointLoadsError) as failed:
        resume_newest(trial_dir, fresh(), Worker.single(cpu), note=notes.append)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("no checkpoint of t000 loads: epoch-000")
    assert "(RuntimeError: " in message and len(notes) == (2 if trial_dir.is_local else 1)


def test_a_checkpoint_after_the_last_logged_epoch_is_not_resumed_from(trial_dir, tmp_path):
    """metrics.jsonl's last line cut (epoch 3 lost): the trial resumes from epoch 2's checkpoint and trains epoch 3
    again, rather than from epoch 3's and never log it."""
    import torch

    from cifar_ray.training import loop
    from cifar_ray.training.distributed import Worker
    from cifar_ray.training.models import build_model
    from cifar_ray.training.state import resume_newest

    cfg, _ = trained_checkpoints(trial_dir, tmp_path, 3)
    log = Path(trial_dir.path) / runlog.EPOCHS_FILE
    log.write_text(log.read_text()[:-5])  # the last line cut short
    assert [row["epoch"] for row in runlog.read_epochs(trial_dir)] == [1, 2]
    cpu = torch.device("cpu")
    assert (
        resume_newest(trial_dir, loop.build_training(cfg, build_model(cfg), 4, Worker.single(cpu)), Worker.single(cpu))
        == 2
    )


def test_resume_trains_again_a_finished_trial_that_lost_an_epochs_line_and_no_other_finished_one(tmp_path):
    from cifar_ray.cluster.slots import plan_slots
    from cifar_ray.core.sweep import build_plan

    plan = build_plan({"name": "cut", "base": {"dataset": "synthetic", "epochs": 2}, "grid": {"seed": [0, 1, 2]}})
    run_dir = StoragePath.of(tmp_path / "cut")
    for trial, (status, logged) in zip(plan.trials, [("finished", 2), ("finished", 1), ("diverged", 1)]):
        runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": status})
        for epoch in range(1, logged + 1):
            runlog.append_epoch(run_dir / trial.name, {"epoch": epoch})
    capacity = {"per_node": [{"CPU": 2.0, "memory": 8e9}]}
    slot_plan = plan_slots(plan, RunFolder(run_dir), capacity, max_concurrent=None, one_trial=False)
    assert [spec.name for spec in slot_plan.specs] == [plan.trials[1].name]  # incomplete: trained again


def test_why_a_checkpoint_does_not_load_is_its_first_sentence_whole():
    """torch's zip error is 300 characters: it was cut at 200, mid-sentence, in the trial's notes."""
    from cifar_ray.training.state import first_sentence

    torch_says = (
        "PytorchStreamReader failed reading zip archive: failed finding central directory. This is an internal "
        "miniz error. If you are seeing this error, there is a high likelihood that your checkpoint file is corrupted"
    )
    assert (
        first_sentence(torch_says)
        == "PytorchStreamReader failed reading zip archive: failed finding central directory."
    )
    assert first_sentence("no dot " * 50) == ("no dot " * 50)[:199] + "…"
