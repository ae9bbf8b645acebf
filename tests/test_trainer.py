"""The one place a Ray Train run is built (cluster/trainer.py): a slot's run starts no process it does not use."""

from __future__ import annotations

import json

import pytest

from cifar_ray.cluster.trainer import TrainRun, torch_trainer
from cifar_ray.core.config import parse_config
from cifar_ray.core.storage import StoragePath


def test_a_slots_ray_train_run_starts_no_dataset_manager(tmp_path):
    """Ray Train's DatasetsCallback starts a DatasetManager actor for every worker group even without Ray Datasets;
    our workers load their own data, so it is left out, and the callbacks that set the workers up stay."""
    run = TrainRun("t", StoragePath.of(tmp_path))
    trainer = torch_trainer(lambda config: None, {}, parse_config({"dataset": "synthetic"}), run)
    names = [type(callback).__name__ for callback in trainer._create_default_callbacks()]
    assert "DatasetsCallback" not in names
    assert {"AcceleratorSetupCallback", "BackendSetupCallback", "UserCallbackHandler"} <= set(names)


def test_the_processes_that_build_and_run_a_slots_trainer_import_no_torch(tmp_path):
    """The driver builds the trainer and Ray Train's controller unpickles its backend config and runs its backend's
    set-up; neither trains, and Ray's TorchConfig made each import torch (~2-4 CPU-s on the start's critical path).
    Only the workers import it (cluster/backend.py)."""
    import subprocess
    import sys

    script = f"""
import pickle, sys
import cloudpickle
from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
from cifar_ray.cluster.trainer import TrainRun, torch_trainer
from cifar_ray.core.config import parse_config
from cifar_ray.core.storage import StoragePath
cfg = parse_config({{"dataset": "synthetic", "workers": 2, "backend": "gloo"}})
trainer = torch_trainer(lambda config: None, {{}}, cfg, TrainRun("t", StoragePath.of({str(tmp_path)!r})))
config = pickle.loads(cloudpickle.dumps(trainer.backend_config))  # as the controller gets it
BackendSetupCallback(config)
trainer._create_default_callbacks()
assert config.backend == "gloo" and config.train_func_context and config.framework.name == "TORCH"
assert "torch" not in sys.modules, "torch imported"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_ray_train_run_of_ours_asks_no_autoscaling_coordinator(tmp_path, monkeypatch):
    """Ray Train's fixed-size policy asks an AutoscalingCoordinator (a detached actor: a process importing Ray Data,
    waited for up to 5 s before the first worker group starts) for the run's resources; the controller that
    LeanTrainer.start builds (a slot's run, `cifar-ray check`'s) asks none. The stock policy, exercised the same way,
    does ask: the check can fail. No Ray: the controller's actor class is a stand-in that keeps what it is given."""
    import types

    import ray
    from ray.train.v2._internal import util as ray_train_util
    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as client
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    asked: list[str] = []
    for method in ("send_resource_request", "maybe_send_resource_request"):
        monkeypatch.setattr(client.TrainAutoscalingCoordinatorClient, method, lambda *a, m=method, **k: asked.append(m))
    trainer = torch_trainer(
        lambda config: None, {}, parse_config({"dataset": "synthetic"}), TrainRun("t", StoragePath.of(tmp_path))
    )
    given: dict = {}

    class Controller:
        @staticmethod
        def remote(**kwargs):
            given.update(kwargs)
            return types.SimpleNamespace(run=types.SimpleNamespace(remote=lambda: "ended"))

    monkeypatch.setattr(ray, "remote", lambda **options: lambda actor_class: Controller)
    monkeypatch.setattr(ray_train_util, "ObjectRefWrapper", lambda train_fn: train_fn)  # else ray.put starts a Ray
    node = types.SimpleNamespace(get_node_id=lambda: "n", gcs_address="a")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: node)
    assert trainer.start().ended == "ended"
    stock = FixedScalingPolicy(trainer.scaling_config)

    def exercise(policy) -> list[str]:  # what a controller does with its policy before and while its group runs
        asked.clear()
        policy.after_controller_start(types.SimpleNamespace(run_id="r"))
        policy.make_decision_for_non_running_worker_group()
        policy.make_decision_for_running_worker_group(None, None)
        return list(asked)

    assert exercise(given["scaling_policy"]) == []
    assert exercise(stock) != []


def test_the_driver_reads_gpus_and_versions_without_importing_torch(tmp_path):
    """Before its slots start, the driver counts the local GPUs for Ray's start and records the versions in
    sweep.json: importing torch for either (~2 s) would delay the first trial. The versions are torch's own. On a
    machine with no GPU, neither the session's provenance nor the live view's TensorBoard writer (both made beside
    the first trial's start) imports it either."""
    import subprocess
    import sys

    import torch

    script = f"""
import json, sys
from cifar_ray.cluster.session import local_resources, write_provenance
from cifar_ray.core import sysinfo
from cifar_ray.core.storage import StoragePath
resources = local_resources()
assert "torch" not in sys.modules, "torch imported"
print(json.dumps(sysinfo.versions()))
write_provenance(StoragePath.of({str(tmp_path)!r}), 1)
from cifar_ray.cluster.live_view import live_tensorboard, logged_epochs
live_tensorboard(StoragePath.of({str(tmp_path)!r}))  # the live view's callback, as new_tuner makes it
from tensorboardX import SummaryWriter
with SummaryWriter({str(tmp_path)!r}) as writer:  # and its writer works without torch
    writer.add_scalar("ray/tune/timesteps_total", 1.0, 3)
assert logged_epochs({str(tmp_path)!r}) == {{3}}
print(json.dumps({{"gpus": resources["GPU"], "torch": "torch" in sys.modules}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    versions, provenance = map(json.loads, done.stdout.splitlines()[-2:])
    assert versions["torch"] == torch.__version__ and versions["cuda"] == (torch.version.cuda or "none")
    assert list(tmp_path.glob("**/session-1.json")), "no provenance written"
    if provenance["gpus"] == 0:
        assert not provenance["torch"], "the driver imported torch on a machine with no GPU"


@pytest.mark.usefixtures("ray_cluster")
def test_on_the_local_ray_a_slots_controller_gets_no_runtime_env_yet_holds_ray_trains_variables(tmp_path, monkeypatch):
    """A runtime env of its own gives an actor a new process rather than a prestarted one, and the job's own gives
    every process one: on the local Ray init_ray started, the job has none, the controller none and its workers none
    of Ray Train's (the run's own only), since every Ray process inherited the variables Ray Train propagates. One
    set after Ray started goes as a runtime env again, to the controller and from it to the workers."""
    import os

    import ray
    from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR as BLOCKING_GET
    from ray.train.v2._internal.constants import HEALTH_CHECK_INTERVAL_S_ENV_VAR as HEALTH_CHECK
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    from cifar_ray.cluster.session import RAY_ENV_DEFAULTS, inherited_by_ray_processes

    assert ray.get_runtime_context().runtime_env == {}
    propagated = get_env_vars_to_propagate()
    assert propagated[HEALTH_CHECK] == RAY_ENV_DEFAULTS[HEALTH_CHECK] and propagated[BLOCKING_GET] == "0"
    assert inherited_by_ray_processes(propagated)
    assert not inherited_by_ray_processes({**propagated, HEALTH_CHECK: "7"})

    @ray.remote(num_cpus=0)
    def environment(keys: list[str]) -> dict:
        return {key: os.environ.get(key) for key in keys}

    assert ray.get(environment.remote(list(propagated))) == propagated  # a process without a runtime env holds them

    class Built(Exception):
        pass

    given: list[tuple[dict, type]] = []
    real_remote = ray.remote

    def actor_options(*args, **kwargs):
        if "label_selector" not in kwargs:  # another ray.remote than the controller's (a module imported now)
            return real_remote(*args, **kwargs)

        def controller_of(cls):
            given.append((kwargs, cls))
            raise Built  # nothing started

        return controller_of

    monkeypatch.setattr(ray, "remote", actor_options)
    trainer = torch_trainer(
        lambda config: None, {}, parse_config({"dataset": "synthetic"}), TrainRun("t", StoragePath.of(tmp_path))
    )
    with pytest.raises(Built):
        trainer.start()
    monkeypatch.setenv(HEALTH_CHECK, "7")  # after Ray's start: its processes hold the old value
    with pytest.raises(Built):
        trainer.start()
    (inherited, inheriting_controller), (set_since, train_controller) = given
    assert "runtime_env" not in inherited
    workers_env = inheriting_controller.worker_group_cls._get_worker_runtime_env
    assert workers_env({}) is None and workers_env({"env_vars": {"A": "1"}}) == {"env_vars": {"A": "1"}}
    assert set_since["runtime_env"] == {"env_vars": {**propagated, HEALTH_CHECK: "7"}}
    assert train_controller.worker_group_cls._get_worker_runtime_env({}) == set_since["runtime_env"]  # Ray Train's own
    # Ray's name for both: a process is titled ray::TrainController, as bench.STARTUP_PROCESSES reads it
    assert inheriting_controller.__name__ == train_controller.__name__ == "TrainController"
