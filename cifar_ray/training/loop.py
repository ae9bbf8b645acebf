"""The training every worker of a slot runs for a trial: read `run_trial` top to bottom, then `epoch_record`.

Semantics (tests/test_equivalence.py proves them):
- `batch_size` is the global micro-batch: each of W workers takes batch_size/W samples per step;
- `accum_steps` micro-batches form one optimizer step: each micro-batch loss is scaled by
  1/accum_steps, DDP all-reduces only on the last micro-batch (`no_sync` on the others), so the
  step equals one of batch_size x accum_steps samples (up to batch-norm statistics);
- train metrics are sums over all ranks (all_reduce), test metrics cover the whole test set;
- train_eval metrics evaluate the first train_eval_size training images exactly like the test set.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..core import runlog
from ..core.config import TrainConfig
from ..core.storage import StoragePath
from . import comm, gpu
from .data import Split, iterate_train, loaded_splits, normalise, test_shard
from .distributed import Worker, all_reduce, barrier, broadcast_buffers, rank_seed, reduce_train_totals
from .flops import Peak, throughput, training_flops_per_image, trial_peak
from .memory import (
    gpu_out_of_memory_is_final,
    reduce_peak_memory,
    release_trial,
    reset_peak_memory,
    resident_memory_mb,
)
from .models import build_model, describe_network
from .optim import build_optimizer, build_scheduler, epoch_lrs, peak_lr
from .profile import profiled_steps
from .state import Training, resume_newest, rng_state, save_checkpoint
from .timing import PhaseTimer, allreduce_wait, reduce_time_breakdown, sample_allreduce_every_epoch

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
EVAL_BATCH = 1000
# NHWC on every device; the model and its inputs share it, or every convolution converts its input. On CUDA cuDNN
# runs tensor-core convolutions without transposes (airbench, torchvision recipes); on CPU oneDNN runs NHWC
# natively, faster than NCHW (measured: reports/bench/README.md).
MEMORY_FORMAT = torch.channels_last


class ReplicaAutocast(nn.Module):
    """Runs `module` under autocast with the configured dtype. nn.DataParallel re-enters autocast
    in each replica's thread without the dtype, so bf16 would silently run as fp16
    (pytorch/pytorch#125186); the torch AMP docs' DataParallel recipe autocasts inside forward."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.module, self.device_type, self.dtype = module, device_type, dtype

    def forward(self, *args, **kwargs):
        # cache_enabled=False: an enclosing autocast may have cached casts of the weights in its own dtype
        with torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=False):
            return self.module(*args, **kwargs)


def wrap_model(
    model: nn.Module, cfg: TrainConfig, device: torch.device, world: int, devices: list[torch.device] | None = None
) -> nn.Module:
    """The model as it runs: DDP for several processes, DataParallel over `devices` (this worker's
    GPUs, as Ray assigned them) for dp, else unwrapped."""
    devices = devices or [device]
    if cfg.strategy == "dp" and device.type == "cuda" and len(devices) > 1:
        replica = ReplicaAutocast(model, device.type, AMP_DTYPES[cfg.amp]) if cfg.amp != "off" else model
        return nn.DataParallel(replica, device_ids=[d.index for d in devices], output_device=device.index)
    if cfg.strategy == "ddp" and world > 1:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, **comm.ddp_kwargs(cfg)
        )
        comm.register_comm_hook(ddp, cfg)  # grad_compression's all-reduce hook, timed on CPU (timing.CommTimer)
        return ddp
    return model  # one process, one device: nothing to synchronise


def amp_autocast(cfg: TrainConfig, device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, dtype=AMP_DTYPES.get(cfg.amp, torch.float32), enabled=cfg.amp != "off")


@contextlib.contextmanager
def torch_threads(count: int):
    """Run with `count` torch threads (as a Ray Train worker with cpus_per_worker=count), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_training(
    cfg: TrainConfig, model: nn.Module, steps_per_epoch: int, worker: Worker, scaler: torch.amp.GradScaler | None = None
) -> Training:
    """The setup around a built model on `worker` (start_training's last step): wrapper, optimizer, schedule.
    Afterwards the global RNG (dropout) runs the worker's rank's own stream (rank_seed)."""
    device = worker.device
    wrapped = wrap_model(model, cfg, device, worker.world, worker.devices)
    sample_allreduce_every_epoch(wrapped, steps_per_epoch)
    if cfg.compile:
        wrapped = torch.compile(wrapped)  # compiling the DDP wrapper lets DDPOptimizer split graphs at buckets
    optimizer = build_optimizer(wrapped.parameters(), cfg)
    training = Training(
        raw_model=model,
        model=wrapped,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg, steps_per_epoch),
        scaler=scaler if scaler is not None else torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16"),
        criterion=nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
    )
    torch.manual_seed(rank_seed(cfg.seed, worker.rank))  # seeds the CUDA generators too
    return training


def start_training(
    cfg: TrainConfig,
    worker: Worker,
    steps_per_epoch: int,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    prepare: Callable[[nn.Module], object] | None = None,
) -> Training:
    """A trial's training as it starts, the one set-up of every path that trains a config (run_trial, `cifar-ray
    check`, --estimate's step time, `bench`): the trial's seed (the same initial weights on every rank), its model
    on the worker's device (in `dtype`, None: the model's own), `prepare(model)` on the model as built (before the
    wrapper: network.json and FLOPs, a check's instruments), then build_training."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(worker.device, dtype=dtype, memory_format=MEMORY_FORMAT)
    if prepare is not None:
        prepare(model)
    return build_training(cfg, model, steps_per_epoch, worker, scaler)


def train_epoch(
    training: Training,
    steps: Iterable[list[tuple[torch.Tensor, torch.Tensor]]],
    cfg: TrainConfig,
    device: torch.device,
    timer: PhaseTimer | None = None,
) -> torch.Tensor:
    """One pass of `training` over this rank's steps. Returns this rank's [loss sum, correct, samples,
    skipped steps] as a device tensor: no .item() per step, one host sync per epoch. `timer` (optional)
    splits the time into data, forward+backward and optimizer phases."""
    model, optimizer, scaler = training.model, training.optimizer, training.scaler
    model.train()
    totals = torch.zeros(4, device=device, dtype=torch.float64)
    autocast = amp_autocast(cfg, device)
    timer = timer or PhaseTimer(device, enabled=False)
    timer.start()
    for micro_batches in steps:
        timer.lap("data")  # the steps generator gathers, normalises and augments the batch
        for i, (images, labels) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            # Skip DDP's all-reduce on all but the last micro-batch of the accumulation window.
            sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                with autocast:
                    logits = model(images)
                    loss = training.criterion(logits, labels)
                scaler.scale(loss / len(micro_batches)).backward()
            totals[0] += loss.detach().double() * len(labels)
            totals[1] += (logits.argmax(1) == labels).sum()
            totals[2] += len(labels)
        timer.lap("forward_backward")
        if scaler.is_enabled():
            scale_before = scaler.get_scale()  # one host sync per step, paid only with fp16
            scaler.step(optimizer)
            scaler.update()
            scale = scaler.get_scale()
            if scale != scale_before:
                totals[3] += scale < scale_before  # a lowered scale means an inf/NaN step was skipped
                comm.rescale_error_feedback(model, scale / scale_before)  # PowerSGD's memory is in scaled units
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        training.scheduler.step()
        timer.lap("optimizer")
    return totals


@torch.no_grad()
def evaluate(
    model: nn.Module, split: Split, cfg: TrainConfig, worker: Worker, correct: torch.Tensor | None = None
) -> torch.Tensor:
    """[loss sum, correct, samples] of this rank's slice of `split` (the test set, or the fixed training
    subset of train_eval_size) in eval mode, without augmentation (unsmoothed loss). `correct` (optional, one
    uint8 per image of `split`, zeros, on `device`): this rank's images are set to 1 where the prediction is right,
    on the device (no host sync per batch); the shards are disjoint, so its sum over the ranks holds every image
    once, in dataset order (correct_images)."""
    model.eval()
    device = worker.device
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    shard = test_shard(len(split), worker.rank, worker.world)
    autocast = amp_autocast(cfg, device)
    for start in range(shard.start, shard.stop, EVAL_BATCH):
        stop = min(start + EVAL_BATCH, shard.stop)
        images = normalise(split.images[start:stop]).contiguous(memory_format=MEMORY_FORMAT)
        labels = split.labels[start:stop]
        with autocast:
            logits = model(images)
        totals[0] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
        right = logits.argmax(1) == labels
        totals[1] += right.sum()
        totals[2] += len(labels)
        if correct is not None:
            correct[start:stop] = right
    return totals


def correct_images(correct: torch.Tensor, epoch: int) -> runlog.CorrectImages:
    """runlog's record of evaluate()'s `correct` once summed over the ranks (one host copy, at the final epoch)."""
    return runlog.CorrectImages(epoch, len(correct), np.packbits(correct.cpu().numpy().astype(bool)).tobytes())


def evaluation_metrics(prefix: str, totals: torch.Tensor) -> dict[str, float]:
    """`{prefix}_loss` and `{prefix}_acc` from evaluate()'s totals summed over the ranks."""
    loss_sum, correct, samples = totals.tolist()
    return {f"{prefix}_loss": loss_sum / samples, f"{prefix}_acc": correct / samples}


# An epoch's metrics and, on rank 0 unless the epoch diverged, the folder of its checkpoint (None elsewhere).
ReportEpoch = Callable[[dict, "Path | None"], None]


@dataclass(frozen=True)
class TrialOptions:
    """How run_trial runs a trial beyond its config (a slot's link to the Dispatcher; none from a test or bench):
    `resume` from its newest stored checkpoint that loads (`note` hears of one passed over: state.resume_newest);
    rank 0 hands `ready` the trial's timeline, from `loop_started` (when its slot took it); `profile` (--profile):
    rank 0 profiles a few steps of the first epoch it trains (training/profile.py)."""

    resume: bool = False
    loop_started: float | None = None
    ready: Callable[[dict], None] | None = None
    profile: bool = False
    note: Callable[[str], None] | None = None


@dataclass(frozen=True)
class TrialParts:
    """What every epoch of a trial on this worker shares, for epoch_record: its config, its Training, its steps per
    epoch, the worker's resident memory when the trial started, the model's FLOPs per image and the devices' peak."""

    cfg: TrainConfig
    training: Training
    worker: Worker
    steps_per_epoch: int
    memory_at_start: list[float]
    flops_per_image: float
    peak: Peak


@dataclass(frozen=True)
class EpochTimes:
    """An epoch's training as measured: this rank's train_epoch totals reduced over the ranks, the PhaseTimer's
    phases, when the epoch started (perf_counter) and how long its training steps took (s)."""

    train_totals: torch.Tensor
    phases: dict[str, float]
    started: float
    train_time: float


@gpu_out_of_memory_is_final()  # GpuOutOfMemoryError: the slot path does not retry it
def run_trial(
    cfg: TrainConfig, trial_dir, worker: Worker, report: ReportEpoch, options: TrialOptions = TrialOptions()
) -> None:
    """Train one trial on this worker from scratch or, options.resume, from its newest stored checkpoint, calling
    `report` after every epoch (collectively, on every rank); rank 0 writes the epochs to metrics.jsonl. Everything
    a trial trains with is built here from its config (seeded RNG, data order, model, optimizer, wrapper,
    hooks), so a process that ran other trials before trains this one exactly as a fresh process would
    (tests/test_train_eval.py)."""
    rank, world, devices, device = worker.rank, worker.world, worker.devices, worker.device
    gpu.check_amp_supported(cfg, device)  # bf16 before Ampere: one line, not a cuDNN failure mid-epoch
    train, test = (split.to(device) for split in loaded_splits(cfg))
    peak = trial_peak(cfg, devices)  # probes a worker's first trial only: before the seed and the memory baseline
    # The trial's memory is measured from here, so that it does not depend on its place in a warm slot: what earlier
    # trials left is freed, and what only a process's first trial pays (loading the data, the probes) is below it.
    release_trial(devices)
    at_start = resident_memory_mb(devices)
    # The first train_eval_size training images (all, if fewer), evaluated like the test set each epoch.
    train_eval = train.head(cfg.train_eval_size) if cfg.train_eval_size else None
    steps_per_epoch = len(train) // cfg.effective_batch
    flops: list[float] = []

    def as_built(model: nn.Module) -> None:
        if rank == 0:  # the network the trial trains, for the report (which reads no torch)
            runlog.write_json(
                StoragePath.of(trial_dir) / runlog.NETWORK_FILE, describe_network(model, cfg, MEMORY_FORMAT)
            )
        flops.append(training_flops_per_image(model))

    training = start_training(cfg, worker, steps_per_epoch, prepare=as_built)
    raw_model, flops_per_image = training.raw_model, flops[0]
    parts = TrialParts(cfg, training, worker, steps_per_epoch, at_start, flops_per_image, peak)

    last_done = 0
    if options.resume:
        last_done = resume_newest(StoragePath.of(trial_dir), training, worker, cfg.seed, options.note)
    if rank == 0:
        runlog.truncate_epochs(trial_dir, last_done)  # epochs after the checkpoint are redone: log each once
        if options.ready is not None:  # where a trial's time goes outside the epochs (read by `cifar-ray bench`)
            options.ready({"loop_started_unix": options.loop_started or time.time(), "ready_unix": time.time()})

    for epoch in range(last_done + 1, cfg.epochs + 1):
        reset_peak_memory(devices)
        started = time.perf_counter()
        steps = iterate_train(train, cfg, epoch, rank, world, MEMORY_FORMAT)
        if options.profile and rank == 0 and epoch == last_done + 1:
            steps = profiled_steps(steps, steps_per_epoch, trial_dir, device, epoch)
        timer = PhaseTimer(device)
        train_totals = reduce_train_totals(train_epoch(training, steps, cfg, device, timer))
        phases = timer.seconds()  # synchronises CUDA once
        train_time = time.perf_counter() - started
        broadcast_buffers(raw_model)
        # At the final evaluation, which test images it got right: the test-set noise of the report (report/testset.py)
        correct = torch.zeros(len(test), dtype=torch.uint8, device=device) if epoch == cfg.epochs else None
        evaluated = evaluation_metrics("test", all_reduce(evaluate(raw_model, test, cfg, worker, correct)))
        if correct is not None:
            all_reduce(correct)
        if train_eval is not None:
            train_eval_totals = all_reduce(evaluate(raw_model, train_eval, cfg, worker))
            evaluated |= evaluation_metrics("train_eval", train_eval_totals)
        metrics = epoch_record(parts, epoch, EpochTimes(train_totals, phases, started, train_time), evaluated)
        diverged = metrics["diverged"]
        if rank == 0:
            runlog.append_epoch(trial_dir, metrics)
            if correct is not None:  # before `report`, after which the trial may be marked finished
                runlog.write_correct_images(trial_dir, correct_images(correct, epoch))
        if not diverged:  # collectives: every rank's PowerSGD and random state, gathered on rank 0
            comm_states = comm.gather_hook_state(comm.hook_state(training.model), device)
            rng_states = comm.gather_on_rank0(rng_state(*devices), device)
        with tempfile.TemporaryDirectory() as folder:
            saved = rank == 0 and not diverged
            if saved:
                save_checkpoint(Path(folder), epoch, training, comm_states, rng_states)
            report(metrics, Path(folder) if saved else None)
        # Rank 0 stores the checkpoint in `report`: without this, the others would wait for it inside the next
        # epoch's first collective, and that wait would count as its compute.
        barrier()
        if diverged:
            break


def epoch_record(trial: TrialParts, epoch: int, times: EpochTimes, evaluated: dict[str, float]) -> dict:
    """The epoch's line of metrics.jsonl: the keys of runlog.EPOCH_METRICS, in its order, from the epoch's training
    `times` and its `evaluated` metrics. Called as evaluation ends (the time since training ended is evaluation's).
    Collective: the time breakdown and the peak memory are reduced over the ranks here, before the epoch's wall time
    is read."""
    cfg, training, worker, steps_per_epoch, peak = (
        trial.cfg,
        trial.training,
        trial.worker,
        trial.steps_per_epoch,
        trial.peak,
    )
    started, train_time = times.started, times.train_time
    eval_time = time.perf_counter() - started - train_time
    waited, measured = allreduce_wait(training.model, steps_per_epoch)
    breakdown = reduce_time_breakdown(times.phases, waited, eval_time, worker.world, worker.device, measured)
    peak_per_worker, peak_total, peak_reserved, peak_above_start = reduce_peak_memory(
        worker.devices, trial.memory_at_start
    )
    epoch_time = time.perf_counter() - started
    loss_sum, correct, samples, skipped = times.train_totals.tolist()
    lr_last, lr_max = epoch_lrs(cfg, epoch, steps_per_epoch)
    return {
        "epoch": epoch,
        "train_loss": loss_sum / samples,
        "train_acc": correct / samples,
        **evaluated,  # test_loss, test_acc, and train_eval_loss, train_eval_acc unless train_eval_size=0
        "epoch_time_s": epoch_time,
        "train_time_s": train_time,
        **breakdown,  # runlog.BREAKDOWN_KEYS (DDP on CUDA: ALLREDUCE_ESTIMATE_KEY for the all-reduce wait)
        "train_samples": int(samples),  # over all ranks: steps x effective batch
        "samples_per_s": samples / train_time,
        **throughput(trial.flops_per_image, samples, train_time, peak.flops_per_s),  # flops_per_s, mfu
        "peak_flops_per_s": peak.flops_per_s,
        "peak_source": peak.source,
        "peak_mem_mb": peak_per_worker,  # the largest peak of one worker process (on GPUs: of one GPU)
        "peak_mem_total_mb": peak_total,  # the sum over every worker (and every GPU of a dp worker)
        "peak_mem_reserved_mb": peak_reserved,  # GPUs: the caching allocator's largest peak on one GPU; CPU: None
        "peak_mem_above_start_mb": peak_above_start,  # the trial's own: less what was resident at its start
        "lr_last": lr_last,
        "lr_max": lr_max,
        "peak_lr": peak_lr(cfg),  # lr after lr_scaling
        "amp_skipped_steps": int(skipped),
        "allreduce_bytes_per_step": comm.allreduce_bytes_per_step(
            training.raw_model, cfg, worker.world, (epoch - 1) * steps_per_epoch, steps_per_epoch
        ),
        "end_unix": time.time(),
        "diverged": diverged(training, loss_sum, int(skipped), steps_per_epoch),  # the trial stops here
    }


def diverged(training: Training, loss_sum: float, skipped: int, steps: int) -> bool:
    """Whether what was trained broke: non-finite weights, or a non-finite loss that reached the optimizer.
    With fp16 an inf/NaN loss gives inf/NaN gradients and GradScaler skips that step (the weights stay as
    they were), so the loss sum alone would end a trial for one overflow; only an epoch whose every step
    was skipped with a non-finite loss (nothing trains any more) has diverged."""
    if not torch.stack([torch.isfinite(p).all() for p in training.raw_model.parameters()]).all():
        return True
    if math.isfinite(loss_sum):
        return False
    return not training.scaler.is_enabled() or skipped == steps
