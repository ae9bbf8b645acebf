"""How long one worker's training step and evaluation take on this machine, without Ray: what `sweep --estimate`
multiplies (core/estimate.py). The step is the loop's own (loop.build_training, loop.train_epoch over
data.iterate_train, loop.evaluate) on synthetic images of the trial's per-worker batch, with the trial's threads."""

from __future__ import annotations

import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from ..core.config import TrainConfig
from ..core.estimate import StepTime
from . import gpu
from .data import iterate_train, synthetic_cifar
from .distributed import Worker
from .loop import EVAL_BATCH, MEMORY_FORMAT, evaluate, start_training, torch_threads, train_epoch

# After one warm-up step, steps are timed until they add up to TIMED_S (at least one, at most MAX_TIMED_STEPS); the
# median is kept: on a shared machine a step now and then takes far longer.
TIMED_S = 1.0
MAX_TIMED_STEPS = 20


def estimate_device(cfg: TrainConfig) -> torch.device:
    """The device a worker of this (resolved) trial trains on: the first GPU, or the CPU."""
    return torch.device("cuda", 0) if cfg.use_gpu == "true" else torch.device("cpu")


def _synchronised_seconds(started: float, totals: torch.Tensor) -> float:
    totals.tolist()  # waits for the device
    return time.perf_counter() - started


def time_step(cfg: TrainConfig) -> StepTime:
    """timed_step's measurement of `cfg`'s step. On a GPU in a child process: the CUDA context and the memory the
    timing held end with it, so the driver (which then starts Ray, whose workers want the GPU) keeps no device."""
    if estimate_device(cfg).type != "cuda":
        return timed_step(cfg)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:  # no fork after CUDA
        return child.submit(timed_step, cfg).result()


def timed_step(cfg: TrainConfig) -> StepTime:
    """One warm-up step, then timed ones (their median), then one evaluation pass of up to EVAL_BATCH images after
    a warm-up pass: rank 0's share of the trial's batch, `cfg.cpus_per_worker` threads."""
    device = estimate_device(cfg)
    gpu.set_cuda_numerics()  # as a worker sets them (distributed.select_devices)
    if cfg.compile:  # dynamo's caches hold the previous step's model: past 8 recompiles it runs eager
        torch._dynamo.reset()
    # One optimizer step per "epoch": every call of iterate_train over these images yields one step of rank 0.
    train = synthetic_cifar(cfg.effective_batch, split_seed=1).to(device)
    evaluated = synthetic_cifar(min(EVAL_BATCH, cfg.test_subset or EVAL_BATCH), split_seed=2).to(device)

    def one_step(epoch: int) -> float:
        started = time.perf_counter()
        totals = train_epoch(training, iterate_train(train, cfg, epoch, 0, cfg.ray_workers, MEMORY_FORMAT), cfg, device)
        return _synchronised_seconds(started, totals)

    def one_evaluation() -> float:
        started = time.perf_counter()
        return _synchronised_seconds(started, evaluate(training.raw_model, evaluated, cfg, Worker.single(device)))

    with torch_threads(cfg.cpus_per_worker):
        training = start_training(cfg, Worker.single(device), 1 + MAX_TIMED_STEPS)
        first = one_step(1)
        steps = [one_step(2)]
        while sum(steps) < TIMED_S and len(steps) < MAX_TIMED_STEPS:
            steps.append(one_step(2 + len(steps)))
        step_s = statistics.median(steps)
        one_evaluation()
        eval_image_s = one_evaluation() / len(evaluated)
    return StepTime(step_s=step_s, eval_image_s=eval_image_s, first_step_extra_s=max(0.0, first - step_s))
