"""A trial's checkpoints in its own folder, on a disk or in a bucket:

    <trial>/checkpoints/epoch-0003/state.pt     the state after epoch 3 (training.state.save_checkpoint's file)
    <trial>/checkpoints/epoch-10000/state.pt    the number grows past four digits; it is read as a number

state.pt is written whole or not at all (StoragePath.write_bytes: a temp file renamed over it on a disk, one PUT
in an object store), so a checkpoint is complete when its folder holds state.pt. A worker killed while writing
leaves `epoch-N/` with a temp file only: it is never chosen, and it is removed once a later epoch is stored. The
newest complete checkpoint, by number, is the one a restart or `--resume` continues from; one that does not load
(its file damaged after it was stored) is passed over for the one before (training.state.resume_newest).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import StorageError
from .storage import StoragePath, read_retrying

CHECKPOINTS = "checkpoints"  # in the trial's folder
# A trial none of whose checkpoints loads starts again from epoch 1, once: they are moved here, kept, never deleted.
UNLOADABLE = "checkpoints.unloadable"
CHECKPOINT_FILE = "state.pt"  # one epoch's state, written by training.state.save_checkpoint
EPOCH_FOLDER = re.compile(r"epoch-(\d+)")  # only folders of this form are ours to choose or delete


def epoch_folder(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def _epoch_folders(checkpoints: StoragePath) -> list[tuple[int, str, bool]]:
    """(epoch, folder name, complete) of every checkpoint folder, oldest first by number."""
    found = []
    for name in checkpoints.subfolders():
        match = EPOCH_FOLDER.fullmatch(name)
        if match:
            found.append((int(match.group(1)), name, (checkpoints / name / CHECKPOINT_FILE).exists()))
    return sorted(found)


def store_checkpoint(trial_dir: StoragePath, folder: Path, epoch: int, keep: int) -> None:
    """The epoch's checkpoint (training.state.save_checkpoint's folder) into the trial's folder. Then the newest `keep`
    complete ones stay; an incomplete folder of an earlier epoch (its writer was killed) goes, a later one stays
    (epochs are stored in order: its writer may still come to it)."""
    checkpoints = trial_dir / CHECKPOINTS
    (checkpoints / epoch_folder(epoch) / CHECKPOINT_FILE).write_bytes((folder / CHECKPOINT_FILE).read_bytes())
    folders = _epoch_folders(checkpoints)
    complete = [name for _, name, whole in folders if whole]
    stale = complete[:-keep] + [name for number, name, whole in folders if not whole and number < epoch]
    for name in stale:
        (checkpoints / name).delete_dir()


def complete_checkpoints(trial_dir: StoragePath, upto: int | None = None) -> list[int]:
    """The epochs of the trial's complete checkpoints, newest first; with `upto`, those at or before it only."""
    epochs = [number for number, _, whole in _epoch_folders(trial_dir / CHECKPOINTS) if whole]
    return [epoch for epoch in reversed(epochs) if upto is None or epoch <= upto]


def fetch_checkpoint(trial_dir: StoragePath, into: Path, epoch: int) -> Path:
    """The trial's checkpoint of `epoch` as a state.load_checkpoint folder: `into`."""
    stored = trial_dir / CHECKPOINTS / epoch_folder(epoch) / CHECKPOINT_FILE
    state = read_retrying(stored, bytes, None)  # a read that fails for a while is read again, never given up at once
    if state is None:
        raise StorageError(f"cannot read {stored}: it was listed as a complete checkpoint, then was gone")
    (into / CHECKPOINT_FILE).write_bytes(state)
    return into


def can_set_aside(trial_dir: StoragePath) -> bool:
    """Whether the trial's checkpoints can be moved aside to UNLOADABLE: a folder on a disk (a rename) where none
    were moved aside before."""
    return trial_dir.is_local and not (trial_dir / UNLOADABLE).exists()


def set_aside(trial_dir: StoragePath) -> None:
    """The trial's checkpoints moved to UNLOADABLE (can_set_aside said it may)."""
    folder = Path(trial_dir.path)
    os.rename(folder / CHECKPOINTS, folder / UNLOADABLE)
