"""The one place a Ray Train run is built from a trial config: a slot's (slots.run_slot) and `cifar-ray check`'s DDP
run (checks.run_ddp) get the same backend, workers, per-worker resources, storage and restarts for the same config."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.config import TrainConfig
from ..core.shapes import trial_shape
from ..core.storage import StoragePath


@dataclass(frozen=True)
class TrainRun:
    """Where a Ray Train run goes and how it is watched: named `name` under `storage`, its worker group restarted up
    to `restarts` times, Ray Train `callbacks` on its controller."""

    name: str
    storage: StoragePath
    restarts: int = 0
    callbacks: Sequence[Any] = ()


def torch_trainer(train_loop: Callable[[dict], None], loop_config: dict[str, Any], cfg: TrainConfig, run: TrainRun):
    """A Ray Train data-parallel trainer of `cfg`'s shape running `train_loop(loop_config)` on every worker with a
    torch process group (TorchTrainer's, set up without torch outside the workers: cluster/backend.py), as `run`
    says."""
    import ray.train
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from .backend import TorchProcessGroup

    class FixedWorkers(FixedScalingPolicy):
        """Ray Train's fixed-size policy without its AutoscalingCoordinator: a detached actor (a process importing
        Ray Data, started by the first run of a Ray session) that the controller asks, waiting up to 5 s before its
        first worker group starts, to tell an autoscaler of the run's resources. A sweep sizes its slots to the
        cluster it finds (placement.capacity_of), and a worker group's placement group already asks the cluster for
        its bundles."""

        def after_controller_start(self, train_run_context) -> None:
            pass

        def _maybe_send_resource_request(self) -> None:
            pass

    class LeanTrainer(DataParallelTrainer):
        """Without what starts a process per run or per session that no run of ours uses: DatasetsCallback's
        DatasetManager actor (each worker group, even with no Ray Dataset; our workers load their own data), the
        AutoscalingCoordinator (FixedWorkers) and PlacementGroupCleanerCallback's PlacementGroupCleaner, a detached
        actor per run (a process importing Ray Train, then a state-API query a second) that removes the worker
        group's placement group if the controller dies. The run's owner does that instead: a slot's callbacks record
        each worker group's placement group (slots.slot_callbacks) and the driver removes what an ended slot left
        (slots.end_slot_runs); cifar-ray check's run ends with its driver, and with it the job's placement groups."""

        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            unused = (
                (PlacementGroupCleanerCallback,) if self.datasets else (PlacementGroupCleanerCallback, DatasetsCallback)
            )
            return [callback for callback in callbacks if not isinstance(callback, unused)]

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            controller_init_kwargs["scaling_policy"] = FixedWorkers(self.scaling_config)
            return super()._initialize_and_run_controller(**controller_init_kwargs)

    shape = trial_shape(cfg)
    return LeanTrainer(
        train_loop,
        train_loop_config=loop_config,
        backend_config=TorchProcessGroup(backend=shape.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=shape.workers, use_gpu=shape.gpus > 0, resources_per_worker=shape.worker_resources
        ),
        run_config=ray.train.RunConfig(
            name=run.name,
            **run.storage.ray_storage(),
            failure_config=ray.train.FailureConfig(max_failures=run.restarts),
            callbacks=list(run.callbacks),
        ),
    )
