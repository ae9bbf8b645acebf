"""One trial shape (core/shapes.py) for the slots, the sweep's header and status's ETA, and one TorchTrainer builder
(cluster/trainer.py) for every Ray Train run: no Ray cluster needed."""

from __future__ import annotations

import re
from pathlib import Path

from cifar_ray.cluster import placement
from cifar_ray.cluster.dispatcher import RunTrial
from cifar_ray.core import runlog, status
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.shapes import SHAPE_KEYS, TrialShape, trial_shape
from cifar_ray.core.storage import StoragePath
from cifar_ray.core.sweep import build_plan

PACKAGE = Path(__file__).resolve().parent.parent / "cifar_ray"


def resolved_plan(grid: dict, **base):
    document = {"name": "shapes", "base": {"dataset": "synthetic", "batch_size": 128} | base, "grid": grid}
    return placement.resolve_plan(build_plan(document), {"gpus": 1.0 if base.get("use_gpu") == "true" else 0.0})


def test_a_shape_is_its_workers_their_resources_backend_and_strategy():
    assert trial_shape(TrainConfig()).key == "1x[CPU=1]/auto/ddp"
    quarter = TrainConfig(use_gpu="true", gpus_per_worker=0.25, cpus_per_worker=2).resolved(True)
    assert (trial_shape(quarter).key, trial_shape(quarter).label) == (
        "1x[CPU=2,GPU=0.25]/nccl/ddp",
        "1 worker x 2 CPU + 0.25 GPU (nccl)",
    )
    dp = TrainConfig(use_gpu="true", strategy="dp", workers=4)  # one process drives the four GPUs
    assert (trial_shape(dp).workers, trial_shape(dp).worker_resources) == (1, {"CPU": 1.0, "GPU": 4.0})
    for cfg in (TrainConfig(workers=4), TrainConfig(strategy="single"), dp):
        assert trial_shape(cfg).workers == cfg.ray_workers
    assert trial_shape(TrainConfig(workers=2)).label == "2 workers x 1 CPU"
    assert trial_shape(TrainConfig(strategy="single")).label == "1 worker x 1 CPU (single)"


def test_a_trial_json_config_has_the_shape_of_its_train_config():
    """status reads the dict the driver wrote; a dict lacking keys (older or hand-written) gets the defaults."""
    for cfg in (TrainConfig(workers=2, backend="gloo"), TrainConfig(use_gpu="true", gpus_per_worker=0.5)):
        assert trial_shape(cfg.model_dump()) == trial_shape(cfg)
    assert trial_shape({"workers": 2}) == trial_shape(TrainConfig(workers=2))
    assert set(SHAPE_KEYS) <= set(TrainConfig.model_fields)


def test_status_groups_trials_by_the_shape_the_slots_run_them_in(tmp_path):
    """The slots' shapes (RunTrial.shape) and status's ETA terms, from the trial.json configs the driver writes,
    split the same trials the same way: nccl and gloo trials of one size are two shapes (status once pooled them)."""
    plans = [
        resolved_plan({"backend": ["nccl", "gloo"], "seed": [0, 1]}, use_gpu="true"),
        resolved_plan({"workers": [1, 2], "cpus_per_worker": [1, 2]}),
        resolved_plan({"strategy": ["single", "ddp"], "seed": [0, 1]}),
    ]
    for index, plan in enumerate(plans):
        run_dir = tmp_path / f"run{index}"
        runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": plan.name, "trials": [t.name for t in plan.trials]})
        for trial in plan.trials:
            runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "pending"})
        slot_shapes = {}
        for trial in plan.trials:
            slot_shapes.setdefault(RunTrial.of(trial, StoragePath.of(run_dir)).shape, []).append(trial.name)
        state = status.load_state(run_dir, now=0.0)
        status_shapes = [shape.shape for shape in state.shapes]
        assert len(status_shapes) == len(slot_shapes) > 1
        assert [TrialShape(**shape).key for shape in status_shapes] == list(slot_shapes)


def test_every_ray_train_run_is_built_by_the_one_builder():
    trainer = r"(?:TorchTrainer|DataParallelTrainer)"
    builders = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if re.search(rf"import .*\b{trainer}\b|\b{trainer}\(", p.read_text())
    }
    # and the bench's peer: plain Tune over a TorchTrainer per trial, what a user would write instead of a sweep
    assert builders == {"cluster/trainer.py", "cluster/bench_peers.py"}
    callers = {p.name for p in PACKAGE.rglob("*.py") if re.search(r"\btorch_trainer\(", p.read_text())}
    assert callers == {"trainer.py", "slots.py", "checks.py"}


def test_the_builder_gives_a_config_its_shape_storage_and_restarts(tmp_path):
    from cifar_ray.cluster.trainer import TrainRun, torch_trainer

    cfg = TrainConfig(workers=2, cpus_per_worker=2, backend="gloo")
    trainer = torch_trainer(print, {"a": 1}, cfg, TrainRun("slot-x", StoragePath.of(tmp_path), restarts=3))
    scaling, run = trainer.scaling_config, trainer.run_config
    assert (scaling.num_workers, scaling.use_gpu, scaling.resources_per_worker) == (2, False, {"CPU": 2.0})
    assert trainer.train_loop_config == {"a": 1}
    assert (run.name, run.storage_path, run.failure_config.max_failures) == ("slot-x", str(tmp_path), 3)
