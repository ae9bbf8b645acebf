"""Optimizers and learning-rate schedules, chosen by name; large-batch LR scaling and LARS.

The LR of optimizer step s is `peak_lr(cfg) * lr_multiplier(s, ...)` (`lr_at_step`): the peak is
`lr` scaled with the effective batch (`lr_scaling`, Goyal et al. 2017), the multiplier a linear
warm-up from 0 followed by the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from ..core.config import TrainConfig

Params = Iterable[torch.nn.Parameter]


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You, Gitman & Ginsburg 2017, Algorithm 1), per tensor:

        trust = eta * ||w|| / (||g|| + weight_decay * ||w||)      (1 if ||w|| or ||g|| is 0)
        v     = momentum * v + lr * trust * (g + weight_decay * w)
        w     = w - v

    Tensors with at most one dimension (biases, norm scales and shifts) skip the adaptation and
    the weight decay: for them v = momentum * v + lr * g. The LR sits inside the momentum buffer,
    as in the paper. No host synchronisation: the trust ratio stays a device tensor."""

    def __init__(self, params: Params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 0.001):
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or eta <= 0:
            raise ValueError(
                f"invalid LARS hyperparameters: lr={lr}, momentum={momentum}, weight_decay={weight_decay}, eta={eta}"
            )
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta})

    @staticmethod
    def trust_ratio(weight: torch.Tensor, grad: torch.Tensor, eta: float, weight_decay: float) -> torch.Tensor:
        w_norm, g_norm = torch.linalg.vector_norm(weight), torch.linalg.vector_norm(grad)
        ratio = eta * w_norm / (g_norm + weight_decay * w_norm)
        return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, weight_decay, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if param.ndim > 1:
                    trust = self.trust_ratio(param, grad, eta, weight_decay)
                    update = grad.add(param, alpha=weight_decay).mul_(trust)
                else:
                    update = grad
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = update.mul(lr)
                else:
                    state["momentum_buffer"].mul_(momentum).add_(update, alpha=lr)
                param.sub_(state["momentum_buffer"])
        return loss


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda p, c, **fast: torch.optim.SGD(p, lr=c.lr, weight_decay=c.weight_decay, **fast),
    "momentum": lambda p, c, **fast: torch.optim.SGD(
        p, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay, **fast
    ),
    "nesterov": lambda p, c, **fast: torch.optim.SGD(
        p, lr=c.lr, momentum=c.momentum, nesterov=c.momentum > 0, weight_decay=c.weight_decay, **fast
    ),
    "adam": lambda p, c, **fast: torch.optim.Adam(
        p, lr=c.lr, betas=(c.momentum, 0.999), weight_decay=c.weight_decay, **fast
    ),
    "adamw": lambda p, c, **fast: torch.optim.AdamW(
        p, lr=c.lr, betas=(c.momentum, 0.999), weight_decay=c.weight_decay, **fast
    ),
    # Plain RMSprop (Hinton's, no momentum), as compared in the course; lr ~1e-3 suits it.
    "rmsprop": lambda p, c, **fast: torch.optim.RMSprop(p, lr=c.lr, weight_decay=c.weight_decay, **fast),
    "lars": lambda p, c, **_: LARS(p, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay, eta=c.lars_eta),
}
# On CUDA, one fused kernel updates all parameters instead of a kernel per tensor (torch.optim docs:
# fused > foreach > for-loop). On CPU torch's default (foreach where supported) stays.
FUSED_ON_CUDA = ("sgd", "momentum", "nesterov", "adam", "adamw")


# Factor of the peak LR as a function of k = effective batch / base batch.
LR_SCALING: dict[str, Callable[[float], float]] = {
    "none": lambda k: 1.0,
    "linear": lambda k: k,  # Goyal et al. 2017: "multiply the LR by k", with warm-up
    "sqrt": lambda k: math.sqrt(k),  # Krizhevsky 2014 / Hoffer et al. 2017: keeps the gradient noise scale
}


def scaled_lr(lr: float, effective_batch: int, base_batch: int, rule: str) -> float:
    """Peak LR for `effective_batch` when `lr` is right for `base_batch`."""
    return lr * LR_SCALING[rule](effective_batch / base_batch)


def peak_lr(cfg: TrainConfig) -> float:
    return scaled_lr(cfg.lr, cfg.effective_batch, cfg.base_batch, cfg.lr_scaling)


def build_optimizer(params: Params, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer at the (scaled) peak LR; build_scheduler multiplies it step by step."""
    fast = {"fused": True} if cfg.use_gpu == "true" and cfg.optimizer in FUSED_ON_CUDA else {}
    return OPTIMIZERS[cfg.optimizer](params, cfg.model_copy(update={"lr": peak_lr(cfg)}), **fast)


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


def schedule_steps(cfg: TrainConfig, steps_per_epoch: int) -> tuple[int, int]:
    """(total optimizer steps, warm-up steps) of a run."""
    return steps_per_epoch * cfg.epochs, round(cfg.warmup_epochs * steps_per_epoch)


def lr_at_step(step: int, cfg: TrainConfig, steps_per_epoch: int) -> float:
    """The LR optimizer step `step` (0-based) uses: scaled peak x warm-up/schedule multiplier."""
    total, warmup = schedule_steps(cfg, steps_per_epoch)
    return peak_lr(cfg) * lr_multiplier(step, total, warmup, cfg.scheduler)


def epoch_lrs(cfg: TrainConfig, epoch: int, steps_per_epoch: int) -> tuple[float, float]:
    """(the last, the highest) LR of epoch `epoch`'s (1-based) optimizer steps: the highest is above the last
    while warm-up or onecycle's rise lifts the LR through the epoch."""
    rates = [
        lr_at_step(step, cfg, steps_per_epoch) for step in range((epoch - 1) * steps_per_epoch, epoch * steps_per_epoch)
    ]
    return rates[-1], max(rates)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Multiplies the optimizer's LR (build_optimizer's peak) so that step s runs at lr_at_step(s)."""
    total, warmup = schedule_steps(cfg, steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total, warmup, cfg.scheduler))
