"""How long a sweep will take, before it starts (`cifar-ray sweep FILE --estimate`): the arithmetic, from step times
measured on this machine (training/step_time.py) and how many trials run at once (cluster/placement.py).

A trial's time = its optimizer steps x the time of one step (a worker's share of the batch, its data path
included) + its evaluation passes (its share of the test set and of the train_eval images, every epoch) x the
time per evaluated image + the first step's extra time (warm-up, compile) + its start in a slot (a fresh slot
per trial with --isolate, else the hand-over in a warm slot). Per trial shape (core/shapes.py), its trials are
dealt in order to as many slots as run at once, each taking the next when it is free; shapes share the cores,
so their times add up, as status's ETA does. Ray's start and each warm slot's start-up come on top. Not
foreseen: DDP's all-reduce and the contention of workers sharing the machine's memory bandwidth.

No torch, no Ray: the step times come in as numbers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .config import TrainConfig
from .shapes import trial_shape
from .sweep import trial_work
from .text import rough_duration

# The config keys one worker's training step and evaluation depend on, besides its share of the batch: trials
# that agree on them (and on per_worker_batch) are timed once.
STEP_KEYS = (
    "model",
    "width",
    "depth",
    "norm",
    "augment",
    "optimizer",
    "accum_steps",
    "amp",
    "compile",
    "cpus_per_worker",
    "use_gpu",
    "strategy",
)
# Fixed costs measured on a 2-core machine (reports/bench/README.md, sections 2 and 2b): ray.init 3.9 s; a Ray
# Train worker group's start and teardown ~20 s per slot; a trial handed over in a warm slot 0.14 s.
RAY_START_S = 4.0
SLOT_START_S = 20.0
WARM_TRIAL_S = 0.15


@dataclass(frozen=True)
class StepTime:
    """What training/step_time.py measured for one step key."""

    step_s: float  # one optimizer step of one worker: its accum_steps micro-batches of per_worker_batch, data included
    eval_image_s: float  # evaluating one image (eval mode, the loop's evaluation batch)
    first_step_extra_s: float  # how much longer the first step took (warm-up; compile=true: compiling)


@dataclass(frozen=True)
class TrialEstimate:
    name: str
    shape: str  # TrialShape.label
    train_s: float
    eval_s: float
    start_s: float  # warm-up of its first step + its start in a slot
    total_s: float


@dataclass(frozen=True)
class ShapeEstimate:
    shape: str
    trials: int
    at_once: int
    wall_s: float  # its trials dealt to at_once slots, plus the slots' start-up when warm


@dataclass(frozen=True)
class SweepEstimate:
    trials: list[TrialEstimate]
    shapes: list[ShapeEstimate]
    ray_start_s: float
    wall_s: float


def step_key(config: TrainConfig) -> tuple:
    """The trials that share this key share their step time: per_worker_batch, then STEP_KEYS' values."""
    return (config.per_worker_batch, *(getattr(config, key) for key in STEP_KEYS))


def eval_images_per_worker(config: TrainConfig) -> int:
    """Images the busiest worker evaluates each epoch: its shard of the test set and of the train_eval images
    (loop.evaluate over data.test_shard: the first ranks take one more when the count does not divide)."""
    work = trial_work(config)
    train_eval = min(config.train_eval_size, work.train_images)
    return sum(math.ceil(images / config.ray_workers) for images in (work.test_images, train_eval))


def trial_estimate(name: str, config: TrainConfig, timing: StepTime, isolate: bool) -> TrialEstimate:
    work = trial_work(config)
    steps = work.images_trained // config.effective_batch
    train_s = steps * timing.step_s
    eval_s = work.epochs * eval_images_per_worker(config) * timing.eval_image_s
    start_s = timing.first_step_extra_s + (SLOT_START_S if isolate else WARM_TRIAL_S)
    label = trial_shape(config).label
    return TrialEstimate(name, label, train_s, eval_s, start_s, train_s + eval_s + start_s)


def dealt_wall(durations: Sequence[float], slots: int) -> float:
    """The time until the last of `durations` ends when they are dealt in order to `slots` slots, each slot taking
    the next one as soon as it is free (the Dispatcher's order)."""
    free_at = [0.0] * max(1, slots)
    for duration in durations:
        heapq.heappush(free_at, heapq.heappop(free_at) + duration)
    return max(free_at)


def sweep_estimate(trials: list[TrialEstimate], at_once: dict[str, int], isolate: bool) -> SweepEstimate:
    """The sweep's wall time: per shape (`at_once`: label -> trials of it at once), its trials dealt to its
    slots, plus one slot start-up for warm slots (they start side by side; --isolate pays it in every trial);
    the shapes one after another; Ray's start first."""
    shapes = []
    for label in dict.fromkeys(t.shape for t in trials):
        members = [t.total_s for t in trials if t.shape == label]
        slots = max(1, min(at_once[label], len(members)))
        wall = dealt_wall(members, slots) + (0.0 if isolate else SLOT_START_S)
        shapes.append(ShapeEstimate(label, len(members), slots, wall))
    return SweepEstimate(trials, shapes, RAY_START_S, RAY_START_S + sum(s.wall_s for s in shapes))


def estimate_line(estimate: SweepEstimate) -> str:
    """`estimated wall time ~6 min: training 4 min, evaluation 20 s, start-up 45 s (summed over trials; ...)`."""
    train = sum(t.train_s for t in estimate.trials)
    evaluation = sum(t.eval_s for t in estimate.trials)
    shapes = "; ".join(
        f"{s.shape}: {s.trials} trial{'s' * (s.trials > 1)}, {s.at_once} at once, ~{rough_duration(s.wall_s)}"
        for s in estimate.shapes
    )
    return (
        f"estimated wall time ~{rough_duration(estimate.wall_s)} ({shapes}; Ray start ~{estimate.ray_start_s:.0f} s); "
        f"trial time summed: training ~{rough_duration(train)}, evaluation ~{rough_duration(evaluation)}"
    )
