"""The one place a Ray Train run is built (cluster/trainer.py): a slot's run starts no process it does not use."""

from __future__ import annotations

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
    """The slot task builds the trainer and Ray Train's controller unpickles its backend config and runs its
    backend's set-up; neither trains, and Ray's TorchConfig made each import torch (~2-4 CPU-s on the start's
    critical path). Only the workers import it (cluster/backend.py)."""
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
