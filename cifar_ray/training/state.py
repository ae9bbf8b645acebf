"""A trial's state between epochs: what trains the model (Training) and its checkpoints (model, optimizer,
schedule, scaler, PowerSGD) with each rank's random state, saved so that a resumed trial continues
as if it had never stopped."""

from __future__ import annotations

import logging
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core import runlog
from ..core.checkpoints import (
    CHECKPOINT_FILE,
    UNLOADABLE,
    can_set_aside,
    complete_checkpoints,
    epoch_folder,
    fetch_checkpoint,
    set_aside,
)
from ..core.storage import StoragePath
from . import comm
from .distributed import Worker, barrier, rank_seed

logger = logging.getLogger(__name__)


@dataclass
class Training:
    """What trains a model: as built (`raw_model`, for state and evaluation) and as run (`model`:
    wrapped for DDP/DP, compiled), with its optimizer, schedule, scaler and loss."""

    raw_model: nn.Module
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    criterion: nn.Module


class CheckpointError(RuntimeError):
    """A checkpoint that must not be loaded: the message is one line, fit to print as is."""


class NoCheckpointLoadsError(CheckpointError):
    """Not one of a trial's stored checkpoints loads, and they were set aside once before (or cannot be: an object
    store): the trial fails with this line, not retried (each attempt would find the same files)."""


def rng_state(*devices: torch.device) -> dict[str, torch.Tensor | list[torch.Tensor] | None]:
    """This rank's random state: the CPU generator and the generator of each of its GPUs (dropout draws
    from them; a dp worker's replicas draw on each of its GPUs). CPU ByteTensors, as torch returns them."""
    cuda = [torch.cuda.get_rng_state(device) for device in devices if device.type == "cuda"]
    return {"cpu": torch.get_rng_state(), "cuda": cuda or None}


def restore_rng_state(saved: list[dict] | None, rank: int, world: int, seed: int, devices: list[torch.device]) -> None:
    """Give this rank its own saved random state back (each rank's, on its own GPUs: another rank's
    GPU list can be longer than this node has). Saved by another number of workers: this rank's
    stream restarts from rank_seed, as in a fresh run. GPUs beyond those saved keep build_training's seed."""
    if not saved or len(saved) != world:
        logger.warning(
            "random state saved by %d workers, resumed on %d: dropout streams restart from the seed",
            len(saved or []),
            world,
        )
        torch.manual_seed(rank_seed(seed, rank))
        return
    torch.set_rng_state(saved[rank]["cpu"])
    gpus = [device for device in devices if device.type == "cuda"]
    for device, state in zip(gpus, saved[rank]["cuda"] or [], strict=False):
        torch.cuda.set_rng_state(state, device)


def save_checkpoint(
    folder: Path, epoch: int, training: Training, comm_states=None, rng_states: list[dict] | None = None
) -> None:
    """Everything needed to continue `training` after `epoch` as if never stopped. `comm_states` and
    `rng_states` hold every rank's PowerSGD and random state (gathered to rank 0; one process: None takes
    its own)."""
    state = {
        "epoch": epoch,
        "model": training.raw_model.state_dict(),
        "optimizer": training.optimizer.state_dict(),
        "scheduler": training.scheduler.state_dict(),
        "scaler": training.scaler.state_dict(),
        "rng": rng_states if rng_states is not None else [rng_state()],
        "comm": comm_states,  # PowerSGD state of every rank (comm.gather_hook_state), else None
    }
    torch.save(state, folder / CHECKPOINT_FILE)


def match_parameter_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Give every optimizer state tensor shaped like its parameter the parameter's strides. A checkpoint's
    buffers keep the layout they were saved in (contiguous from a CPU run before CPU runs took channels_last)
    while the parameters take loop.MEMORY_FORMAT; load_state_dict moves them without changing their strides,
    and the fused and foreach kernels refuse tensor lists of mismatched strides."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape and value.stride() != param.stride():
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


# How an optimizer runs, not what it computes: set by build_optimizer for the device it runs on (fused on CUDA).
IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")


def with_built_implementation(saved: dict, optimizer: torch.optim.Optimizer) -> dict:
    """`saved` (an optimizer's state_dict) with each param group's IMPLEMENTATION_KEYS as `optimizer` was built:
    load_state_dict takes every group setting from the checkpoint, so a CPU checkpoint resumed on CUDA turned
    fused=True off. Set before loading, so that torch places each state's `step` as the fused kernels need."""
    groups = [
        saved_group | {key: group[key] for key in IMPLEMENTATION_KEYS if key in group}
        for saved_group, group in zip(saved["param_groups"], optimizer.param_groups)
    ]
    return saved | {"param_groups": groups}


def load_checkpoint(folder: Path, training: Training, worker: Worker, seed: int = 0) -> int:
    """Restore a save_checkpoint folder into `training` (its PowerSGD state too, where its model has one) on
    `worker` (its rank's random state, on each of its devices: a dp worker's GPUs each have one); returns the last
    finished epoch. weights_only: a checkpoint in shared storage is data, never code
    (torch refuses anything but tensors and plain containers). Loaded to the CPU: the random states (the
    generators' ByteTensors, PowerSGD's numpy keys) must stay there, and each load_state_dict below moves
    its own tensors to where the model lives (parameters, optimizer state, PowerSGD memories)."""
    try:
        state = torch.load(folder / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"refused to load checkpoint {folder / CHECKPOINT_FILE}: it holds more than tensors "
            f"and plain data ({first})"
        ) from None
    training.raw_model.load_state_dict(state["model"])
    training.optimizer.load_state_dict(with_built_implementation(state["optimizer"], training.optimizer))
    match_parameter_layouts(training.optimizer)
    training.scheduler.load_state_dict(state["scheduler"])
    training.scaler.load_state_dict(state["scaler"])
    comm.restore_hook_state(
        comm.hook_state(training.model), state.get("comm"), worker.rank, worker.world, worker.device
    )
    restore_rng_state(state.get("rng"), worker.rank, worker.world, seed, worker.devices)
    return state["epoch"]


def first_sentence(text: str, limit: int = 200) -> str:
    """`text` up to the end of its first sentence, whole: torch's zip error goes on for 300 characters of advice."""
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def resume_newest(
    trial_dir: StoragePath,
    training: Training,
    worker: Worker,
    seed: int = 0,
    note: Callable[[str], None] | None = None,
) -> int:
    """Restore the trial's newest stored checkpoint that loads into `training`; returns its epoch, 0 when the trial
    has none (it starts afresh). Only checkpoints at or before the last epoch in metrics.jsonl count: one after it
    (that epoch's line was cut) would leave the epoch out of the log for good. A checkpoint that cannot be read or
    loaded (cut short, corrupt) is passed over for the one before, and `note` is told so in one line. When none
    loads, the trial starts again from epoch 1 (returns 0) with its checkpoints set aside, `note` told why; when
    they were set aside before, or cannot be, NoCheckpointLoadsError names each and why."""
    logged = runlog.read_epochs(trial_dir)
    passed_over = []
    for epoch in complete_checkpoints(trial_dir, logged[-1]["epoch"] if logged else 0):
        with tempfile.TemporaryDirectory() as scratch:
            try:
                folder = fetch_checkpoint(trial_dir, Path(scratch), epoch)
                done = load_checkpoint(folder, training, worker, seed)
            except torch.OutOfMemoryError:
                raise  # the device's trouble, not the file's
            except Exception as error:  # any way this file fails to load: the one before may load
                reason = first_sentence((str(error).strip().splitlines() or [type(error).__name__])[0])
                passed_over.append(f"{epoch_folder(epoch)} ({type(error).__name__}: {reason})")
                continue
        if passed_over:
            line = f"checkpoint {'; '.join(passed_over)} does not load: continues from {epoch_folder(epoch)}"
            logger.warning("%s: %s", trial_dir, line)
            if note is not None:
                note(line)
        return done
    if not passed_over:
        return 0
    unloadable = f"no checkpoint of {trial_dir.name} loads: {'; '.join(passed_over)}"
    if not can_set_aside(trial_dir):  # every rank sees the same: rank 0 moves them only after the barrier
        raise NoCheckpointLoadsError(unloadable)
    barrier()  # every rank has read the checkpoints before rank 0 moves them
    if worker.rank == 0:
        set_aside(trial_dir)
    line = f"{unloadable}: starts again from epoch 1, its checkpoints kept in {UNLOADABLE}/"
    logger.warning("%s: %s", trial_dir, line)
    if note is not None:
        note(line)
    return 0
