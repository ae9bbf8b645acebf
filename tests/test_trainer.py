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
