"""A sweep's driver, followed from the command to the trials with Ray left out (issue 37): how often it reads the run
folder's records, and how far its plan travels through the package's layers.

`drive` runs `cifar-ray sweep` (commands/common.py: run_plan_command, api.execute_plan, cluster/orchestrate.run_plan)
with every Ray call replaced: the cluster's capacity is given, the slots start nothing, and Tune's fit trains the
trials as the Dispatcher records them (a RunFolder of its own, as the Dispatcher's process has: a running trial, an
epoch's line, its outcome). Everything else (the refusals, the lease, the run folder's writes, the summary and the
report's answer) is the real code."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import types
from pathlib import Path

import pytest

from cifar_ray.cli import main
from cifar_ray.cluster import orchestrate, pool
from cifar_ray.cluster import session as ray_session
from cifar_ray.cluster.placement import capacity_of
from cifar_ray.core import runlog
from cifar_ray.core.run import RunFolder
from cifar_ray.core.storage import StoragePath

SWEEP = Path(__file__).parents[1] / "sweeps" / "quickstart.yaml"  # four trials
ARGS = ["--set", "dataset=synthetic", "epochs=1", "train_subset=64", "test_subset=64"]


class FakeTuner:
    """Tune's fit without Ray: trains (as the Dispatcher records it) the first `budget[0]` trials not yet finished."""

    def __init__(self, trials, run_dir, budget):
        self.names, self.run_dir, self.budget = [t.name for t in trials], run_dir, budget

    def fit(self) -> None:
        dispatcher = RunFolder(self.run_dir)  # the Dispatcher's process has its own, and its reads are not counted
        with DISPATCHER.reading():
            for name in self.names[: self.budget[0]]:
                dispatcher.update_trial(name, status="running", started_unix=1.0)
                runlog.append_epoch(self.run_dir / name, {"epoch": 1, "test_acc": 0.5, "end_unix": 2.0})
                dispatcher.record_outcome(name)


def drive(monkeypatch, argv: list[str], trains: int = 99) -> int:
    """`cifar-ray ARGV` with Ray replaced (see the module's docstring); Tune's fit trains at most `trains` trials
    (fewer: the sweep stops as after a Ctrl-C, its other trials unfinished)."""
    replace_ray(monkeypatch, trains)
    return main(argv)


def replace_ray(monkeypatch, trains: int = 99) -> None:
    """drive's stand-ins for every Ray call."""
    budget = [trains]
    fake_slots = types.SimpleNamespace(
        dispatcher=types.SimpleNamespace(end_events=types.SimpleNamespace(remote=lambda: None)),
        wait=lambda: None,
        stop=lambda: None,
    )
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_session, "init_ray", lambda **options: False)  # Ray "already up", not ours to stop
    monkeypatch.setattr(orchestrate, "cluster_capacity", lambda: capacity_of([{"CPU": 4.0}]))
    monkeypatch.setattr(orchestrate, "is_ray_client", lambda: False)
    monkeypatch.setattr(orchestrate, "write_provenance", lambda run_dir, session: None)
    monkeypatch.setattr(pool, "start_slots", lambda slot_plan: fake_slots)
    monkeypatch.setattr(orchestrate, "dispatcher_events", lambda dispatcher: None)
    monkeypatch.setattr(orchestrate, "follow", lambda *args: contextlib.nullcontext())
    monkeypatch.setattr(
        orchestrate, "new_tuner", lambda trials, run_dir, name, limit: FakeTuner(trials, run_dir, budget)
    )


class Elsewhere:
    """Whether the code running now stands for another process than the driver's (the Dispatcher's)."""

    def __init__(self):
        self.now = False

    @contextlib.contextmanager
    def reading(self):
        self.now = True
        try:
            yield
        finally:
            self.now = False


DISPATCHER = Elsewhere()


def counting_reads(monkeypatch) -> collections.Counter:
    """Every read of a run folder's JSON record by the driver from now on, counted by the file's name."""
    reads: collections.Counter = collections.Counter()
    read = runlog.read_json

    def counted(path):
        if not DISPATCHER.now:
            reads[Path(str(path)).name] += 1
        return read(path)

    monkeypatch.setattr(runlog, "read_json", counted)
    return reads


def counting_calls(monkeypatch, owner, *names: str) -> collections.Counter:
    """Every call of `owner`'s methods `names` from now on, counted by name."""
    calls: collections.Counter = collections.Counter()
    for name in names:
        method = getattr(owner, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_sweep_reads_sweep_json_once_and_each_trial_json_once_per_step(tmp_path, monkeypatch):
    """A new sweep of 4 trials, stopped after the first, then resumed. The new run reads sweep.json once to refuse
    (then holds what it wrote), the summary once; each trial.json is read after Tune's fit (did every trial end?),
    at the session's end (mark the running ones interrupted, close the session) and for the summary. The resume
    reads sweep.json for its plan and its refusal, each trial.json once more to compare the configs (which also
    says what is left to train). Before: 8 and 24 reads, then 11 and 28 (the summary's two reads of everything
    included)."""
    storage = ["--storage", str(tmp_path)]
    reads = counting_reads(monkeypatch)
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage], trains=1) == 130  # 3 trials unfinished
    assert dict(reads) == {runlog.SWEEP_FILE: 1 + 1, runlog.TRIAL_FILE: 3 * 4}
    reads.clear()
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage, "--resume"]) == 0
    assert dict(reads) == {runlog.SWEEP_FILE: 2 + 1, runlog.TRIAL_FILE: 4 * 4}


@pytest.mark.parametrize("resume", [False, True])
def test_a_sweep_is_refused_or_admitted_once(tmp_path, monkeypatch, resume):
    """api.execute_plan asks the run folder, before Ray starts, whether the plan may run there; run_plan, handed
    the same RunFolder, does not ask again (it asked a second time before)."""
    storage = ["--storage", str(tmp_path)]
    if resume:
        assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage], trains=1) == 130
    calls = counting_calls(monkeypatch, RunFolder, "new_run_refusal", "resume_refusal", "changed_configs_refusal")
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage, *["--resume"] * resume]) == 0
    expected = {"resume_refusal": 1, "changed_configs_refusal": 1} if resume else {"new_run_refusal": 1}
    assert dict(calls) == expected


def test_a_resume_closes_a_run_whose_driver_was_killed_after_its_last_trial_ended(tmp_path, monkeypatch, capsys):
    """A driver killed once its last trial had ended (SIGKILL: no `finally` runs) leaves sweep.json as its session
    opened it: the session open, wall_time_s 0.0, no finished_at; the report said "Wall time 0.0 s" and `status`'s
    elapsed time kept growing. --resume has nothing to train: it closes the run at the last thing its trials logged
    and says so in one line; a second --resume is the no-op it was."""
    storage = ["--storage", str(tmp_path)]
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage]) == 0
    run_dir = tmp_path / "quickstart"
    sweep = runlog.read_json(run_dir / runlog.SWEEP_FILE)
    ends = [runlog.read_json(run_dir / name / runlog.TRIAL_FILE)["finished_unix"] for name in sweep["trials"]]
    start = min(ends) - 10.0
    killed = {k: v for k, v in sweep.items() if k != "finished_at"} | {"sessions": [{"start_unix": start}]}
    runlog.write_json(run_dir / runlog.SWEEP_FILE, killed | {"wall_time_s": 0.0})
    capsys.readouterr()
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage, "--resume"]) == 0
    closed = runlog.read_json(run_dir / runlog.SWEEP_FILE)
    wall = max(ends) - start
    assert closed["wall_time_s"] == wall > 10.0 and closed["finished_at"] == runlog.now_iso(max(ends))
    assert closed["sessions"] == [
        {"start_unix": start, "end_unix": max(ends), "wall_s": wall, "end": "killed: last logged"}
    ]
    said = [line for line in capsys.readouterr().out.splitlines() if str(run_dir) in line and "trained" in line]
    assert said == [
        f"{run_dir}: every trial has trained to its end, but its driver stopped before closing the run; closed it "
        f"now: wall time {wall:.1f} s over 1 session"
    ]
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage, "--resume"]) == 0
    assert runlog.read_json(run_dir / runlog.SWEEP_FILE) == closed
    assert "nothing to resume" in capsys.readouterr().out


def test_a_lost_empty_or_damaged_trial_json_is_rebuilt_from_the_plan_on_resume(monkeypatch, tmp_path, capsys):
    """A trial.json deleted, cut to nothing or to no JSON (a full disk at a trial's start, a hand) made --resume write
    one with a status and no index, name, swept or config, and the report read an empty configuration. The plan
    says who each trial is: --resume rebuilds them, says so in one line, and every trial then finishes with its
    identity; the trained one keeps its epoch and is closed, not trained again."""
    storage = ["--storage", str(tmp_path)]
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage], trains=1) == 130  # 3 trials unfinished
    run_dir = tmp_path / "quickstart"
    names = runlog.read_json(run_dir / runlog.SWEEP_FILE)["trials"]
    before = {name: runlog.read_json(run_dir / name / runlog.TRIAL_FILE) for name in names}
    (run_dir / names[0] / runlog.TRIAL_FILE).unlink()  # the trained one
    (run_dir / names[1] / runlog.TRIAL_FILE).write_text("")
    (run_dir / names[2] / runlog.TRIAL_FILE).write_text("{cut")
    capsys.readouterr()
    assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage, "--resume"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "rebuilt" in line]
    assert said == [
        f"{run_dir}: rebuilt the trial.json of 3 trials from the plan: {names[0]} (no trial.json); "
        f"{names[1]} (trial.json is empty); {names[2]} (trial.json is not JSON)"
    ]
    for name in names:
        record = runlog.read_json(run_dir / name / runlog.TRIAL_FILE)
        assert {key: record[key] for key in ("index", "name", "swept")} == {
            key: before[name][key] for key in ("index", "name", "swept")
        }
        assert record["config"] == before[name]["config"] and record["status"] == "finished"
    assert len(runlog.read_epochs(run_dir / names[0])) == 1  # closed, not trained again
    notes = runlog.read_json(run_dir / names[1] / runlog.TRIAL_FILE)["notes"]
    assert notes == ["trial.json rebuilt from the plan on --resume (trial.json is empty)"]


# The floors of the package's layers (tests/test_layers.py): a module calls only down, or along its floor.
FLOORS = {"core": 0, "training": 1, "cluster": 2, "report": 3, "export": 3, "api": 4, "commands": 5, "cli": 6}


def floor(module: str) -> int:
    return FLOORS[module.split(".")[1]]


class PlanTrip:
    """The rooms (cifar_ray modules) a sweep's plan passes through: on every call and return of a function that
    holds a SweepPlan among its arguments, the module of the innermost such function, a stay per change."""

    def __init__(self):
        self.holders: list = []  # the frames holding the plan, innermost last
        self.stays: list[str] = []

    def _enter(self, module: str) -> None:
        if not self.stays or self.stays[-1] != module:
            self.stays.append(module)

    def profile(self, frame, event, arg) -> None:
        from cifar_ray.core.sweep import SweepPlan

        module = frame.f_globals.get("__name__", "")
        if not module.startswith("cifar_ray.") or event not in ("call", "return"):
            return
        code = frame.f_code
        if event == "call":
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(isinstance(frame.f_locals.get(name), SweepPlan) for name in names):
                self.holders.append(frame)
                self._enter(module)
        elif self.holders and self.holders[-1] is frame:
            self.holders.pop()
            if self.holders:
                self._enter(self.holders[-1].f_globals["__name__"])

    def climbs(self) -> int:
        """Moves up a floor: each is a return to a caller after the plan went down."""
        return sum(floor(b) > floor(a) for a, b in zip(self.stays, self.stays[1:]))

    def returns(self) -> int:
        """Stays in a room the plan had already left."""
        return sum(module in self.stays[:i] for i, module in enumerate(self.stays))


def follow_the_plan(monkeypatch, argv: list[str]) -> PlanTrip:
    """The trip of the plan of `cifar-ray ARGV`, from run_plan_command to Tune's fit (where trials are handed to
    Tune: the trip ends there). Run as a script, this file prints the trips."""
    from cifar_ray.commands import common

    trip = PlanTrip()
    run_plan_command, fit = common.run_plan_command, FakeTuner.fit

    def traced(plan, args):
        sys.setprofile(trip.profile)
        try:
            return run_plan_command(plan, args)
        finally:
            sys.setprofile(None)

    def handed_to_tune(self):
        sys.setprofile(None)
        fit(self)

    monkeypatch.setattr(common, "run_plan_command", traced)
    monkeypatch.setattr("cifar_ray.commands.sweep.run_plan_command", traced)
    monkeypatch.setattr(FakeTuner, "fit", handed_to_tune)
    drive(monkeypatch, argv)
    return trip


@pytest.mark.parametrize("resume", [False, True])
def test_the_trip_of_a_sweeps_plan_climbs_back_up_at_most_three_times(tmp_path, monkeypatch, resume):
    """The plan goes down from the command to Tune and climbs back up a floor three times: from core after api asked
    it whether the plan may run here (RunFolder.admit), from core.sweep as placement resolves the plan for the
    cluster, and from core after orchestrate recorded the run's start (or compared a resume's configs). Measured
    before this test (issue 37's 18 climbs were counted otherwise): 21 stays in 8 rooms, 4 climbs, 13 returns for a
    resume (run_plan asked the run folder again); 19, 8, 2 and 11 for a new sweep. Now 19, 8, 3, 11 for a resume and
    21, 8, 3, 13 for a new sweep: its refusal (RunFolder.admit) takes the plan down to core, where the old one took
    its name."""
    storage = ["--storage", str(tmp_path)]
    if resume:
        assert drive(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage], trains=1) == 130
    trip = follow_the_plan(monkeypatch, ["sweep", str(SWEEP), *ARGS, *storage, *["--resume"] * resume])
    shown = " > ".join(m.removeprefix("cifar_ray.") for m in trip.stays)
    assert trip.stays[0] == "cifar_ray.commands.common" and trip.stays[-1] == "cifar_ray.cluster.orchestrate", shown
    assert len(set(trip.stays)) <= 8 and trip.climbs() <= 3, shown


if __name__ == "__main__":  # python tests/test_run_trip.py: the trips, and their counts
    import tempfile

    for resume in (False, True):
        with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as folder:
            storage = ["--storage", folder]
            if resume:
                drive(patch, ["sweep", str(SWEEP), *ARGS, *storage], trains=1)
            trip = follow_the_plan(patch, ["sweep", str(SWEEP), *ARGS, *storage, *["--resume"] * resume])
        print(f"{'resume' if resume else 'new sweep'}: " + " > ".join(m.removeprefix("cifar_ray.") for m in trip.stays))
        print(
            f"  {len(trip.stays)} stays in {len(set(trip.stays))} modules, {trip.climbs()} climbs up a floor, "
            f"{trip.returns()} returns to a module already left"
        )


def test_the_slots_start_before_the_driver_records_provenance_and_builds_the_tune_experiment(tmp_path, monkeypatch):
    """A slot's processes take seconds to start (reports/bench, start-up); the driver records the session's provenance
    (it imports torch) and builds the Tune experiment (it imports Ray Tune) meanwhile, not before it starts them."""
    order: list[str] = []
    replace_ray(monkeypatch)
    start_slots, new_tuner = pool.start_slots, orchestrate.new_tuner

    def starting(slot_plan):
        order.append("slots")
        return start_slots(slot_plan)

    def building(*args):
        order.append("tune")
        return new_tuner(*args)

    monkeypatch.setattr(pool, "start_slots", starting)
    monkeypatch.setattr(orchestrate, "write_provenance", lambda run_dir, session: order.append("provenance"))
    monkeypatch.setattr(orchestrate, "new_tuner", building)
    assert main(["sweep", str(SWEEP), *ARGS, "--storage", str(tmp_path)]) == 0
    assert order == ["slots", "provenance", "tune"]


def test_a_working_folder_deleted_as_tune_ends_leaves_the_summary_and_one_line_of_its_cause(
    tmp_path, monkeypatch, capsys
):
    """Under `ray job submit` on one machine, two Ray nodes sharing a temp folder deleted the job's working folder
    (its working_dir) while the sweep ran; Tune's fit then died reading its results back (os.getcwd in
    ExperimentAnalysis: FileNotFoundError) after every trial had ended, and the job failed. The trials' results are
    in the run folder: the sweep ends with its summary, exit 0, and one line naming the deleted folder and the cure."""
    job_folder = tmp_path / "job-working-dir"
    job_folder.mkdir()
    monkeypatch.chdir(job_folder)  # put back after the test
    replace_ray(monkeypatch)
    fit = FakeTuner.fit

    def fit_then_lose_the_folder(self) -> None:
        fit(self)
        job_folder.rmdir()
        os.path.relpath("a", start="b")  # as Tune's ExperimentAnalysis: os.getcwd, FileNotFoundError

    monkeypatch.setattr(FakeTuner, "fit", fit_then_lose_the_folder)
    storage = tmp_path / "runs"
    assert main(["sweep", str(SWEEP), *ARGS, "--storage", str(storage)]) == 0
    printed = capsys.readouterr().out
    cause = [line for line in printed.splitlines() if "was deleted" in line]
    assert len(cause) == 1 and str(job_folder) in cause[0] and "--temp-dir" in cause[0], printed
    assert f"quickstart: 4 trial(s), logs in {storage / 'quickstart'}" in printed, printed
    assert f"report: cifar-ray report {storage / 'quickstart'}" in printed, printed
    assert os.getcwd() == str(storage)  # a working folder that exists, for what follows


def test_a_file_not_found_with_the_working_folder_still_there_is_raised_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = []
    with pytest.raises(FileNotFoundError, match="a trial's file"):
        with orchestrate.outliving_the_working_folder(StoragePath.of(tmp_path / "runs" / "x"), said.append):
            raise FileNotFoundError("a trial's file")
    assert not said and os.getcwd() == str(tmp_path)
