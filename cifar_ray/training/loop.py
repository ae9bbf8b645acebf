"""The training every worker of a slot runs for a trial: read `run_trial` top to bottom.

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
import logging
import math
import pickle
import resource
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..core import runlog, sysinfo
from ..core.checkpoints import CHECKPOINT_FILE
from ..core.config import TrainConfig
from . import comm
from .data import Split, iterate_train, loaded_splits, normalise, test_shard
from .models import build_model
from .optim import build_optimizer, build_scheduler, peak_lr

logger = logging.getLogger(__name__)

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
EVAL_BATCH = 1000


def reset_peak_memory(devices: list[torch.device]) -> None:
    """Start a new peak: of torch's allocations on each GPU, or of this process's RSS on CPU."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
    if devices[0].type == "cpu":
        reset_peak_rss()


def reset_peak_rss() -> None:
    """Linux: writing 5 to /proc/self/clear_refs resets the process's peak RSS (VmHWM) to its current RSS
    (proc(5)), so the peak is that of the epoch, not of the process's life (which would carry one trial's
    peak into the next in a reused process). Where /proc cannot be written the peak stays the lifetime's."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")


def peak_rss_mb() -> float:
    """This process's peak RSS since the last reset_peak_rss (VmHWM), else since it started (ru_maxrss)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def peak_memory_per_device_mb(devices: list[torch.device]) -> list[float]:
    """GPU: the peak of bytes allocated by torch since the last reset, one number per GPU of this
    worker (dp drives several). CPU: one number, the peak RSS of this process since the last reset."""
    if devices[0].type == "cuda":
        return [torch.cuda.max_memory_allocated(device) / 2**20 for device in devices]
    return [peak_rss_mb()]


def peak_memory_mb(devices: list[torch.device]) -> float:
    """The largest peak of one of this worker's devices: what must fit on one GPU (or in one process)."""
    return max(peak_memory_per_device_mb(devices))


def reduce_peak_memory(devices: list[torch.device]) -> tuple[float, float]:
    """(per worker, total) over all ranks: the largest peak of any one device of any worker, and the
    sum of the peaks of every device of every worker (what the whole run occupies)."""
    peaks = peak_memory_per_device_mb(devices)
    largest = torch.tensor([max(peaks)], device=devices[0], dtype=torch.float64)
    total = torch.tensor([sum(peaks)], device=devices[0], dtype=torch.float64)
    return all_reduce(largest, dist.ReduceOp.MAX).item(), all_reduce(total).item()


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=op)
    return tensor


def reduce_train_totals(local: torch.Tensor) -> torch.Tensor:
    """train_epoch's [loss sum, correct, samples, skipped steps] over all ranks: the first three are
    summed; a skipped optimizer step is skipped by every rank at once (DDP gives all ranks the same
    gradients, so the same inf), so the count is taken once (max over ranks), not summed."""
    sums = all_reduce(local[:3].clone())
    skipped = all_reduce(local[3:].clone(), dist.ReduceOp.MAX)
    return torch.cat([sums, skipped])


def rank_seed(seed: int, rank: int) -> int:
    """Seed of rank `rank`'s own random stream (dropout masks): fixed by (seed, rank), different per
    rank, so a global batch of B sees B independent masks as in one process, not B / W repeated."""
    return seed * 1_000_003 + rank + 1


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
        comm.register_comm_hook(ddp, cfg)  # grad_compression: fp16/bf16/PowerSGD all-reduce hook
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


def build_training(
    cfg: TrainConfig,
    model: nn.Module,
    steps_per_epoch: int,
    device: torch.device,
    world: int,
    scaler: torch.amp.GradScaler | None = None,
    rank: int = 0,
    devices: list[torch.device] | None = None,
) -> Training:
    """The one setup around a built model, shared by the worker loop, `cifar-ray check` and `bench`.
    Afterwards the global RNG (dropout) runs rank `rank`'s own stream (rank_seed)."""
    wrapped = wrap_model(model, cfg, device, world, devices)
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
    torch.manual_seed(rank_seed(cfg.seed, rank))  # seeds the CUDA generators too
    return training


class CheckpointError(RuntimeError):
    """A checkpoint that must not be loaded: the message is one line, fit to print as is."""


class PhaseTimer:
    """Wall time per phase of the training loop, accumulated lap by lap. On CPU, ops run
    synchronously and perf_counter is exact; on CUDA, events are recorded on the stream and read
    once when the epoch ends, so timing adds no synchronisation to the hot path."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self.totals: dict[str, float] = {}
        self.pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.mark = None

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        if self.enabled:
            self.mark = self._now()

    def lap(self, phase: str) -> None:
        """The time since the previous lap (or start) is spent in `phase`."""
        if not self.enabled:
            return
        now = self._now()
        if self.cuda:
            self.pending.append((phase, self.mark, now))
        else:
            self.totals[phase] = self.totals.get(phase, 0.0) + now - self.mark
        self.mark = now

    def seconds(self) -> dict[str, float]:
        if self.pending:
            torch.cuda.synchronize()
            for phase, begin, end in self.pending:
                self.totals[phase] = self.totals.get(phase, 0.0) + begin.elapsed_time(end) / 1000
            self.pending.clear()
        return dict(self.totals)


def allreduce_wait_per_step(model: nn.Module) -> float:
    """Seconds per synchronised step that backward waits on DDP's gradient all-reduce beyond the
    compute it overlaps with, from DDP's own runtime statistics (torch samples the first
    iterations and every 100th; a private API, so 0.0 when absent)."""
    try:
        stats = model._get_ddp_logging_data()  # type: ignore[operator]
        return max(0.0, stats["avg_backward_comm_time"] - stats["avg_backward_compute_comm_overlap_time"]) / 1e9
    except (AttributeError, KeyError, RuntimeError):
        return 0.0


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
    model: nn.Module, split: Split, cfg: TrainConfig, device: torch.device, rank: int, world: int
) -> torch.Tensor:
    """[loss sum, correct, samples] of this rank's slice of `split` (the test set, or the fixed training
    subset of train_eval_size) in eval mode, without augmentation (unsmoothed loss)."""
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    shard = test_shard(len(split), rank, world)
    autocast = amp_autocast(cfg, device)
    for start in range(shard.start, shard.stop, EVAL_BATCH):
        stop = min(start + EVAL_BATCH, shard.stop)
        images = normalise(split.images[start:stop]).contiguous(memory_format=memory_format(device))
        labels = split.labels[start:stop]
        with autocast:
            logits = model(images)
        totals[0] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
        totals[1] += (logits.argmax(1) == labels).sum()
        totals[2] += len(labels)
    return totals


def evaluation_metrics(prefix: str, totals: torch.Tensor) -> dict[str, float]:
    """`{prefix}_loss` and `{prefix}_acc` from evaluate()'s totals summed over the ranks."""
    loss_sum, correct, samples = totals.tolist()
    return {f"{prefix}_loss": loss_sum / samples, f"{prefix}_acc": correct / samples}


def broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's batch-norm running statistics before evaluation, so the test
    metrics are those of one model (each rank's last forward pass updated its own copy)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


def rng_state(device: torch.device) -> dict[str, torch.Tensor | None]:
    """This rank's random state: the CPU generator and its own GPU's (dropout draws from them)."""
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng_state(saved: list[dict] | None, rank: int, world: int, seed: int, device: torch.device) -> None:
    """Give this rank its own saved random state back (each rank's, on its own device: another rank's
    GPU list can be longer than this node has). Saved by another number of workers: this rank's
    stream restarts from rank_seed, as in a fresh run."""
    if not saved or len(saved) != world:
        logger.warning(
            "random state saved by %d workers, resumed on %d: dropout streams restart from the seed",
            len(saved or []),
            world,
        )
        torch.manual_seed(rank_seed(seed, rank))
        return
    torch.set_rng_state(saved[rank]["cpu"].cpu())
    if saved[rank]["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(saved[rank]["cuda"].cpu(), device)


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
        "rng": rng_states if rng_states is not None else [rng_state(torch.device("cpu"))],
        "comm": comm_states,  # PowerSGD state of every rank (comm.gather_hook_state), else None
    }
    torch.save(state, folder / CHECKPOINT_FILE)


def load_checkpoint(
    folder: Path, training: Training, device: torch.device, rank: int = 0, world: int = 1, seed: int = 0
) -> int:
    """Restore a save_checkpoint folder into `training` (its PowerSGD state too, where its model has one);
    returns the last finished epoch. weights_only: a checkpoint in shared storage is data, never code
    (torch refuses anything but tensors and plain containers)."""
    try:
        state = torch.load(folder / CHECKPOINT_FILE, map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"refused to load checkpoint {folder / CHECKPOINT_FILE}: it holds more than tensors "
            f"and plain data ({first})"
        ) from None
    training.raw_model.load_state_dict(state["model"])
    training.optimizer.load_state_dict(state["optimizer"])
    training.scheduler.load_state_dict(state["scheduler"])
    training.scaler.load_state_dict(state["scaler"])
    comm.restore_hook_state(comm.hook_state(training.model), state.get("comm"), rank, world, device)
    restore_rng_state(state.get("rng"), rank, world, seed, device)
    return state["epoch"]


def select_devices(cfg: TrainConfig) -> list[torch.device]:
    """This worker's devices as Ray assigned them: its GPUs (dp drives several; the first is the one
    the model lives on), or the CPU."""
    if cfg.use_gpu == "true":
        import ray.train.torch

        return ray.train.torch.get_devices()
    return [torch.device("cpu")]


def select_device(cfg: TrainConfig) -> torch.device:
    return select_devices(cfg)[0]


def memory_format(device: torch.device) -> torch.memory_format:
    """NHWC on CUDA lets cuDNN use tensor-core convolutions without transposes (airbench, torchvision
    recipes); the model and its inputs must share it, or every convolution converts the input."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


@dataclass(frozen=True)
class Worker:
    """What stays the same for every trial a worker process runs: its rank among `world` and its devices."""

    rank: int
    world: int
    devices: list[torch.device]

    @property
    def device(self) -> torch.device:
        return self.devices[0]


def worker_system(worker: Worker) -> dict:
    """trial.json's `system`: the devices, versions, and the node and host of every rank. Collective."""
    placement = sysinfo.gather_placement()  # node id + hostname of every rank, in rank order
    gpus = len(worker.devices) if worker.device.type == "cuda" else 0
    return (
        sysinfo.device_info(worker.device.type, len(worker.devices))
        | placement
        | {"world_size": worker.world, "num_gpus": gpus * worker.world, "versions": sysinfo.versions()}
    )


# An epoch's metrics and, on rank 0 unless the epoch diverged, the folder of its checkpoint (None elsewhere).
ReportEpoch = Callable[[dict, "Path | None"], None]


def run_trial(
    cfg: TrainConfig,
    trial_dir,
    worker: Worker,
    report: ReportEpoch,
    resume_from: Path | None = None,
    loop_started: float | None = None,
    ready: Callable[[dict], None] | None = None,
) -> None:
    """Train one trial on this worker from scratch or from the checkpoint folder `resume_from`, calling
    `report` after every epoch (collectively, on every rank); rank 0 writes the epochs to metrics.jsonl and
    hands `ready` (the slot's link to the Dispatcher, which writes trial.json) the trial's timeline. Everything
    a trial trains with is built here from its config (seeded RNG, data order, model, optimizer, wrapper,
    hooks), so a process that ran other trials before trains this one exactly as a fresh process would
    (tests/test_train_eval.py)."""
    rank, world, devices, device = worker.rank, worker.world, worker.devices, worker.device
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    train, test = (split.to(device) for split in loaded_splits(cfg))
    # The first train_eval_size training images (all, if fewer), evaluated like the test set each epoch.
    train_eval = train.head(cfg.train_eval_size) if cfg.train_eval_size else None
    raw_model = build_model(cfg).to(device, memory_format=memory_format(device))
    steps_per_epoch = len(train) // cfg.effective_batch
    training = build_training(cfg, raw_model, steps_per_epoch, device, world, rank=rank, devices=devices)

    last_done = 0
    if resume_from is not None:
        last_done = load_checkpoint(resume_from, training, device, rank, world, cfg.seed)
    if rank == 0:
        runlog.truncate_epochs(trial_dir, last_done)  # epochs after the checkpoint are redone: log each once
        if ready is not None:  # where a trial's time goes outside the epochs (read by `cifar-ray bench`)
            ready({"loop_started_unix": loop_started or time.time(), "ready_unix": time.time()})

    for epoch in range(last_done + 1, cfg.epochs + 1):
        lr = training.optimizer.param_groups[0]["lr"]
        reset_peak_memory(devices)
        started = time.perf_counter()
        steps = iterate_train(train, cfg, epoch, rank, world, memory_format(device))
        timer = PhaseTimer(device)
        train_totals = reduce_train_totals(train_epoch(training, steps, cfg, device, timer))
        phases = timer.seconds()  # synchronises CUDA once
        train_time = time.perf_counter() - started
        broadcast_buffers(raw_model)
        evaluated = evaluation_metrics("test", all_reduce(evaluate(raw_model, test, cfg, device, rank, world)))
        if train_eval is not None:
            train_eval_totals = all_reduce(evaluate(raw_model, train_eval, cfg, device, rank, world))
            evaluated |= evaluation_metrics("train_eval", train_eval_totals)
        eval_time = time.perf_counter() - started - train_time
        allreduce = min(allreduce_wait_per_step(training.model) * steps_per_epoch, phases.get("forward_backward", 0.0))
        breakdown = torch.tensor(
            [
                phases.get("data", 0.0),
                phases.get("forward_backward", 0.0) - allreduce,
                allreduce,
                phases.get("optimizer", 0.0),
                eval_time,
            ],
            dtype=torch.float64,
            device=device,
        )
        breakdown = (all_reduce(breakdown) / world).tolist()  # mean over ranks
        peak_per_worker, peak_total = reduce_peak_memory(devices)
        epoch_time = time.perf_counter() - started
        loss_sum, correct, samples, skipped = train_totals.tolist()
        metrics = {
            "epoch": epoch,
            "train_loss": loss_sum / samples,
            "train_acc": correct / samples,
            **evaluated,  # test_loss, test_acc, and train_eval_loss, train_eval_acc unless train_eval_size=0
            "epoch_time_s": epoch_time,
            "train_time_s": train_time,
            **dict(zip(runlog.BREAKDOWN_KEYS, breakdown)),
            "train_samples": int(samples),  # over all ranks: steps x effective batch
            "samples_per_s": samples / train_time,
            "peak_mem_mb": peak_per_worker,  # the largest peak of one worker process (on GPUs: of one GPU)
            "peak_mem_total_mb": peak_total,  # the sum over every worker (and every GPU of a dp worker)
            "lr": lr,
            "peak_lr": peak_lr(cfg),  # lr after lr_scaling
            "amp_skipped_steps": int(skipped),
            "allreduce_bytes_per_step": comm.allreduce_bytes_per_step(
                raw_model, cfg, world, (epoch - 1) * steps_per_epoch, steps_per_epoch
            ),
            "end_unix": time.time(),
        }
        diverged = not math.isfinite(metrics["train_loss"])
        metrics["diverged"] = diverged
        if rank == 0:
            runlog.append_epoch(trial_dir, metrics)
        if not diverged:  # collectives: every rank's PowerSGD and random state, gathered on rank 0
            comm_states = comm.gather_hook_state(comm.hook_state(training.model), device)
            rng_states = comm.gather_on_rank0(rng_state(device), device)
        with tempfile.TemporaryDirectory() as folder:
            saved = rank == 0 and not diverged
            if saved:
                save_checkpoint(Path(folder), epoch, training, comm_states, rng_states)
            report(metrics, Path(folder) if saved else None)
        if diverged:
            break
