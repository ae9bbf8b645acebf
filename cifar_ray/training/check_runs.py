"""What every check of training/checks.py stands on: its model and data (BASE), a few optimizer steps through the
real `train_epoch` (`train_steps`), what a run leaves to compare (`Trained`), what a check plans and reports
(`Plan`, `CheckResult`), and the measures it compares with (`update_rel_diff`, `rel_diff`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.config import TrainConfig, parse_config
from ..core.errors import ConfigError
from .data import Split, iterate_train, load_splits
from .distributed import Worker, reduce_train_totals
from .loop import MEMORY_FORMAT, start_training, torch_threads, train_epoch

# GradScaler's initial scale in the checks: its default 65536 makes real fp16 gradients overflow in
# the first steps, a natural skip that would spoil the comparison and the count of forced skips.
CHECK_INIT_SCALE = 2.0**10

# The model and data of every check: small enough for seconds on a laptop CPU, real code paths.
BASE = {
    "dataset": "synthetic",
    "train_subset": 512,
    "test_subset": 16,
    "augment": "none",
    "model": "simple_cnn",
    "width": 8,
    "depth": 2,
    "norm": "none",
    "epochs": 1,
    "optimizer": "momentum",
    "lr": 0.05,
    "weight_decay": 5e-4,
    "scheduler": "cosine",
    "seed": 0,
    "use_gpu": "false",
    "backend": "gloo",
}


@dataclass
class CheckResult:
    """One line of `cifar-ray check`: status PASS, FAIL or SKIP, the measured numbers in `detail`."""

    name: str
    status: str
    detail: str
    values: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None  # wall time of the check (a DDP run gives two lines: its total)

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def line(self) -> str:
        took = f"  [{self.seconds:.1f} s]" if self.seconds is not None else ""
        return f"{self.status:<5} {self.name:<47} {self.detail}{took}"


def result(name: str, ok: bool, detail: str, **values: Any) -> CheckResult:
    return CheckResult(name, "PASS" if ok else "FAIL", detail, values)


@dataclass
class Trained:
    """What a few steps of training left: parameter vectors before/after (float64, CPU), the
    state_dict, this rank's train totals and the all-reduced ones ([loss sum, correct, samples,
    skipped steps])."""

    initial: torch.Tensor
    final: torch.Tensor
    state: dict[str, torch.Tensor]
    local: torch.Tensor
    totals: torch.Tensor
    wrapper: str = ""  # the class the model ran as (DataParallel, DistributedDataParallel, or the model's own)
    device_ids: tuple[int, ...] = ()  # the GPUs a DataParallel wrapper split each batch over


@dataclass(frozen=True)
class Plan:
    """What a check compares, decided before anything runs: its runs' configs, the dtype, the tolerance on
    the update rel diff and why that tolerance, the devices of a dp run; or why it cannot run here (`skip`)."""

    name: str
    configs: dict[str, TrainConfig]
    tolerance: float
    why: str
    dtype: torch.dtype = torch.float64
    devices: tuple[torch.device, ...] = ()
    skip: str = ""

    def skipped(self) -> CheckResult:
        return CheckResult(self.name, "SKIP", self.skip)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def make_config(**overrides: Any) -> TrainConfig:
    return parse_config(BASE | overrides)


def param_vector(params) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten().cpu() for p in params])


def update_rel_diff(initial: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b - initial|: the difference of two runs relative to how far training moved."""
    return ((a - b).norm() / (b - initial).norm()).item()


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def cast_steps(steps: Iterator[list[tuple[torch.Tensor, torch.Tensor]]], dtype: torch.dtype):
    for micro_batches in steps:
        yield [(images.to(dtype), labels) for images, labels in micro_batches]


_SPLITS: dict[tuple, tuple[Split, Split]] = {}


def cached_splits(cfg: TrainConfig) -> tuple[Split, Split]:
    """load_splits, generated once per (dataset, subsets) in this process (the checks build the
    same small synthetic data ~20 times)."""
    key = (cfg.dataset, cfg.data_dir, cfg.train_subset, cfg.test_subset)
    if key not in _SPLITS:
        _SPLITS[key] = load_splits(cfg)
    return _SPLITS[key]


def train_steps(
    cfg: TrainConfig,
    n_steps: int,
    worker: Worker,
    dtype: torch.dtype = torch.float32,
    scaler: torch.amp.GradScaler | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
) -> Trained:
    """The first `n_steps` optimizer steps of epoch 1, set up exactly as train.run_trial
    does (seed, data, model, wrap_model, optimizer, schedule, scaler, criterion), in `dtype`.
    `prepare(model)` may instrument the model before training (e.g. poison one gradient).
    Runs with cfg.cpus_per_worker torch threads, as a Ray Train worker does (and tiny models on
    a busy machine run many times faster on one thread than on contended ones). `worker.devices`: the GPUs
    of a dp run (wrap_model splits each batch over them), as Ray gives a dp worker."""
    with torch_threads(cfg.cpus_per_worker):
        return _train_steps(cfg, n_steps, worker, dtype, scaler, prepare)


def _build(cfg, worker, dtype, scaler=None, prepare=None):
    """(training split, initial parameters, Training) as train.run_trial builds them (loop.start_training)."""
    train, _ = (split.to(worker.device) for split in cached_splits(cfg))
    initial = []

    def as_built(model: nn.Module) -> None:
        initial.append(param_vector(model.parameters()))
        if prepare is not None:
            prepare(model)

    training = start_training(cfg, worker, len(train) // cfg.effective_batch, dtype, scaler, as_built)
    return train, initial[0], training


def _train_range(training, train, cfg, worker, dtype, steps: range) -> torch.Tensor:
    """Optimizer `steps` of epoch 1 (the data order of a run that did the steps before)."""
    batches = iterate_train(train, cfg, 1, worker.rank, worker.world, MEMORY_FORMAT)
    chosen = itertools.islice(batches, steps.start, steps.stop)
    return train_epoch(training, cast_steps(chosen, dtype), cfg, worker.device)


def _trained(training, initial: torch.Tensor, local: torch.Tensor) -> Trained:
    totals = reduce_train_totals(local)  # as train.run_trial: over all ranks
    model = training.raw_model
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    ids = tuple(getattr(training.model, "device_ids", None) or ())
    wrapper = type(training.model).__name__
    return Trained(initial, param_vector(model.parameters()), state, local.cpu(), totals.cpu(), wrapper, ids)


def _train_steps(cfg, n_steps, worker, dtype, scaler, prepare) -> Trained:
    train, initial, training = _build(cfg, worker, dtype, scaler, prepare)
    local = _train_range(training, train, cfg, worker, dtype, range(n_steps))
    return _trained(training, initial, local)


# ---------------------------------------------------------------- device


def resolve_device(use_gpu: str) -> torch.device:
    """auto: the first CUDA GPU if torch sees one, else the CPU; true without CUDA is a ConfigError."""
    if use_gpu not in ("auto", "true", "false"):
        raise ConfigError(f"use_gpu={use_gpu!r}: not allowed; allowed: one of auto, true, false")
    cuda = torch.cuda.is_available()
    if use_gpu == "true" and not cuda:
        raise ConfigError("use_gpu=true but torch sees no CUDA GPU; use --use-gpu auto or false")
    return torch.device("cuda", 0) if cuda and use_gpu != "false" else torch.device("cpu")


def device_keys(device: torch.device) -> dict[str, str]:
    gpu = device.type == "cuda"
    return {"use_gpu": "true" if gpu else "false", "backend": "nccl" if gpu else "gloo"}


# ---------------------------------------------------------------- in-process checks
