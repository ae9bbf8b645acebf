"""Running a sweep plan on Ray: one Tune trial per config, each a Ray Train `TorchTrainer` run.

Ray 2.60 runs Train V2, where `Tuner(TorchTrainer(...))` is no longer allowed: Tune runs the plain
function `run_trial` per trial, which builds and fits a TorchTrainer and forwards its reports to
Tune with `TuneReportCallback` (ray-project/ray doc/source/train/user-guides/
hyperparameter-optimization.rst). Where trials run is `placement`'s concern, the Ray session
`ray_session`'s, what the sweep prints `progress`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from ..core import runlog, sysinfo
from ..core.config import TrainConfig
from ..core.errors import ConfigError
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan
from . import slots
from .placement import (
    RESOURCE_CPU,
    RESOURCE_GPU,
    check_fits,
    cluster_capacity,
    concurrency_cap,
    resolve_plan,
    trial_bundles,
    worker_resources,
)
from .progress import progress_callback, progress_printer, progress_relay, sweep_header
from .session import check_shared_storage, error_line, failure_status, is_ray_client


def run_trial(tune_config: dict) -> None:
    """The Tune function trainable: one TorchTrainer fit for one trial spec."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from ..training.loop import train_loop_per_worker

    spec, run_dir = tune_config["trial"], tune_config["run_dir"]
    cfg = TrainConfig(**spec["config"])
    trial_dir = run_dir / spec["name"]
    trial_file = trial_dir / runlog.TRIAL_FILE
    if runlog.read_json(trial_file).get("status") in runlog.TRAINED_STATUSES:
        return  # done before the driver died; Tune's saved state may lag behind our log
    started = time.time()
    runlog.update_json(
        trial_file, **spec, status="running", error=None, started_at=runlog.now_iso(), started_unix=started
    )
    runlog.update_json(trial_file, driver=sysinfo.worker_placement())  # the node running this trial's Tune driver
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.model_dump(), "trial_dir": trial_dir},
        torch_config=TorchConfig(backend=cfg.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.ray_workers, use_gpu=cfg.use_gpu == "true", resources_per_worker=worker_resources(cfg)
        ),
        # A stable name per trial: a restored sweep's trial finds its run and checkpoints again.
        run_config=ray.train.RunConfig(
            name="train",
            **trial_dir.ray_storage(),
            callbacks=[TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
        ),
    )
    try:
        trainer.fit()
    except Exception as error:
        if runlog.read_json(run_dir / runlog.SWEEP_FILE).get("interrupted_unix", 0) > started:
            raise  # stopped with the interrupted sweep (Ray Client): unfinished, resumable
        (trial_dir / runlog.ERROR_FILE).write_text("".join(traceback.format_exception(error)))
        runlog.update_json(
            trial_file, status=failure_status(error), error=error_line(error), finished_at=runlog.now_iso()
        )
        raise
    runlog.record_outcome(trial_dir)


def _trial_resources_of(config: dict, slots: bool = True):
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(TrainConfig(**config["trial"]["config"]), slots))


def trial_trainable(slots: bool) -> Callable[[dict], None]:
    """run_trial with its resources, as Tune takes it. tune.with_resources sets an attribute on
    the function; through Ray Client (ray://) Tune runs in a remote actor that gets the trainable
    pickled, and a module-level function travels by reference, without the attribute (every trial
    then held Tune's default 1 CPU and its workers never started). A local function travels by
    value, attribute included."""
    from ray import tune

    def cifar_ray_trial(config: dict) -> None:
        run_trial(config)

    return tune.with_resources(cifar_ray_trial, functools.partial(_trial_resources_of, slots=slots))


def _trial_folder_name(trial) -> str:
    return trial.config["trial"]["name"]


def run_plan(
    plan: SweepPlan,
    storage: str | os.PathLike | StoragePath = "runs",
    max_concurrent: int | None = None,
    print_line: Callable[[str], None] = print,
    resume: bool = False,
    warm: bool = True,
    command: str | None = None,
) -> StoragePath:
    """Run every trial of `plan` on the connected Ray; returns the run folder (storage/name).
    Trial failures do not raise: they are recorded in each trial.json. With `resume`, an
    interrupted run of the same plan continues: finished trials are kept, the others continue
    from their last checkpoints. `warm`: trials run in warm worker slots (cifar_ray/cluster/slots.py), else
    each in a TorchTrainer of its own; a resumed run keeps the choice it was started with. `command`: the shell
    command that runs this plan again, recorded in sweep.json (the CLI gives its own; None from Python)."""
    from ray import tune

    capacity = cluster_capacity()
    plan = resolve_plan(plan, capacity)
    check_fits(plan, capacity)
    run_dir = StoragePath.of(storage) / plan.name
    client = is_ray_client()
    if capacity["nodes"] > 1 or client:  # a Ray Client driver may sit on another machine
        check_shared_storage(run_dir.parent, print_line)
    sweep_file = run_dir / runlog.SWEEP_FILE
    previous = runlog.read_json(sweep_file)
    names = [t.name for t in plan.trials]
    warm = previous.get("warm", False) if resume else warm  # runs from before slots have no "warm"
    limit = concurrency_cap(plan, capacity, max_concurrent)
    if capacity["packing"] == "cap" and not warm:  # slots pack by the real CPU and GPU resources
        print_line(
            f"packing: the cluster has no {RESOURCE_CPU} resources, so at most {limit} trial(s) run at once (copies of "
            f"the largest trial that fit its {capacity['nodes']} node(s)); start each node with `ray start "
            f'--resources=\'{{"{RESOURCE_CPU}": <CPUs>, "{RESOURCE_GPU}": <GPUs>}}\'` to pack exactly'
        )
    trainable = slots.thin_trainable() if warm else trial_trainable(slots=capacity["packing"] == "slots")
    progress_printer[0] = print_line
    started = time.time()
    slot_plan = slots.plan_slots(plan, run_dir, capacity, max_concurrent) if warm else None
    if slot_plan is not None:
        limit = slot_plan.count + slots.LOOK_AHEAD  # thin trials: one per slot, and the next ones
    if resume:
        if not previous or not tune.Tuner.can_restore(run_dir.path, storage_filesystem=run_dir.ray_filesystem):
            raise ConfigError(
                f"nothing to resume in {run_dir}: no interrupted run of '{plan.name}' there; run without --resume"
            )
        if previous.get("trials") != names:
            raise ConfigError(
                f"{run_dir} holds a different sweep (its trials differ from this file's); resume with the same file "
                "and --set values, or use --name"
            )
        tuner = tune.Tuner.restore(
            run_dir.path, trainable=trainable, resume_errored=True, storage_filesystem=run_dir.ray_filesystem
        )
    else:
        refusal = runlog.existing_run_refusal(run_dir, plan.name)
        if refusal:
            raise ConfigError(refusal)
        run_dir.mkdir()
        runlog.write_json(
            sweep_file,
            plan.summary()
            | {
                "started_at": runlog.now_iso(),
                "git_revision": sysinfo.git_revision(Path(__file__).parent),
                "host": sysinfo.host_info(),
                "versions": sysinfo.versions(),
                "cluster": capacity,
                "command": command,
                "warm": warm,
            },
        )
        for trial in plan.trials:
            runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "pending"})
        tuner = tune.Tuner(
            trainable,
            param_space={"run_dir": run_dir, "trial": tune.grid_search([t.as_dict() for t in plan.trials])},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=limit,
                trial_dirname_creator=_trial_folder_name,
                trial_name_creator=_trial_folder_name,
            ),
            run_config=tune.RunConfig(
                name=plan.name, **run_dir.parent.ray_storage(), verbose=0, callbacks=[progress_callback(warm)]
            ),
        )
    # A resumed run trains its failed trials again too (resume_errored; slots.plan_slots).
    untrained = (
        sum(t.status not in runlog.TRAINED_STATUSES for t in runlog.load_run(run_dir).trials) if resume else None
    )
    print_line(sweep_header(plan, capacity, limit, run_dir, untrained))
    started_slots = None
    with progress_relay(print_line) if client else contextlib.nullcontext():
        try:
            if slot_plan is not None:  # started last, inside the try: every way out stops them
                started_slots = slot_plan.start()
            tuner.fit()
            if started_slots is not None:
                started_slots.wait()
        except KeyboardInterrupt:
            if not client:
                raise
            # Tune runs on the cluster and stops when this client disconnects (the caller's ray.shutdown),
            # its saved state and checkpoints kept for --resume. The mark tells trials torn down with it
            # that they are unfinished, not failed.
            runlog.update_json(sweep_file, interrupted_unix=time.time())
            logging.getLogger("ray.util.client.dataclient").setLevel(
                logging.CRITICAL
            )  # "Unrecoverable error in data channel"
        finally:
            if started_slots is not None:
                started_slots.stop()
    wall = runlog.read_json(sweep_file).get("wall_time_s") or 0.0  # a resumed run adds its own time
    done = all(t.status in runlog.FINAL_STATUSES for t in runlog.load_run(run_dir).trials)
    runlog.update_json(
        sweep_file, wall_time_s=wall + time.time() - started, **({"finished_at": runlog.now_iso()} if done else {})
    )
    return run_dir
