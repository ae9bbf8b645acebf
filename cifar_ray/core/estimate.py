"""How long a sweep will take, before it starts (`cifar-ray sweep FILE --estimate`): the arithmetic, from step times
measured on this machine (training/step_time.py) and how many trials run at once (cluster/placement.py).

A trial's time = its optimizer steps x the time of one step (a worker's share of the batch, its data path
included) + its evaluation passes (its share of the test set and of the train_eval images, every epoch) x the
time per evaluated image + the first step's extra time (warm-up, compile) + its start in a slot (a fresh slot
per trial with --isolate, else the hand-over in a warm slot). Per trial shape (core/shapes.py), its trials are
dealt in order to as many slots as run at once, each taking the next when it is free; shapes share the cores,
so their times add up, as status's ETA does. Ray's start, the first shape's warm slots' start-up and each later
shape's switch come on top. Not foreseen: DDP's all-reduce and the contention of workers sharing the machine's
memory bandwidth; the estimate says so with a likely range (COMPUTE_RANGE, FIXED_RANGE).

No torch, no Ray: the step times come in as numbers. Without --estimate a new sweep's header still gives a rough
wall time (`rough_*`): the same arithmetic on step times from FLOPs counted on the config and a default CPU speed,
nothing timed; a GPU trial's is unknown rather than guessed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .config import TrainConfig
from .shapes import trial_shape
from .sysinfo import load_text
from .text import rough_duration
from .work import trial_work

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
# Fixed costs measured on 2-core machines (issue 36; reports/bench/README.md, section 2b): ray.init ~4 s; the first
# warm slot's start (Tune, Ray Train's controller and workers, the process group, the first trial's
# data and model) and its teardown ~20 s; a later shape's slots start beside the first ones and wait for cores, so
# its switch costs ~8 s (7.9 s measured on the quickstart); a trial handed over in a warm slot ~0.3 s (0.6 s on a
# machine at load 20, 0.07 CPU-s of it in the slot's worker).
RAY_START_S = 4.0
SLOT_START_S = 20.0
SHAPE_SWITCH_S = 8.0
WARM_TRIAL_S = 0.3
# How far the actual sweep may land from the estimate, as factors on its two parts: the timed steps (the same loop
# differed by up to 15 % run to run; workers sharing memory bandwidth and the machine's other load are not timed)
# and the fixed costs (measured between ~half and twice these on 2-core machines, loaded or not).
COMPUTE_RANGE = (0.8, 1.3)
FIXED_RANGE = (0.5, 2.0)
# The rough estimate's default speed of one CPU core: 60 GFLOP/s of a trial's counted FLOPs, what `cifar-ray train`
# reached with simple_cnn width 16, batch 64 on one core of a 2-core Xeon (977 images/s x 60 MFLOP; bare loops of
# the three measured models ran at 62 to 94 GFLOP/s: docs/measurements.md); bf16 on CPU ran half as fast as fp32.
ROUGH_CPU_FLOPS = 60e9
ROUGH_BF16_SLOWDOWN = 2.0
# A sweep above either suggests timing it first (`--dry-run --estimate`) in its header.
SUGGEST_ABOVE_TRIALS = 100
SUGGEST_ABOVE_S = 3600.0


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
    fixed_s: float  # of wall_s: the slots' start-up and the trials' starts in them


@dataclass(frozen=True)
class SweepEstimate:
    trials: list[TrialEstimate]
    shapes: list[ShapeEstimate]
    ray_start_s: float
    wall_s: float
    fixed_s: float  # of wall_s: Ray's start, the slots' and the trials' starts

    @property
    def range_s(self) -> tuple[float, float]:
        """Where the actual wall time is likely to land: COMPUTE_RANGE on the timed part, FIXED_RANGE on the rest."""
        compute = self.wall_s - self.fixed_s
        return tuple(compute * c + self.fixed_s * f for c, f in zip(COMPUTE_RANGE, FIXED_RANGE, strict=True))


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
    slots, plus the warm slots' start-up (they start side by side: the first shape pays SLOT_START_S, a later one,
    whose slots started beside the first ones, SHAPE_SWITCH_S; --isolate pays a slot's start in every trial);
    the shapes one after another; Ray's start first."""
    shapes = []
    for label in dict.fromkeys(t.shape for t in trials):
        members = [t for t in trials if t.shape == label]
        slots = max(1, min(at_once[label], len(members)))
        dealt = dealt_wall([t.total_s for t in members], slots)
        start = 0.0 if isolate else (SHAPE_SWITCH_S if shapes else SLOT_START_S)
        starts = sum(t.start_s for t in members) / slots  # the trials' starts, shared by the slots
        shapes.append(ShapeEstimate(label, len(members), slots, dealt + start, start + starts))
    wall = RAY_START_S + sum(s.wall_s for s in shapes)
    return SweepEstimate(trials, shapes, RAY_START_S, wall, RAY_START_S + sum(s.fixed_s for s in shapes))


def estimate_line(estimate: SweepEstimate) -> str:
    """`estimated wall time ~6 min (likely 4 min to 9 min, fixed costs ~50 s of it; SHAPES; Ray start ~4 s);
    trial time summed: training ~4 min, evaluation ~20 s`."""
    train = sum(t.train_s for t in estimate.trials)
    evaluation = sum(t.eval_s for t in estimate.trials)
    shapes = "; ".join(
        f"{s.shape}: {s.trials} trial{'s' * (s.trials > 1)}, {s.at_once} at once, ~{rough_duration(s.wall_s)}"
        for s in estimate.shapes
    )
    low, high = estimate.range_s
    return (
        f"estimated wall time ~{rough_duration(estimate.wall_s)} (likely {rough_duration(low)} to "
        f"{rough_duration(high)}, fixed costs ~{rough_duration(estimate.fixed_s)} of it; "
        f"{shapes}; Ray start ~{estimate.ray_start_s:.0f} s); "
        f"trial time summed: training ~{rough_duration(train)}, evaluation ~{rough_duration(evaluation)}"
    )


def _simple_cnn_layers(width: int, depth: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """models.SimpleCNN's 3x3 convolutions (c_in, c_out, side) and linear layers (fan_in, fan_out)."""
    convs, c_in = [], 3
    for block in range(depth):
        c_out, side = width * 2**block, 32 >> block
        convs += [(c_in, c_out, side), (c_out, c_out, side)]
        c_in = c_out
    return convs, [(c_in * (32 >> depth) ** 2, 256), (256, 10)]


def _resnet9_layers(width: int, depth: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """models.ResNet9's 3x3 convolutions (c_in, c_out, side: a stage convolves before it pools) and its head."""
    w = width
    residual = [(2 * w, 2 * w, 16)] * 2 + [(8 * w, 8 * w, 4)] * 2
    return [(3, w, 32), (w, 2 * w, 32), (2 * w, 4 * w, 16), (4 * w, 8 * w, 8), *residual], [(8 * w, 10)]


# Per model of training/models.py's MODELS (tests/test_estimate.py binds the two): its layers, for FLOPs counted
# without building it.
MODEL_LAYERS = {"simple_cnn": _simple_cnn_layers, "resnet9": _resnet9_layers}


def config_flops_per_image(config: TrainConfig) -> float:
    """The forward and backward FLOPs of one 32x32 image through config's model, counted from its layers as
    training/flops.py counts them on the built model: 2 per multiply-add of the convolutions and linear layers, the
    backward twice the forward (tests/test_rough_estimate.py holds the two counts within 3 %)."""
    convs, linears = MODEL_LAYERS[config.model](config.width, config.depth)
    forward = sum(2 * 9 * c_in * c_out * side * side for c_in, c_out, side in convs)
    forward += sum(2 * fan_in * fan_out for fan_in, fan_out in linears)
    return 3.0 * forward


def rough_step_time(config: TrainConfig) -> StepTime | None:
    """A step time from default CPU speeds, nothing timed: the worker's images per step x the model's FLOPs at
    ROUGH_CPU_FLOPS per core it has; evaluating an image costs the forward's third. None for a GPU trial (use_gpu
    true once resolved): no default speed of a GPU is worth a guess."""
    if config.use_gpu == "true":
        return None
    rate = ROUGH_CPU_FLOPS * config.cpus_per_worker / (ROUGH_BF16_SLOWDOWN if config.amp == "bf16" else 1.0)
    flops = config_flops_per_image(config)
    return StepTime(config.per_worker_batch * config.accum_steps * flops / rate, flops / 3 / rate, 0.0)


def rough_estimate(configs: Sequence[TrainConfig], at_once: dict[str, int], isolate: bool) -> SweepEstimate | None:
    """sweep_estimate on rough_step_time's step times (`at_once`: shape label -> trials of it at once); None when
    one of the trials runs on GPUs."""
    trials = []
    for index, config in enumerate(configs):
        timing = rough_step_time(config)
        if timing is None:
            return None
        trials.append(trial_estimate(str(index), config, timing, isolate))
    return sweep_estimate(trials, at_once, isolate)


def rough_line(estimate: SweepEstimate | None, trials: int, suggest: str, load: tuple[float, int] | None = None) -> str:
    """`wall time ~2 h 21 min: a rough estimate from default CPU speeds, nothing timed here; time it on this machine
    first: SUGGEST` (`suggest`: the command, said above SUGGEST_ABOVE_TRIALS trials or SUGGEST_ABOVE_S); a sweep with
    GPU trials: `wall time unknown`. `load` (sysinfo.machine_load of the machine the trials run on; None: unknown, a
    cluster): where it is busier than its cores, the estimate, made for an idle machine, says to expect longer."""
    if estimate is None:
        line = "wall time unknown: GPU trials get no rough estimate (--estimate times them)"
    else:
        wall = rough_duration(estimate.wall_s)
        line = f"wall time ~{wall}: a rough estimate from default CPU speeds, nothing timed here"
        if load is not None and load[0] > load[1]:
            line += f"; this machine is busy ({load_text(load)}): expect longer"
    long = trials > SUGGEST_ABOVE_TRIALS or (estimate is not None and estimate.wall_s > SUGGEST_ABOVE_S)
    return f"{line}; time it on this machine first: {suggest}" if long else line
