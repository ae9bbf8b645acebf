"""Running a sweep plan on Ray: every trial in a worker slot (cifar_ray/cluster/slots.py), Tune as the sweep engine.

Tune runs one thin trial per config (slots.thin_trainable), which forwards to Tune the epochs the trial's slot
trains; warm slots train trial after trial in one worker group, `--isolate` gives each trial a slot of its own
(a fresh worker group) with the same code, checkpoints and failure handling. The driver writes sweep.json (with
the wall time of every session, an interrupted one too), each trial's first trial.json and each session's
provenance (core/provenance.py, before the session's first trial); while the sweep runs,
the Dispatcher alone writes trial.json. Where trials run is `placement`'s concern, the Ray session
`ray_session`'s, what the sweep prints `progress`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from ..core import lease, runlog, sysinfo
from ..core.errors import ConfigError
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan, TrialSpec
from . import slots
from .dispatcher import tune_trial
from .live_view import live_tensorboard
from .placement import check_fits, cluster_capacity, resolve_plan
from .progress import SweepProgress, dispatcher_events, follow, progress_callback, sweep_header
from .session import check_shared_storage, is_ray_client, write_provenance

TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"  # read by Tuner.fit as it starts


def _trial_folder_name(trial) -> str:
    return trial.config["trial"]["name"]


def changed_configs_refusal(plan: SweepPlan, run_dir: StoragePath) -> str | None:
    """Why `plan` may not resume the run in `run_dir`, in one line: the resolved config of a trial differs from
    the one its trial.json recorded (old -> new per key); None when they agree. Keys the recorded config lacks
    (added by a later cifar-ray) are not compared."""
    changes = []
    for trial in plan.trials:
        recorded = runlog.read_json(run_dir / trial.name / runlog.TRIAL_FILE).get("config")
        if not recorded:
            continue
        resolved = json.loads(json.dumps(trial.config.model_dump()))  # as trial.json holds it: lists, not tuples
        keys = [key for key in recorded if key in resolved and recorded[key] != resolved[key]]
        if keys:
            changes.append(f"{trial.name} ({', '.join(f'{k} {recorded[k]!r} -> {resolved[k]!r}' for k in keys)})")
    if not changes:
        return None
    return (
        f"--resume would train {run_dir}'s trials with other configs than they started with: {'; '.join(changes)}; "
        "resume with the same file and --set values, or pass --name NEW to start another run"
    )


def resume_refusal(plan: SweepPlan, run_dir: StoragePath) -> str | None:
    """Why `plan` cannot resume the run in `run_dir`, read from its sweep.json alone (so before Ray starts): no run
    there, another sweep's trials, or an older --isolate run; None when it can."""
    previous = runlog.read_json(run_dir / runlog.SWEEP_FILE)
    if not previous:
        return f"nothing to resume in {run_dir}: no interrupted run of '{plan.name}' there; run without --resume"
    recorded = previous.get("trials") or []
    if [t.name for t in plan.trials][: len(recorded)] != recorded:
        return (
            f"{run_dir} holds a different sweep (its trials differ from this file's); resume with the same file "
            "and --set values, or use --name"
        )
    return old_isolated_run_refusal(previous, run_dir)


def old_isolated_run_refusal(sweep: dict, run_dir: StoragePath) -> str | None:
    """Runs started with --isolate before trials ran in slots kept Ray Train's checkpoints in <trial>/train,
    which this version does not read: refused, not trained again from scratch."""
    if sweep.get("warm") or sweep.get("slots"):
        return None
    return (
        f"{run_dir} was started with --isolate by an older cifar-ray (a Ray Train run per trial, checkpoints in "
        "<trial>/train), which this version cannot continue: finish it with that version, or pass --name NEW"
    )


def mark_interrupted(run_dir: StoragePath, plan: SweepPlan) -> None:
    """Trials still `running` once the slots are stopped are not: interrupted, continued by --resume."""
    for trial in plan.trials:
        trial_file = run_dir / trial.name / runlog.TRIAL_FILE
        if runlog.read_json(trial_file).get("status") == "running":
            runlog.update_json(trial_file, status="interrupted", interrupted_at=runlog.now_iso())


def open_session(run_dir: StoragePath, started: float) -> int:
    """This session's start into sweep.json's sessions, before any trial runs. A session an earlier driver left
    open was killed (SIGKILL, a lost machine: no `finally` ran): it is closed first, ended at the last thing its
    trials logged, `end` saying so, so that wall_time_s still sums every session (a run from before sessions were
    kept counts its recorded wall time as one)."""
    sweep_file = run_dir / runlog.SWEEP_FILE
    sweep = runlog.read_json(sweep_file)
    earlier = sweep.get("wall_time_s") or 0.0
    sessions = sweep.get("sessions") or ([{"wall_s": earlier}] if earlier else [])
    for session in sessions:
        if "end_unix" not in session and "start_unix" in session:
            ended = max(session["start_unix"], last_activity(run_dir, session["start_unix"]))
            session |= {"end_unix": ended, "wall_s": ended - session["start_unix"], "end": "killed: last logged"}
    sessions.append({"start_unix": started})
    runlog.update_json(sweep_file, sessions=sessions, wall_time_s=_wall(sessions))
    return len(sessions)  # this session's number, 1-based


def close_session(sweep_file: StoragePath, done: bool) -> None:
    """This session's end and wall time; wall_time_s is the sum over sessions; finished_at once every trial is."""
    sweep = runlog.read_json(sweep_file)
    sessions, ended = sweep["sessions"], time.time()
    sessions[-1] |= {"end_unix": ended, "wall_s": ended - sessions[-1]["start_unix"]}
    finished = {"finished_at": runlog.now_iso()} if done else {}
    runlog.update_json(sweep_file, sessions=sessions, wall_time_s=_wall(sessions), **finished)


def _wall(sessions: list[dict]) -> float:
    return sum(session.get("wall_s", 0.0) for session in sessions)


def last_activity(run_dir: StoragePath, since: float) -> float:
    """When the run's trials last logged something (an epoch's end, a trial's start or end) after `since`."""
    times = []
    for trial in runlog.load_run(run_dir).trials:
        times += [row.get("end_unix") for row in trial.epochs]
        times += [trial.meta.get("started_unix"), trial.meta.get("finished_unix")]
    return max((t for t in times if isinstance(t, (int, float)) and t >= since), default=since)


def run_plan(
    plan: SweepPlan,
    storage: str | os.PathLike | StoragePath = "runs",
    max_concurrent: int | None = None,
    print_line: Callable[[str], None] = print,
    resume: bool = False,
    warm: bool = True,
    command: str | None = None,
    estimate_s: float | None = None,
    profile: bool = False,
    stream: TextIO | None = None,
) -> StoragePath:
    """Run every trial of `plan` on the connected Ray; returns the run folder (storage/name).
    Trial failures do not raise: they are recorded in each trial.json. With `resume`, an
    interrupted run of the same plan continues: finished trials are kept, the others continue
    from their last checkpoints; a plan whose resolved trial configs differ from the recorded ones is refused.
    `warm`: trials run one after another in warm worker slots, else each in a slot of its own (--isolate); a
    resumed run keeps the choice it was started with. `command`: the shell command that runs this plan again,
    recorded in sweep.json (the CLI gives its own; None from Python). `estimate_s`: the wall time `sweep --estimate`
    expected, recorded in sweep.json and repeated in the header. `profile`: --profile, for the trials this session
    trains. `stream`: where print_line prints; a terminal gets a live progress bar (progress.SweepProgress). The
    driver holds the run folder's lease throughout (core/lease.py): a second driver is refused."""
    with lease.hold(StoragePath.of(storage) / plan.name, print_line):
        return _run_held(plan, storage, max_concurrent, print_line, resume, warm, command, estimate_s, profile, stream)


def _run_held(
    plan: SweepPlan,
    storage: str | os.PathLike | StoragePath,
    max_concurrent: int | None,
    print_line: Callable[[str], None],
    resume: bool,
    warm: bool,
    command: str | None,
    estimate_s: float | None,
    profile: bool,
    stream: TextIO | None,
) -> StoragePath:
    """run_plan, its lease held."""
    capacity = cluster_capacity()
    plan = resolve_plan(plan, capacity, print_line)
    check_fits(plan, capacity)
    run_dir = StoragePath.of(storage) / plan.name
    sweep_file = run_dir / runlog.SWEEP_FILE
    previous = runlog.read_json(sweep_file)
    if resume:  # refused before anything is written or started
        refusal = resume_refusal(plan, run_dir) or changed_configs_refusal(plan, run_dir)
        if refusal:
            raise ConfigError(refusal)
    client = is_ray_client()
    if capacity["nodes"] > 1 or client:  # a Ray Client driver may sit on another machine
        check_shared_storage(run_dir.parent, print_line)
    names = [t.name for t in plan.trials]
    warm = previous.get("warm", False) if resume else warm
    trainable = slots.thin_trainable()
    slot_plan = slots.plan_slots(plan, run_dir, capacity, max_concurrent, one_trial=not warm, profile=profile)
    limit = slot_plan.count + slots.LOOK_AHEAD  # thin trials: one per slot running, and the next ones
    if resume:
        recorded = previous.get("trials") or []
        if not slot_plan.specs:  # a no-op that writes nothing: no session, no provenance
            print_line(f"{run_dir}: every trial has trained to its end; nothing to resume (--repeats N adds seeds)")
            return run_dir
        if len(names) > len(recorded):  # --repeats added seeds
            add_trials(run_dir, plan, previous, names[len(recorded) :])
        # A new Tune experiment of the trials still to train, never Tune's restore: a failed read of its saved
        # state makes Tune restart the experiment silently, and the slots go by trial.json, not by Tune's state.
        to_train = {spec.name for spec in slot_plan.specs}
        tuner = new_tuner(trainable, [t for t in plan.trials if t.name in to_train], run_dir, plan.name, limit)
    else:
        refusal = runlog.existing_run_refusal(run_dir, plan.name)
        if refusal:
            raise ConfigError(refusal)
        from ..training.distributed import versions  # imports torch: not on the refusals' fast path

        run_dir.mkdir()
        runlog.write_json(
            sweep_file,
            plan.summary()
            | {
                "started_at": runlog.now_iso(),
                "git_revision": sysinfo.git_revision(sysinfo.PACKAGE_DIR),
                "host": sysinfo.host_info(),
                "versions": versions(),
                "cluster": capacity,
                "command": command,
                "estimate_s": estimate_s,
                "warm": warm,
                "slots": True,  # every trial runs in a slot (a one-trial slot when not warm)
            },
        )
        write_pending(run_dir, plan.trials)
        tuner = new_tuner(trainable, plan.trials, run_dir, plan.name, limit)
    # A resumed run trains its failed and interrupted trials again too (resume_errored; slots.plan_slots).
    untrained = len(slot_plan.specs) if resume else None
    print_line(sweep_header(plan, capacity, limit, run_dir, untrained, estimate_s))
    started_slots = None
    started = time.time()
    session = open_session(run_dir, started)
    try:
        write_provenance(run_dir, session)
        started_slots = slot_plan.start()  # started last, inside the try: every way out stops them
        view = SweepProgress(run_dir, slot_plan.specs, print_line, started, stream)
        with follow(dispatcher_events(started_slots.dispatcher), view):  # before the slots stop: all is printed
            with ctrl_c_interrupts_tune():
                tuner.fit()
            if _all_final(run_dir, plan):  # else Tune stopped early (SIGINT, SIGTERM): the slots are stopped
                started_slots.wait()
    except KeyboardInterrupt:
        if not client:
            raise
        # Tune runs on the cluster and stops when this client disconnects (the caller's ray.shutdown),
        # its saved state and checkpoints kept for --resume. The mark tells `status` the run has stopped.
        runlog.update_json(sweep_file, interrupted_unix=time.time())
        logging.getLogger("ray.util.client.dataclient").setLevel(
            logging.CRITICAL
        )  # "Unrecoverable error in data channel"
    finally:
        if started_slots is not None:
            started_slots.stop()
        mark_interrupted(run_dir, plan)
        close_session(sweep_file, _all_final(run_dir, plan))
    return run_dir


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


def write_pending(run_dir: StoragePath, trials: list[TrialSpec]) -> None:
    for trial in trials:
        runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "pending"})


def add_trials(run_dir: StoragePath, plan: SweepPlan, previous: dict, added: list[str]) -> None:
    """A --resume that adds seeds: sweep.json lists every trial and the repeat counts (an unfinished run again, so
    no finished_at), and each new trial gets its first trial.json; the trials already there are not touched."""
    summary = plan.summary()
    sweep = {k: v for k, v in previous.items() if k != "finished_at"}
    runlog.write_json(
        run_dir / runlog.SWEEP_FILE, sweep | {k: summary[k] for k in ("trials", "repeats", "repeat_counts")}
    )
    write_pending(run_dir, [t for t in plan.trials if t.name in added])


def new_tuner(trainable, trials: list[TrialSpec], run_dir: StoragePath, name: str, limit: int):
    """A Tune experiment of `trials` in `run_dir`, one thin Tune trial each, in a folder named after the trial."""
    from ray import tune

    return tune.Tuner(
        trainable,
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


def _all_final(run_dir: StoragePath, plan: SweepPlan) -> bool:
    return all(
        runlog.read_json(run_dir / t.name / runlog.TRIAL_FILE).get("status") in runlog.FINAL_STATUSES
        for t in plan.trials
    )
