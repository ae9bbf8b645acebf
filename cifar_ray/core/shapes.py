"""A trial's shape: what decides whether two trials can run one after the other in the same worker group (a slot)
and share its resources. The slots group trials by it, the sweep's header counts trials per shape, and status's
ETA is summed over shapes; all read it here, from a TrainConfig or from a trial.json's config (no torch, no Ray)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import TrainConfig

# The config keys a shape is made of: the workers and each one's resources, the backend, the strategy.
SHAPE_KEYS = ("workers", "cpus_per_worker", "use_gpu", "gpus_per_worker", "backend", "strategy")


@dataclasses.dataclass(frozen=True)
class TrialShape:
    workers: int  # Ray Train worker processes (dp: one, driving all its GPUs)
    cpus: float  # per worker
    gpus: float  # per worker; 0 without use_gpu
    backend: str
    strategy: str

    @property
    def worker_resources(self) -> dict[str, float]:
        """Resources of ONE Ray Train worker."""
        return {"CPU": self.cpus} | ({"GPU": self.gpus} if self.gpus else {})

    @property
    def key(self) -> str:
        """`1x[CPU=1]/gloo/ddp`: the name the slots and the Dispatcher file trials under."""
        resources = ",".join(f"{k}={v:g}" for k, v in sorted(self.worker_resources.items()))
        return f"{self.workers}x[{resources}]/{self.backend}/{self.strategy}"

    @property
    def label(self) -> str:
        """`2 workers x 1 CPU` for people: the backend where GPUs make it a choice, a strategy other than ddp."""
        gpus = f" + {self.gpus:g} GPU" if self.gpus else ""
        choices = ([self.backend] if self.gpus else []) + ([self.strategy] if self.strategy != "ddp" else [])
        extra = f" ({', '.join(choices)})" if choices else ""
        return f"{self.workers} worker{'s' * (self.workers > 1)} x {self.cpus:g} CPU{gpus}{extra}"


def trial_shape(config: TrainConfig | Mapping[str, Any]) -> TrialShape:
    """The shape of a trial's config. A trial.json's config dict lacks keys only when written by hand or by an
    older version: TrainConfig's defaults fill them (status reads complete ones without importing pydantic)."""
    values = config if isinstance(config, Mapping) else {key: getattr(config, key) for key in SHAPE_KEYS}
    if missing := [key for key in SHAPE_KEYS if key not in values]:
        from .config import TrainConfig

        values = {key: TrainConfig.model_fields[key].default for key in missing} | dict(values)
    dp = values["strategy"] == "dp"  # one process drives all the trial's GPUs (TrainConfig.ray_workers)
    gpus = (values["workers"] if dp else values["gpus_per_worker"]) if values["use_gpu"] == "true" else 0
    workers = 1 if dp else values["workers"]
    return TrialShape(workers, float(values["cpus_per_worker"]), float(gpus), values["backend"], values["strategy"])
