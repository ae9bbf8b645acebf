"""A trial's checkpoints: the newest complete one is chosen, by number; a folder a killed writer left holding only
a temp file is never chosen; the newest `keep` stay. On a disk and through a non-local filesystem alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from faults import FaultyFiles, faulty_storage

from cifar_ray.core.checkpoints import CHECKPOINT_FILE, CHECKPOINTS, epoch_folder, fetch_checkpoint, store_checkpoint
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
    folder = fetch_checkpoint(trial_dir, into)
    return None if folder is None else (folder / CHECKPOINT_FILE).read_text()


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
