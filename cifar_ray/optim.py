"""Optimizers and learning-rate schedules, chosen by name."""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

from .config import TrainConfig

Params = Iterable[torch.nn.Parameter]

OPTIMIZERS: dict[str, Callable[[Params, TrainConfig], torch.optim.Optimizer]] = {
    "sgd": lambda p, c: torch.optim.SGD(p, lr=c.lr, weight_decay=c.weight_decay),
    "momentum": lambda p, c: torch.optim.SGD(p, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay),
    "nesterov": lambda p, c: torch.optim.SGD(p, lr=c.lr, momentum=c.momentum, nesterov=c.momentum > 0, weight_decay=c.weight_decay),
    "adam": lambda p, c: torch.optim.Adam(p, lr=c.lr, betas=(c.momentum, 0.999), weight_decay=c.weight_decay),
    "adamw": lambda p, c: torch.optim.AdamW(p, lr=c.lr, betas=(c.momentum, 0.999), weight_decay=c.weight_decay),
    # Plain RMSprop (Hinton's, no momentum), as compared in the course; lr ~1e-3 suits it.
    "rmsprop": lambda p, c: torch.optim.RMSprop(p, lr=c.lr, weight_decay=c.weight_decay),
}


def build_optimizer(params: Params, cfg: TrainConfig) -> torch.optim.Optimizer:
    return OPTIMIZERS[cfg.optimizer](params, cfg)


# Multiplier of the peak LR as a function of progress t in [0, 1] through the post-warm-up steps.
SCHEDULES: dict[str, Callable[[float], float]] = {
    "constant": lambda t: 1.0,
    "cosine": lambda t: 0.5 * (1.0 + math.cos(math.pi * t)),
    # Linear rise to the peak at 25% then linear decay to 0: airbench's triangular schedule.
    "onecycle": lambda t: 0.1 + 0.9 * t / 0.25 if t < 0.25 else (1.0 - t) / 0.75,
    "step": lambda t: 0.1 ** ((t >= 0.5) + (t >= 0.75)),
}


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """LR factor for optimizer step `step` (0-based): linear warm-up to 1 over `warmup_steps`
    (step s uses (s+1)/warmup_steps, so the first step is not wasted at 0), then the schedule
    over the remaining steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    remaining = max(1, total_steps - warmup_steps)
    return SCHEDULES[schedule](min(1.0, (step - warmup_steps) / remaining))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    total = steps_per_epoch * cfg.epochs
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total, warmup, cfg.scheduler))
