"""Running a sweep plan on Ray: one Tune trial per config, each a Ray Train `TorchTrainer` run.

Ray 2.60 runs Train V2, where `Tuner(TorchTrainer(...))` is no longer allowed: Tune runs the plain
function `run_trial` per trial, which builds and fits a TorchTrainer and forwards its reports to
Tune with `TuneReportCallback` (ray-project/ray doc/source/train/user-guides/
hyperparameter-optimization.rst).

Packing: a trial's driver needs no core, its workers do. Each trial reserves the cores and GPUs of
its workers in custom resources that mirror the cluster's (RESOURCE_CPU, RESOURCE_GPU), so Tune
starts a trial only when its workers will fit: two 1-worker trials run side by side on 2 cores,
2-worker trials one after another, and no trial's driver holds a core its workers wait for (which
deadlocks on small machines).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

from . import runlog, sysinfo
from .config import ConfigError, TrainConfig
from .sweep import SweepPlan, TrialSpec

RESOURCE_CPU = "cifar_ray_cpu"
RESOURCE_GPU = "cifar_ray_gpu"

# Set before Ray starts so every Ray process inherits them.
RAY_ENV_DEFAULTS = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # else a core_worker error line per trial
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # measured: trial overhead 16.0 s -> 10.6 s
    "RAY_AIR_NEW_OUTPUT": "0",
    "RAY_DEDUP_LOGS": "1",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
}
NOISY_LOGGERS = (
    "ray.train.v2._internal.execution.controller.placement_group_cleaner",
    "ray.train.v2._internal.execution.context",
    "ray.train.v2._internal.execution.controller.controller",
    "ray.tune",
    "ray.train",
)


def quiet_ray_logs() -> None:
    """Runs in every Ray worker process (worker_process_setup_hook) and in the driver."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def init_ray(address: str | None = None, verbose: bool = False, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Connect to `address`, or start an embedded local Ray. Returns True when we started it
    (and so must shut it down). An already initialised Ray (tests) is used as is."""
    import ray

    if ray.is_initialized():
        return False
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not verbose:
        quiet_ray_logs()
    options: dict[str, Any] = {
        "log_to_driver": verbose,
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "configure_logging": True,
        "runtime_env": {"worker_process_setup_hook": "cifar_ray.orchestrate.quiet_ray_logs"} if not verbose else None,
    }
    if address:
        ray.init(address=address, **options)
    else:
        cpus = num_cpus or os.cpu_count() or 1
        gpus = num_gpus if num_gpus is not None else _local_gpu_count()
        ray.init(num_cpus=cpus, num_gpus=gpus, include_dashboard=False,
                 resources={RESOURCE_CPU: cpus, RESOURCE_GPU: gpus}, **options)
    return True


def _local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # a broken CUDA install means no usable GPU, not a crash
        return 0


def cluster_capacity() -> dict[str, float]:
    import ray

    total = ray.cluster_resources()
    return {"cpus": total.get("CPU", 0.0), "gpus": total.get("GPU", 0.0), "nodes": len([n for n in ray.nodes() if n.get("Alive")]),
            "slot_cpus": total.get(RESOURCE_CPU, 0.0), "slot_gpus": total.get(RESOURCE_GPU, 0.0)}


def worker_resources(cfg: TrainConfig) -> dict[str, float]:
    """Resources of ONE Ray Train worker (dp: the single worker holds all its GPUs)."""
    resources = {"CPU": float(cfg.cpus_per_worker)}
    if cfg.use_gpu == "true":
        resources["GPU"] = float(cfg.workers if cfg.strategy == "dp" else 1)
    return resources


def trial_resources(cfg: TrainConfig) -> dict[str, float]:
    """What a Tune trial (the driver of one TorchTrainer) reserves: its workers' total, in the
    mirror resources. "memory": 1 byte keeps Ray from rejecting a bundle with no CPU."""
    per_worker = worker_resources(cfg)
    reserve = {"CPU": 0.0, "memory": 1.0, RESOURCE_CPU: per_worker["CPU"] * cfg.ray_workers}
    if "GPU" in per_worker:
        reserve[RESOURCE_GPU] = per_worker["GPU"] * cfg.ray_workers
    return reserve


def check_fits(plan: SweepPlan, capacity: dict[str, float]) -> None:
    """A trial bigger than the cluster would wait forever: refuse it up front."""
    for trial in plan.trials:
        need = trial_resources(trial.config)
        if need[RESOURCE_CPU] > capacity["slot_cpus"]:
            raise ConfigError(
                f"trial {trial.name} needs {need[RESOURCE_CPU]:g} CPUs (workers={trial.config.workers} x "
                f"cpus_per_worker={trial.config.cpus_per_worker}) but the cluster has {capacity['slot_cpus']:g}"
            )
        if need.get(RESOURCE_GPU, 0) > capacity["slot_gpus"]:
            raise ConfigError(f"trial {trial.name} needs {need[RESOURCE_GPU]:g} GPUs but the cluster has {capacity['slot_gpus']:g}")


def resolve_plan(plan: SweepPlan, capacity: dict[str, float]) -> SweepPlan:
    """`auto` use_gpu/backend made concrete for this cluster, for every trial."""
    has_gpus = capacity["gpus"] > 0
    trials = [TrialSpec(t.index, t.name, t.swept, t.config.resolved(has_gpus)) for t in plan.trials]
    return SweepPlan(**{**plan.__dict__, "trials": trials})


def _failure_status(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error))
    return "oom" if ("OutOfMemoryError" in text or "MemoryError" in text) else "failed"


def _error_line(error: BaseException) -> str:
    """The root cause in one line (Ray wraps worker errors in several layers)."""
    text = "".join(traceback.format_exception_only(error)).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    causes = [line for line in lines if "Error" in line.split(":")[0] or "Exception" in line.split(":")[0]]
    return (causes[-1] if causes else lines[-1] if lines else repr(error))[:500]


def run_trial(tune_config: dict) -> None:
    """The Tune function trainable: one TorchTrainer fit for one trial spec."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from .train import train_loop_per_worker

    spec, run_dir = tune_config["trial"], Path(tune_config["run_dir"])
    cfg = TrainConfig(**spec["config"])
    trial_dir = run_dir / spec["name"]
    trial_file = trial_dir / runlog.TRIAL_FILE
    if runlog.read_json(trial_file).get("status") in ("finished", "diverged"):
        return  # done before the driver died; Tune's saved state may lag behind our log
    runlog.update_json(trial_file, **spec, status="running", error=None, started_at=runlog.now_iso())
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.model_dump(), "trial_dir": str(trial_dir)},
        torch_config=TorchConfig(backend=cfg.backend),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.ray_workers, use_gpu=cfg.use_gpu == "true",
                                               resources_per_worker=worker_resources(cfg)),
        # A stable name per trial: a restored sweep's trial finds its run and checkpoints again.
        run_config=ray.train.RunConfig(
            name="train", storage_path=str(trial_dir), callbacks=[TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
        ),
    )
    try:
        trainer.fit()
    except Exception as error:
        (trial_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
        runlog.update_json(trial_file, status=_failure_status(error), error=_error_line(error), finished_at=runlog.now_iso())
        raise
    epochs = runlog.read_epochs(trial_dir)
    diverged = [row["epoch"] for row in epochs if row.get("diverged")]
    status = "diverged" if diverged else "finished"
    runlog.update_json(trial_file, status=status, diverged_epoch=diverged[0] if diverged else None, finished_at=runlog.now_iso())


def format_epoch(trial: str, result: dict, epochs: int) -> str:
    return (
        f"{trial}  epoch {result['epoch']}/{epochs}  "
        f"train loss {result['train_loss']:.3f} acc {100 * result['train_acc']:5.1f}%  "
        f"test loss {result['test_loss']:.3f} acc {100 * result['test_acc']:5.1f}%  "
        f"{result['epoch_time_s']:.1f}s  {result['samples_per_s']:.0f} img/s  {result['peak_mem_mb']:.0f} MB"
        + ("  DIVERGED" if result.get("diverged") else "")
    )


def _print_progress(line: str) -> None:
    """Where EpochPrinter writes; run_plan points it at the caller's printer. A module-level hook,
    not a closure, because Tune pickles its callbacks with the experiment and a restored sweep
    must print to the new process's terminal."""
    _progress_printer[0](line)


_progress_printer: list[Callable[[str], None]] = [print]


def _trial_resources_of(config: dict):
    from ray import tune

    return tune.PlacementGroupFactory([trial_resources(TrainConfig(**config["trial"]["config"]))])


def _trial_folder_name(trial) -> str:
    return trial.config["trial"]["name"]


def _epoch_printer():
    from ray.tune import Callback

    class EpochPrinter(Callback):
        """One line per finished epoch of every trial, and one when a trial fails."""

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if "epoch" in result:
                spec = trial.config["trial"]
                _print_progress(format_epoch(spec["name"], result, spec["config"]["epochs"]))

        def on_trial_error(self, iteration, trials, trial, **info):
            spec = trial.config["trial"]
            meta = runlog.read_json(Path(trial.config["run_dir"]) / spec["name"] / runlog.TRIAL_FILE)
            _print_progress(f"{spec['name']}  {meta.get('status', 'failed').upper()}: {meta.get('error') or 'see error.txt'}")

    return EpochPrinter()


def run_plan(
    plan: SweepPlan,
    storage: str | Path = "runs",
    max_concurrent: int | None = None,
    print_line: Callable[[str], None] = print,
    resume: bool = False,
) -> Path:
    """Run every trial of `plan` on the connected Ray; returns the run folder (storage/name).
    Trial failures do not raise: they are recorded in each trial.json. With `resume`, an
    interrupted run of the same plan continues: finished trials are kept, the others continue
    from their last checkpoints."""
    from ray import tune

    capacity = cluster_capacity()
    plan = resolve_plan(plan, capacity)
    check_fits(plan, capacity)
    run_dir = (Path(storage).expanduser().resolve() / plan.name)
    sweep_file = run_dir / runlog.SWEEP_FILE
    previous = runlog.read_json(sweep_file)
    names = [t.name for t in plan.trials]
    trainable = tune.with_resources(run_trial, _trial_resources_of)
    _progress_printer[0] = print_line
    started = time.time()
    if resume:
        if not previous or not tune.Tuner.can_restore(str(run_dir)):
            raise ConfigError(f"nothing to resume in {run_dir}: no interrupted run of '{plan.name}' there; run without --resume")
        if previous.get("trials") != names:
            raise ConfigError(f"{run_dir} holds a different sweep (its trials differ from this file's); resume with the same file and --set values, or use --name")
        tuner = tune.Tuner.restore(str(run_dir), trainable=trainable, resume_errored=True)
    else:
        if previous:
            raise ConfigError(f"{run_dir} already holds a run of '{plan.name}': pass --resume to finish it, --name NEW to start another, or delete the folder")
        run_dir.mkdir(parents=True, exist_ok=True)
        runlog.write_json(sweep_file, plan.summary() | {
            "started_at": runlog.now_iso(), "git_revision": sysinfo.git_revision(Path(__file__).parent),
            "host": sysinfo.host_info(), "versions": sysinfo.versions(), "cluster": capacity, "command": " ".join(sys.argv),
        })
        for trial in plan.trials:
            runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "pending"})
        tuner = tune.Tuner(
            trainable,
            param_space={"run_dir": str(run_dir), "trial": tune.grid_search([t.as_dict() for t in plan.trials])},
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent, trial_dirname_creator=_trial_folder_name,
                                        trial_name_creator=_trial_folder_name),
            run_config=tune.RunConfig(name=plan.name, storage_path=str(run_dir.parent), verbose=0, callbacks=[_epoch_printer()]),
        )
    tuner.fit()
    wall = runlog.read_json(sweep_file).get("wall_time_s") or 0.0  # a resumed run adds its own time
    done = all(t.status in runlog.FINAL_STATUSES for t in runlog.load_run(run_dir).trials)
    runlog.update_json(sweep_file, wall_time_s=wall + time.time() - started, **({"finished_at": runlog.now_iso()} if done else {}))
    return run_dir
