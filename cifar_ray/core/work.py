"""The work a sweep's trials will do, from their configs alone: images trained, the --dry-run's table and line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import TrainConfig
from .datasets import test_images
from .sweep import SweepPlan
from .text import counted


@dataclass(frozen=True)
class TrialWork:
    """The size of one trial's work, from its config and the full datasets' sizes."""

    dataset: str
    train_images: int  # after train_subset
    test_images: int  # after test_subset
    epochs: int
    images_trained: int  # over all epochs: an epoch trains whole optimizer steps only


def trial_work(config: TrainConfig) -> TrialWork:
    train = config.train_images
    test = test_images(config.dataset, config.test_subset)
    # an epoch is floor(n / effective_batch) optimizer steps; the rest is skipped (data.train_step_indices)
    per_epoch = train // config.effective_batch * config.effective_batch
    return TrialWork(config.dataset, train, test, config.epochs, per_epoch * config.epochs)


def trial_table(plan: SweepPlan) -> list[dict[str, Any]]:
    """Rows for --dry-run and the summary: swept values, workers, per-worker and effective batch, and
    the images each trial trains."""
    return [
        {
            "trial": t.name,
            **t.swept,
            "workers": t.config.workers,
            "strategy": t.config.strategy,
            "per_worker_batch": t.config.per_worker_batch,
            "effective_batch": t.config.effective_batch,
            "epochs": t.config.epochs,
            "images_trained": trial_work(t.config).images_trained,
        }
        for t in plan.trials
    ]


def _span(values: list[Any]) -> str:
    """One value, or the range of values the trials have: '50,000' or '4,992-5,000'; 'cifar10/synthetic'."""
    if all(isinstance(value, int) for value in values):
        low, high = min(values), max(values)
        return f"{low:,}" if low == high else f"{low:,}-{high:,}"
    return "/".join(dict.fromkeys(values))


def work_summary(plan: SweepPlan) -> str:
    """The --dry-run's closing line: what the sweep will train, e.g. '4 trials · dataset synthetic ·
    5,000 train / 1,000 test images per trial · 3 epochs · 59,904 images trained in all (14,976 per trial)'."""
    works = [trial_work(t.config) for t in plan.trials]
    trained = [w.images_trained for w in works]
    return (
        f"{counted(f'{len(works):,}', 'trial')} · dataset {_span([w.dataset for w in works])} · "
        f"{_span([w.train_images for w in works])} train / {_span([w.test_images for w in works])} test images "
        f"per trial · {counted(_span([w.epochs for w in works]), 'epoch')} · {sum(trained):,} images trained "
        f"in all ({_span(trained)} per trial)"
    )
