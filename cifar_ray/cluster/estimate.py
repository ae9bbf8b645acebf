"""`sweep FILE --estimate`: the sweep's expected wall time on the embedded local Ray, before it starts. Each distinct
step of the plan (core/estimate.step_key) is timed here, without Ray (training/step_time.py); the trials run at
once as the sweep would run them (placement.trials_at_once on the node init_ray would start); the arithmetic is
core/estimate.py's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.config import TrainConfig
from ..core.estimate import STEP_KEYS, StepTime, SweepEstimate, step_key, sweep_estimate, trial_estimate
from ..core.sweep import SweepPlan
from .placement import check_fits, resolve_plan, trials_at_once
from .session import embedded_capacity


@dataclass(frozen=True)
class PlanEstimate:
    sweep: SweepEstimate
    timings: list[dict[str, Any]]  # a row per distinct step: its varying keys, trials, the times measured


def timing_row(config: TrainConfig, varying: list[str], trials: int, timing: StepTime) -> dict[str, Any]:
    images = config.per_worker_batch * config.accum_steps
    return {
        **{key: getattr(config, key) for key in varying},
        "per_worker_batch": config.per_worker_batch,
        "trials": trials,
        "step_s": timing.step_s,
        "train_img_per_s": images / timing.step_s,
        "eval_img_per_s": 1 / timing.eval_image_s,
        "warm_up_s": timing.first_step_extra_s,
    }


def estimate_plan(
    plan: SweepPlan, max_concurrent: int | None, isolate: bool, print_line: Callable[[str], None] | None = None
) -> PlanEstimate:
    """Times every distinct step of `plan` on this machine (seconds each) and estimates its wall time with
    `max_concurrent` trials at most at once, in warm slots or (`isolate`) a slot per trial."""
    from ..training.step_time import time_step  # imports torch

    capacity = embedded_capacity()
    plan = resolve_plan(plan, capacity)  # the sweep itself says how ranks share GPUs
    check_fits(plan, capacity)
    configs: dict[tuple, list[TrainConfig]] = {}
    for trial in plan.trials:
        configs.setdefault(step_key(trial.config), []).append(trial.config)
    if print_line:
        print_line(f"timing {len(configs)} distinct training step(s) on this machine (no Ray) ...")
    timings = {key: time_step(members[0]) for key, members in configs.items()}
    trials = [trial_estimate(t.name, t.config, timings[step_key(t.config)], isolate) for t in plan.trials]
    at_once = {label: fit for label, (_, fit) in trials_at_once(plan, capacity, max_concurrent).items()}
    varying = [key for key in STEP_KEYS if len({getattr(t.config, key) for t in plan.trials}) > 1]
    rows = [timing_row(members[0], varying, len(members), timings[key]) for key, members in configs.items()]
    return PlanEstimate(sweep_estimate(trials, at_once, isolate), rows)
