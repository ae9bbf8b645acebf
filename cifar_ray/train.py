"""The training loop every Ray Train worker runs: read `train_loop_per_worker` top to bottom.

Semantics (tests/test_equivalence.py proves them):
- `batch_size` is the global micro-batch: each of W workers takes batch_size/W samples per step;
- `accum_steps` micro-batches form one optimizer step: each micro-batch loss is scaled by
  1/accum_steps, DDP all-reduces only on the last micro-batch (`no_sync` on the others), so the
  step equals one of batch_size x accum_steps samples (up to batch-norm statistics);
- train metrics are sums over all ranks (all_reduce), test metrics cover the whole test set.
"""

from __future__ import annotations

import contextlib
import math
import resource
import tempfile
import time
from pathlib import Path
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from . import runlog, sysinfo
from .config import TrainConfig
from .data import Split, iterate_train, load_splits, normalise, test_shard
from .models import build_model
from .optim import build_optimizer, build_scheduler

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
EVAL_BATCH = 1000


def peak_memory_mb(device: torch.device) -> float:
    """GPU: peak bytes allocated by torch since the last reset. CPU: peak RSS of this process."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=op)
    return tensor


def wrap_model(model: nn.Module, cfg: TrainConfig, device: torch.device, world: int) -> nn.Module:
    if cfg.strategy == "dp" and device.type == "cuda" and cfg.workers > 1:
        return nn.DataParallel(model, device_ids=list(range(cfg.workers)))
    if cfg.strategy == "ddp" and world > 1:
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model  # one process, one device: nothing to synchronise


def train_epoch(
    model: nn.Module,
    steps: Iterable[list[tuple[torch.Tensor, torch.Tensor]]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    scaler: torch.amp.GradScaler,
    criterion: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
) -> torch.Tensor:
    """One pass over this rank's steps. Returns this rank's [loss sum, correct, samples, skipped
    steps] as a device tensor: no .item() per step, one host sync per epoch."""
    model.train()
    totals = torch.zeros(4, device=device, dtype=torch.float64)
    autocast = torch.autocast(device.type, dtype=AMP_DTYPES.get(cfg.amp, torch.float32), enabled=cfg.amp != "off")
    for micro_batches in steps:
        for i, (images, labels) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            # Skip DDP's all-reduce on all but the last micro-batch of the accumulation window.
            sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                with autocast:
                    logits = model(images)
                    loss = criterion(logits, labels)
                scaler.scale(loss / len(micro_batches)).backward()
            totals[0] += loss.detach().double() * len(labels)
            totals[1] += (logits.argmax(1) == labels).sum()
            totals[2] += len(labels)
        if scaler.is_enabled():
            scale_before = scaler.get_scale()  # one host sync per step, paid only with fp16
            scaler.step(optimizer)
            scaler.update()
            totals[3] += scaler.get_scale() < scale_before  # a lowered scale means an inf/NaN step was skipped
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
    return totals


@torch.no_grad()
def evaluate(model: nn.Module, test: Split, cfg: TrainConfig, device: torch.device, rank: int, world: int) -> torch.Tensor:
    """[loss sum, correct, samples] of this rank's slice of the test set (unsmoothed loss)."""
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    shard = test_shard(len(test), rank, world)
    autocast = torch.autocast(device.type, dtype=AMP_DTYPES.get(cfg.amp, torch.float32), enabled=cfg.amp != "off")
    for start in range(shard.start, shard.stop, EVAL_BATCH):
        stop = min(start + EVAL_BATCH, shard.stop)
        images, labels = normalise(test.images[start:stop]), test.labels[start:stop]
        with autocast:
            logits = model(images)
        totals[0] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
        totals[1] += (logits.argmax(1) == labels).sum()
        totals[2] += len(labels)
    return totals


def broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's batch-norm running statistics before evaluation, so the test
    metrics are those of one model (each rank's last forward pass updated its own copy)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


CHECKPOINT_FILE = "state.pt"


def save_checkpoint(folder: Path, epoch: int, model: nn.Module, optimizer, scheduler, scaler) -> None:
    """Everything needed to continue after `epoch` as if never stopped (RNG for dropout too)."""
    state = {
        "epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    torch.save(state, folder / CHECKPOINT_FILE)


def load_checkpoint(folder: Path, model: nn.Module, optimizer, scheduler, scaler, device: torch.device) -> int:
    """Restore a save_checkpoint folder; returns the last finished epoch."""
    state = torch.load(folder / CHECKPOINT_FILE, map_location=device, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if state["cuda_rng"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state_all([rng.cpu() for rng in state["cuda_rng"]])
    return state["epoch"]


def select_device(cfg: TrainConfig) -> torch.device:
    if cfg.use_gpu == "true":
        import ray.train.torch

        return ray.train.torch.get_device()
    return torch.device("cpu")


def train_loop_per_worker(loop_config: dict) -> None:
    """Entry point of each Ray Train worker. loop_config: {"config": resolved TrainConfig dict,
    "trial_dir": absolute folder for metrics.jsonl}."""
    import ray.train

    cfg = TrainConfig(**loop_config["config"])
    trial_dir = Path(loop_config["trial_dir"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(cfg.cpus_per_worker)
    device = select_device(cfg)
    if rank == 0:
        devices = cfg.workers if cfg.strategy == "dp" and device.type == "cuda" else 1
        system = sysinfo.device_info(device.type, devices) | {"world_size": world, "num_gpus": devices * world if device.type == "cuda" else 0}
        runlog.update_json(trial_dir / runlog.TRIAL_FILE, system=system | {"versions": sysinfo.versions()})

    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    train, test = (split.to(device) for split in load_splits(cfg))
    model = build_model(cfg).to(device)
    raw_model, model = model, wrap_model(model, cfg, device, world)
    optimizer = build_optimizer(model.parameters(), cfg)
    steps_per_epoch = len(train) // cfg.effective_batch
    scheduler = build_scheduler(optimizer, cfg, steps_per_epoch)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

    last_done = 0
    checkpoint = ray.train.get_checkpoint()  # set after a worker failure or a driver restore
    if checkpoint:
        with checkpoint.as_directory() as folder:
            last_done = load_checkpoint(Path(folder), raw_model, optimizer, scheduler, scaler, device)
    if rank == 0:
        runlog.truncate_epochs(trial_dir, last_done)  # epochs after the checkpoint are redone: log each once

    for epoch in range(last_done + 1, cfg.epochs + 1):
        lr = optimizer.param_groups[0]["lr"]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        steps = iterate_train(train, cfg, epoch, rank, world)
        train_totals = all_reduce(train_epoch(model, steps, optimizer, scheduler, scaler, criterion, cfg, device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_time = time.perf_counter() - started
        broadcast_buffers(raw_model)
        test_totals = all_reduce(evaluate(raw_model, test, cfg, device, rank, world))
        peak = all_reduce(torch.tensor([peak_memory_mb(device)], device=device, dtype=torch.float64), dist.ReduceOp.MAX)
        epoch_time = time.perf_counter() - started
        loss_sum, correct, samples, skipped = train_totals.tolist()
        metrics = {
            "epoch": epoch,
            "train_loss": loss_sum / samples,
            "train_acc": correct / samples,
            "test_loss": test_totals[0].item() / test_totals[2].item(),
            "test_acc": test_totals[1].item() / test_totals[2].item(),
            "epoch_time_s": epoch_time,
            "train_time_s": train_time,
            "eval_time_s": epoch_time - train_time,
            "train_samples": int(samples),  # over all ranks: steps x effective batch
            "samples_per_s": samples / train_time,
            "peak_mem_mb": peak.item(),
            "lr": lr,
            "amp_skipped_steps": int(skipped),
        }
        diverged = not math.isfinite(metrics["train_loss"])
        metrics["diverged"] = diverged
        if rank == 0:
            runlog.append_epoch(trial_dir, metrics)
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0 and not diverged:
                save_checkpoint(Path(folder), epoch, raw_model, optimizer, scheduler, scaler)
            # Collective: every rank reports the same all-reduced dict; rank 0 adds the checkpoint,
            # which Ray copies to the trial's storage before report returns.
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder) if rank == 0 and not diverged else None)
        if diverged:
            break

