"""The one place a Ray Train run is built from a trial config: a slot's (slots.start_slot) and `cifar-ray check`'s DDP
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


@dataclass(frozen=True)
class StartedRun:
    """A Ray Train run started without waiting for it (LeanTrainer.start): its controller actor and the reference that
    resolves when the run ends (then `ended_with` says how)."""

    controller: Any
    ended: Any  # ObjectRef of controller.run

    def ended_with(self) -> BaseException | None:
        """The run's error once it has ended (a failed training, a controller lost on the way), or None."""
        import ray

        try:
            ray.get(self.ended)
            return ray.get(self.controller.get_result.remote()).error
        except Exception as error:  # the controller died, was killed, or its run raised
            return error


def torch_trainer(train_loop: Callable[[dict], None], loop_config: dict[str, Any], cfg: TrainConfig, run: TrainRun):
    """A Ray Train data-parallel trainer of `cfg`'s shape running `train_loop(loop_config)` on every worker with a
    torch process group (TorchTrainer's, set up without torch outside the workers: cluster/backend.py), as `run`
    says."""
    import ray
    import ray.train
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.controller import TrainController as RayTrainController
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
    from ray.train.v2._internal.execution.worker_group import WorkerGroup
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

    class InheritingWorkerGroup(WorkerGroup):
        """Ray Train's worker group, its workers given only the run's own runtime env (none of ours): not the
        variables Ray Train propagates, which every process of the local Ray init_ray started already holds
        (session.inherited_by_ray_processes). A worker with a runtime env of its own gets a new process, started for
        it through the runtime-env agent; without, a prestarted one."""

        @staticmethod
        def _get_worker_runtime_env(custom_runtime_env):
            return dict(custom_runtime_env) or None

    class TrainController(RayTrainController):  # Ray's name: its process is still titled ray::TrainController
        """Ray Train's controller, its workers in an InheritingWorkerGroup: for a Ray whose processes inherit the
        propagated variables."""

        worker_group_cls = InheritingWorkerGroup

    class LeanTrainer(DataParallelTrainer):
        """Without what starts a process per run or per session that no run of ours uses: DatasetsCallback's
        DatasetManager actor (each worker group, even with no Ray Dataset; our workers load their own data), the
        AutoscalingCoordinator (FixedWorkers) and PlacementGroupCleanerCallback's PlacementGroupCleaner, a detached
        actor per run (a process importing Ray Train, then a state-API query a second) that removes the worker
        group's placement group if the controller dies. The run's owner does that instead: the driver removes the
        placement groups an ended slot's controller made (slots.end_slot_runs); cifar-ray check's run ends with its
        driver, and with it the job's placement groups."""

        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            unused = (
                (PlacementGroupCleanerCallback,) if self.datasets else (PlacementGroupCleanerCallback, DatasetsCallback)
            )
            return [callback for callback in callbacks if not isinstance(callback, unused)]

        def start(self) -> StartedRun:
            """fit() without waiting for it, from this process: the run's controller, started on this node as fit()
            starts it (Ray 2.60's DataParallelTrainer.fit and _initialize_and_run_controller, less their blocking
            gets and Ctrl-C handler), so that no process of its own has to wait in fit() (a slot's run: the driver
            starts it; `cifar-ray check`'s run: it waits for StartedRun.ended_with)."""
            from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR
            from ray.train.v2._internal.constants import (
                DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE,
                get_env_vars_to_propagate,
            )
            from ray.train.v2._internal.execution.failure_handling import create_failure_policy
            from ray.train.v2._internal.util import ObjectRefWrapper

            from .session import inherited_by_ray_processes

            env_vars = get_env_vars_to_propagate()
            env_vars.setdefault(
                RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR, DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE
            )
            node = {ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()}
            # No runtime env where Ray's processes already hold those variables: then prestarted processes can serve
            # the controller and its workers, rather than new ones started for them on the path of a sweep's start and
            # a shape switch.
            inherited = inherited_by_ray_processes(env_vars)
            runtime_env = {} if inherited else {"runtime_env": {"env_vars": env_vars}}
            controller_class = ray.remote(num_cpus=0, label_selector=node, **runtime_env)
            controller = controller_class(TrainController if inherited else RayTrainController).remote(
                train_fn_ref=ObjectRefWrapper(self._get_train_func()),
                scaling_policy=FixedWorkers(self.scaling_config),
                failure_policy=create_failure_policy(self.run_config.failure_config),
                train_run_context=self.train_run_context,
                callbacks=self._create_default_callbacks(),
                validation_config=self.validation_config,
            )
            return StartedRun(controller, controller.run.remote())

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
