"""Running a sweep plan on Ray: every trial in a worker slot (cifar_ray/cluster/slots.py), Tune as the sweep engine.

Tune runs one thin trial per config (thin_trials.thin_trainable), which forwards to Tune the epochs the trial's slot
trains; warm slots train trial after trial in one worker group, `--isolate` gives each trial a slot of its own
(a fresh worker group) with the same code, checkpoints and failure handling. What the run folder records goes
through its owner, core/run.py's RunFolder: here the run's start (sweep.json, the first trial.json files), each
session and its provenance, the trials a stopped session leaves interrupted; while the sweep runs, the Dispatcher's
news of the trials. Where trials run is `placement`'s concern, the Ray session `session`'s, what the sweep
prints `progress`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..core import lease, runlog, sysinfo
from ..core.errors import ConfigError
from ..core.run import RunFolder, RunOptions
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan, TrialSpec
from ..core.text import counted, precise_duration
from . import pool, slots, thin_trials
from .dispatcher import tune_trial
from .live_view import fill_in_ended, live_tensorboard
from .placement import check_fits, cluster_capacity, cores_awaited, resolve_plan
from .progress import SweepProgress, dispatcher_events, follow, progress_callback, sweep_header
from .session import check_shared_storage, is_ray_client, write_provenance

TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"  # read by Tuner.fit as it starts


def _trial_folder_name(trial) -> str:
    return trial.config["trial"]["name"]


def run_plan(plan: SweepPlan, options: RunOptions, run: RunFolder | None = None) -> StoragePath:
    """Run every trial of `plan` on the connected Ray as `options` say (core/run.py: RunOptions); returns the run
    folder (storage/name). Trial failures do not raise: they are recorded in each trial.json. With
    `options.resume`, an interrupted run of the same plan continues: finished trials are kept, the others continue
    from their last checkpoints; a plan whose resolved trial configs differ from the recorded ones is refused. The
    driver holds the run folder's lease throughout (core/lease.py): a second driver is refused. `run`: the run
    folder's owner the caller has already asked (api.execute_plan: its refusals, sweep.json read once)."""
    run = run or RunFolder(options.run_dir(plan.name))
    with lease.hold(run.path, options.print_line):
        return _run_held(run, plan, options)


def _run_held(run: RunFolder, plan: SweepPlan, options: RunOptions) -> StoragePath:
    """run_plan, its lease held: refused before anything is written or started, then the run's start (or the
    trials a resume adds) recorded, then one session trains what is left."""
    capacity = cluster_capacity()
    plan = resolve_plan(plan, capacity, options.print_line)
    check_fits(plan, capacity)
    if not run.admitted:  # api.execute_plan asked before Ray started; bench and tests call run_plan directly
        run.admit(plan, options.resume)
    damaged = run.damaged_trials() if options.resume else {}
    changed = run.changed_configs_refusal(plan, list(damaged)) if options.resume else None  # resolved: on Ray only
    if changed:
        raise ConfigError(changed)
    if damaged:  # the plan says who each trial is: never a trial with no config, name or index
        run.rebuild_trials(plan, damaged)
        options.print_line(
            f"{run.path}: rebuilt the {runlog.TRIAL_FILE} of {counted(len(damaged), 'trial')} from the plan: "
            + "; ".join(f"{name} ({why})" for name, why in damaged.items())
        )
    if capacity["nodes"] > 1 or is_ray_client():  # a Ray Client driver may sit on another machine
        check_shared_storage(run.path.parent, options.print_line)
    warm = run.sweep().get("warm", False) if options.resume else not options.isolate  # a resume keeps its choice
    if not options.resume:
        run.create(plan, _start_facts(capacity, options, warm))
    # A resumed run trains its failed and interrupted trials again too (resume_errored; slots.plan_slots).
    slot_plan = slots.plan_slots(plan, run, capacity, options.max_concurrent, not warm, options.profile)
    if options.resume and not slot_plan.specs:  # no session, no provenance: at most the close a killed driver missed
        fill_in_ended(run.path, [t.name for t in plan.trials])
        closed = run.close_after_kill()
        if closed:
            wall, sessions = precise_duration(closed["wall_time_s"]), counted(len(closed["sessions"]), "session")
            options.print_line(
                f"{run.path}: every trial has trained to its end, but its driver stopped before closing the run; "
                f"closed it now: wall time {wall} over {sessions}"
            )
        else:
            options.print_line(
                f"{run.path}: every trial has trained to its end; nothing to resume (--repeats N adds seeds)"
            )
        return run.path
    if options.resume:
        _add_seeds(run, plan)
    limit = slot_plan.count  # thin trials: one per slot running (a trial taken before its thin trial starts is
    # forwarded from its first epoch when it does)
    # A new Tune experiment of the trials still to train, never Tune's restore: a failed read of its saved state
    # makes Tune restart the experiment silently, and the slots go by trial.json, not by Tune's state.
    to_train = {spec.name for spec in slot_plan.specs}
    if options.resume:  # trials that ended under a driver that died before passing their last epochs to the live view
        fill_in_ended(run.path, [t.name for t in plan.trials if t.name not in to_train])
    untrained = len(slot_plan.specs) if options.resume else None
    options.print_line(sweep_header(plan, capacity, limit, run.path, untrained, options))
    tune_trials = [t for t in plan.trials if t.name in to_train]
    _train_session(run, plan, slot_plan, lambda: new_tuner(tune_trials, run.path, plan.name, limit), options)
    return run.path


def _add_seeds(run: RunFolder, plan: SweepPlan) -> None:
    """The trials a `--resume --repeats N` adds to the run: those beyond the ones sweep.json lists."""
    recorded = run.sweep().get("trials") or []
    if len(plan.trials) > len(recorded):
        run.add_trials(plan, [t.name for t in plan.trials][len(recorded) :])


def _start_facts(capacity: dict[str, Any], options: RunOptions, warm: bool) -> dict[str, Any]:
    """What sweep.json records of a new run's start beyond its plan: when, where, with what, how it was asked."""
    return {
        "started_at": runlog.now_iso(),
        "git_revision": sysinfo.git_revision(sysinfo.PACKAGE_DIR),
        "host": sysinfo.host_info(),
        "versions": sysinfo.versions(),
        "cluster": capacity,
        "command": options.command,
        "estimate_s": options.estimate_s,
        "warm": warm,
        "slots": True,  # every trial runs in a slot (a one-trial slot when not warm)
    }


def _train_session(
    run: RunFolder, plan: SweepPlan, slot_plan: slots.SlotPlan, make_tuner: Callable[[], Any], options: RunOptions
) -> None:
    """One session of the run: opened in sweep.json, the slots started, its provenance recorded, Tune run; however it
    ends, the slots are stopped, the plan's trials still running are marked interrupted and the session closed.
    The slots start first, inside the try (every way out stops them): their processes take seconds to start, while
    this driver records the provenance (it imports torch) and builds the Tune experiment (`make_tuner`: it imports
    Ray Tune)."""
    names = [t.name for t in plan.trials]
    started_slots = None
    started = time.time()
    session = run.open_session(started)
    try:
        started_slots = pool.start_slots(slot_plan)
        write_provenance(run.path, session)
        tuner = make_tuner()
        view = SweepProgress(run.path, slot_plan.specs, options.print_line, options.started, options.stream)
        dispatcher = started_slots.dispatcher
        events = dispatcher_events(dispatcher)
        with follow(events, view, dispatcher.end_events.remote, cores_awaited):  # all printed before stop
            with ctrl_c_interrupts_tune(), outliving_the_working_folder(run.path, options.print_line):
                tuner.fit()
            if run.all_final(names):  # else Tune stopped early (SIGINT, SIGTERM): the slots are stopped
                started_slots.wait()
    except KeyboardInterrupt:
        if not is_ray_client():
            raise
        # Tune runs on the cluster and stops when this client disconnects (the caller's ray.shutdown),
        # its saved state and checkpoints kept for --resume. The mark tells `status` the run has stopped.
        run.update_sweep(interrupted_unix=time.time())
        # Ray Client's "Unrecoverable error in data channel" as it disconnects: expected, not printed
        logging.getLogger("ray.util.client.dataclient").setLevel(logging.CRITICAL)
    finally:
        if started_slots is not None:
            started_slots.stop()
        run.end_session(names)


@contextlib.contextmanager
def outliving_the_working_folder(run_dir: StoragePath, print_line: Callable[[str], None]) -> Iterator[None]:
    """Tune's fit reads its results back at the end, and a relative path then needs the working folder: deleted under
    it, it dies in os.getcwd (FileNotFoundError) after every trial has ended. Under `ray job submit` that folder is
    the job's working_dir, and two Ray nodes on one machine sharing one temp folder delete each other's (measured:
    1 job in 10). The trials' results are in the run folder already: the sweep goes on to its summary, in a working
    folder that exists (the run folder's parent where it is local, else the temp folder), with the cause in one line.
    A FileNotFoundError with the working folder still there is not this one: raised as it is."""
    try:
        folder = os.getcwd()
    except FileNotFoundError:
        folder = os.environ.get("PWD", "?")
    try:
        yield
    except FileNotFoundError:
        try:
            os.getcwd()
        except FileNotFoundError:
            local = run_dir.parent.path if run_dir.is_local else ""
            os.chdir(local if os.path.isdir(local) else tempfile.gettempdir())
            print_line(
                f"this driver's working folder {folder} was deleted as the sweep ended: the results are in "
                f"{run_dir}; on one machine, give each Ray node its own --temp-dir (docs/cluster.md)"
            )
        else:
            raise


@contextlib.contextmanager
def ctrl_c_interrupts_tune() -> Iterator[None]:
    """Ctrl-C in Tuner.fit as a KeyboardInterrupt, not Tune's graceful stop: that saves Tune's state, which no resume
    reads, and waits up to 15 s for the thin trials, each blocked until its slot's next epoch (6 to 15 s measured).
    Set for this fit only: a notebook's own Tune runs keep Tune's handler."""
    before = os.environ.get(TUNE_SIGINT)
    os.environ[TUNE_SIGINT] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TUNE_SIGINT, None)
        else:
            os.environ[TUNE_SIGINT] = before


def new_tuner(trials: list[TrialSpec], run_dir: StoragePath, name: str, limit: int):
    """A Tune experiment of `trials` in `run_dir`, one thin Tune trial each, in a folder named after the trial."""
    from ray import tune

    return tune.Tuner(
        thin_trials.thin_trainable(),
        param_space={"trial": tune.grid_search([tune_trial(t, run_dir) for t in trials])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=limit,
            # A thin trial's process serves the next thin trial: no process start (~1 CPU-s) per trial.
            reuse_actors=True,
            trial_dirname_creator=_trial_folder_name,
            trial_name_creator=_trial_folder_name,
        ),
        run_config=tune.RunConfig(
            name=name,
            **run_dir.parent.ray_storage(),
            verbose=0,
            callbacks=[progress_callback(), *live_tensorboard(run_dir)],
        ),
    )
