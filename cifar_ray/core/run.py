"""A run: the options of its sweep (RunOptions) and the one owner of its folder (RunFolder).

RunFolder is the only code that writes a run folder's records: sweep.json (created, extended by --repeats, its
sessions opened and closed), each trial.json (pending, then what its slot and the Dispatcher learn, its outcome),
each session's provenance (core/provenance.py's format). It reads them for everyone else as typed records
(core/record.py: TrialRecord), and it refuses what would mix two runs in one folder: a new run where one is, a
resume of nothing, of another sweep, of changed configs. The file format is runlog's (core/runlog.py); the writes
never start from a failed read (runlog.read_json raises).

Each record is read once per RunFolder: the driver that holds the run's lease (core/lease.py) is the only writer of
sweep.json, so what this object read or wrote is what the file holds; and while none of its sessions is open, no
Dispatcher runs, so the same holds for trial.json. While a session is open the Dispatcher writes trial.json in
another process: trial reads then go to the files. One RunFolder travels from api.execute_plan through
cluster/orchestrate.run_plan and every round of --until-settled, so a sweep reads sweep.json once.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from . import provenance, runlog
from .checkpoints import CHECKPOINTS
from .errors import ConfigError, StorageError
from .record import TrialRecord
from .storage import StoragePath

if TYPE_CHECKING:
    from .sweep import SweepPlan, TrialSpec


@dataclass(frozen=True)
class RunOptions:
    """How a sweep runs, never what it trains (no config key: no part of a trial's identity or of --resume's
    checks): what api.execute_plan hands cluster/orchestrate.run_plan.

    `storage`: the folder or URI the run folder goes under (storage/<plan name>). `resume`: continue the
    interrupted run there. `max_concurrent`: at most this many trials at once (None: as many as fit). `isolate`:
    each trial in a slot of its own (--isolate) instead of warm slots; a resumed run keeps its first choice.
    `address`: the Ray cluster (None: $RAY_ADDRESS, else an embedded Ray). `estimate_s`: the wall time `sweep
    --estimate` expected (None: not estimated), recorded in sweep.json and the header. `profile`: --profile.
    `command`: the shell command that runs this again, recorded in sweep.json (None from Python). `print_line`
    gets the progress lines; `stream` is where it prints them (a terminal gets a live bar). `started`: when the
    command began, what its elapsed time counts from (every round of --until-settled alike)."""

    storage: str | os.PathLike | StoragePath = "runs"
    resume: bool = False
    max_concurrent: int | None = None
    isolate: bool = False
    address: str | None = None
    estimate_s: float | None = None
    profile: bool = False
    command: str | None = None
    print_line: Callable[[str], None] = print
    stream: TextIO | None = None
    started: float = field(default_factory=time.time)

    def run_dir(self, name: str) -> StoragePath:
        return StoragePath.of(self.storage) / name


IDENTITY = ("index", "name", "swept", "config")  # what a trial.json must hold to say which trial of the plan it is


class RunFolder:
    """The run folder at `path` (a folder or a URI): the one reader and writer of its sweep.json, trial.json files
    and session records."""

    def __init__(self, path: runlog.Where):
        self.path = StoragePath.of(path)
        self._sweep: dict[str, Any] | None = None  # sweep.json as read or last written here
        self._records: dict[str, TrialRecord] = {}  # trial.json files as read or written while no session is open
        self._session_open = False
        self.admitted = False  # admit() found nothing to refuse

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # -- reads ---------------------------------------------------------------------------------------------------

    @property
    def sweep_file(self) -> StoragePath:
        return self.path / runlog.SWEEP_FILE

    def trial_file(self, name: str) -> StoragePath:
        return self.path / name / runlog.TRIAL_FILE

    def sweep(self) -> dict[str, Any]:
        """sweep.json's object (a copy of this object's); {} where there is none."""
        if self._sweep is None:
            self._sweep = runlog.read_json(self.sweep_file)
        return copy.deepcopy(self._sweep)

    def holds_run(self) -> bool:
        return bool(self.sweep())

    def trial(self, name: str) -> TrialRecord:
        """Trial `name`'s record; an empty one (pending, no keys) where it has no trial.json."""
        if name in self._records:
            return self._records[name]
        return self._keep(TrialRecord.from_json(name, runlog.read_json(self.trial_file(name))))

    def _keep(self, record: TrialRecord) -> TrialRecord:
        if not self._session_open:
            self._records[record.name] = record
        return record

    def trials(self, names: list[str]) -> list[TrialRecord]:
        return [self.trial(name) for name in names]

    def all_final(self, names: list[str]) -> bool:
        """Every trial of `names` has ended (finished, failed, diverged, oom)."""
        return all(record.status in runlog.FINAL_STATUSES for record in self.trials(names))

    # -- refusals ------------------------------------------------------------------------------------------------

    def admit(self, plan: SweepPlan, resume: bool, resumable: bool = True) -> None:
        """ConfigError when `plan` may not run here (new_run_refusal, or resume_refusal with `resume`), from
        sweep.json alone, so before Ray starts. Asked once: the driver's later calls on this object (run_plan after
        api.execute_plan asked, --until-settled's rounds resuming what this driver wrote) see `admitted`."""
        refusal = self.resume_refusal(plan) if resume else self.new_run_refusal(plan.name, resumable)
        if refusal:
            raise ConfigError(refusal)
        self.admitted = True

    def new_run_refusal(self, plan_name: str, resumable: bool = True) -> str | None:
        """Why a new run of `plan_name` may not start here, in one line; None when the folder holds no run: no
        sweep.json and no trial folder. A sweep.json that cannot be read is not "no run": a new run would adopt the
        old one's trials and checkpoints. A finished run is not offered --resume: it has nothing left; nor is a run
        that cannot be resumed (`cifar-ray train` has no --resume)."""
        options = "pass --resume to finish it, --name NEW" if resumable else "pass --name NEW"
        try:
            sweep = self.sweep()
        except StorageError as error:
            return f"{error}; {self.path} may hold a run: {options} to start another, or move the folder away"
        if not sweep:
            trials = runlog.trial_folders(self.path)
            if not trials:
                return None
            shown = ", ".join(trials[:3]) + (f" and {len(trials) - 3} more" if len(trials) > 3 else "")
            return (
                f"{self.path} holds trial folders ({shown}) but no {runlog.SWEEP_FILE}: pass --name NEW to start "
                "another run, or move the folder away"
            )
        names = list(sweep.get("trials", []))
        if "finished_at" in sweep or names and self.all_final(names):
            trials = f"{len(names)} trial{'s' * (len(names) != 1)}"
            return (
                f"{self.path} already holds a finished run of '{plan_name}' ({trials}): see it with `cifar-ray report "
                f"{shlex.quote(str(self.path))}`; pass --name NEW to start another, or delete the folder"
            )
        return (
            f"{self.path} already holds an unfinished run of '{plan_name}': {options} to start another, or delete "
            "the folder"
        )

    def resume_refusal(self, plan: SweepPlan) -> str | None:
        """Why `plan` cannot resume the run here, read from its sweep.json alone (so before Ray starts): no run
        there, another sweep's trials, or an older --isolate run; None when it can."""
        previous = self.sweep()
        if not previous:
            return f"nothing to resume in {self.path}: no interrupted run of '{plan.name}' there; run without --resume"
        recorded = previous.get("trials") or []
        if [t.name for t in plan.trials][: len(recorded)] != recorded:
            return (
                f"{self.path} holds a different sweep (its trials differ from this file's); resume with the same "
                "file and --set values, or use --name"
            )
        return self.old_isolated_run_refusal(previous)

    def old_isolated_run_refusal(self, sweep: dict) -> str | None:
        """Runs started with --isolate before trials ran in slots kept Ray Train's checkpoints in <trial>/train,
        which this version does not read: refused, not trained again from scratch."""
        if sweep.get("warm") or sweep.get("slots"):
            return None
        return (
            f"{self.path} was started with --isolate by an older cifar-ray (a Ray Train run per trial, checkpoints "
            "in <trial>/train), which this version cannot continue: finish it with that version, or pass --name NEW"
        )

    def damaged_trials(self) -> dict[str, str]:
        """The run's planned trials (sweep.json's list) whose trial.json cannot say who they are: missing, empty, not
        JSON after every try, or without the plan's identity (index, name, swept, config); name -> what is wrong."""
        damaged = {}
        for name in self.sweep().get("trials", []):
            path = self.trial_file(name)
            try:
                data = self.trial(name).to_json()  # kept: the resume reads it once
            except StorageError as error:
                if not isinstance(error.__cause__, ValueError):  # an outage or a refusal: not damage
                    raise
                empty = not path.read_bytes().strip()  # a full disk at the write leaves none
                damaged[name] = f"{runlog.TRIAL_FILE} is {'empty' if empty else 'not JSON'}"
                continue
            lacking = [key for key in IDENTITY if key not in data]
            if not data and not path.exists():
                damaged[name] = f"no {runlog.TRIAL_FILE}"
            elif lacking:
                damaged[name] = f"{runlog.TRIAL_FILE} {'is empty' if not data else 'lacks ' + ', '.join(lacking)}"
        return damaged

    def rebuild_trials(self, plan: SweepPlan, damaged: dict[str, str]) -> None:
        """Each `damaged` trial's trial.json rebuilt from the plan (its index, name, swept values and config), keeping
        what a readable one held, and its status from what its folder holds: interrupted (a resume continues it from
        its checkpoint, or closes it when every epoch is logged) where it logged an epoch or saved a checkpoint, else
        pending; a note says why. What a readable one held is the record damaged_trials kept (before the session
        opens): a file that is not JSON is not read, and retried, again."""
        for spec in plan.trials:
            if spec.name not in damaged:
                continue
            folder = self.path / spec.name
            held = bool(runlog.read_epochs(folder)) or (folder / CHECKPOINTS).exists()
            record = self._records.get(spec.name)  # none for a file that is not JSON
            kept = record.to_json() if record is not None else {}
            status = kept.get("status") or ("interrupted" if held else "pending")
            note = f"{runlog.TRIAL_FILE} rebuilt from the plan on --resume ({damaged[spec.name]})"
            record = kept | spec.as_dict() | {"status": status, "notes": [*kept.get("notes", []), note]}
            self._records.pop(spec.name, None)
            self._write_trial(TrialRecord.from_json(spec.name, record))

    def changed_configs_refusal(self, plan: SweepPlan, damaged: Sequence[str] = ()) -> str | None:
        """Why `plan` may not resume the run here, in one line: the resolved config of a trial differs from the
        one its trial.json recorded (old -> new per key); None when they agree. Keys the recorded config lacks
        (added by a later cifar-ray) are not compared, nor the `damaged` trials (damaged_trials): the plan rebuilds
        them."""
        changes = []
        for trial in plan.trials:
            if trial.name in damaged:
                continue
            recorded = self.trial(trial.name).config
            if not recorded:
                continue
            resolved = json.loads(json.dumps(trial.config.model_dump()))  # as trial.json holds it: lists, not tuples
            keys = [key for key in recorded if key in resolved and recorded[key] != resolved[key]]
            if keys:
                change = ", ".join(f"{k} {recorded[k]!r} -> {resolved[k]!r}" for k in keys)
                changes.append(f"{trial.name} ({change})")
        if not changes:
            return None
        return (
            f"--resume would train {self.path}'s trials with other configs than they started with: "
            f"{'; '.join(changes)}; resume with the same file and --set values, or pass --name NEW to start another run"
        )

    # -- writes: the sweep ---------------------------------------------------------------------------------------

    def create(self, plan: SweepPlan, facts: dict[str, Any]) -> None:
        """A new run of `plan`: sweep.json (the plan's summary, then `facts`: when, where, with what it started)
        and a pending trial.json per trial."""
        self.path.mkdir()
        self._write_sweep(plan.summary() | facts)
        self._add_pending(plan.trials)

    def add_trials(self, plan: SweepPlan, added: list[str]) -> None:
        """A --resume that adds seeds: sweep.json lists every trial and the repeat counts (an unfinished run again,
        so no finished_at), and each new trial gets its first trial.json; the trials already there are not
        touched."""
        summary = plan.summary()
        sweep = {k: v for k, v in self.sweep().items() if k != "finished_at"}
        self._write_sweep(sweep | {k: summary[k] for k in ("trials", "repeats", "repeat_counts")})
        self._add_pending([t for t in plan.trials if t.name in added])

    def _add_pending(self, trials: list[TrialSpec]) -> None:
        for trial in trials:
            self._write_trial(TrialRecord.from_json(trial.name, trial.as_dict() | {"status": "pending"}))

    def _write_sweep(self, sweep: dict[str, Any]) -> dict[str, Any]:
        runlog.write_json(self.sweep_file, sweep)
        self._sweep = copy.deepcopy(sweep)
        return sweep

    def update_sweep(self, **fields: Any) -> dict[str, Any]:
        """Set `fields` in sweep.json, keeping its other keys (a mark that the run stopped, a round of seeds)."""
        return self._write_sweep(self.sweep() | fields)

    def open_session(self, started: float) -> int:
        """This session's start into sweep.json's sessions, before any trial runs; returns its number (1-based). A
        session an earlier driver left open was killed (SIGKILL, a lost machine: no `finally` ran): it is closed
        first, ended at the last thing its trials logged, `end` saying so, so that wall_time_s still sums every
        session (a run from before sessions were kept counts its recorded wall time as one)."""
        sessions = self._killed_sessions_closed()
        sessions.append({"start_unix": started})
        self.update_sweep(sessions=sessions, wall_time_s=_wall(sessions))
        self._session_open, self._records = True, {}  # the Dispatcher writes trial.json from now on
        return len(sessions)

    def _killed_sessions_closed(self) -> list[dict]:
        """sweep.json's sessions, each one a killed driver left open ended at the last thing its trials logged."""
        sweep = self.sweep()
        earlier = sweep.get("wall_time_s") or 0.0
        sessions = sweep.get("sessions") or ([{"wall_s": earlier}] if earlier else [])
        for session in sessions:
            if "end_unix" not in session and "start_unix" in session:
                ended = max(session["start_unix"], self.last_activity(session["start_unix"]))
                session |= {"end_unix": ended, "wall_s": ended - session["start_unix"], "end": "killed: last logged"}
        return sessions

    def close_after_kill(self) -> dict[str, Any] | None:
        """A run whose trials have all ended but that its driver never closed (killed after the last one ended):
        its sessions closed as open_session closes a killed one, finished_at the last session's end; returns the new
        sweep.json, or None when the run was closed already."""
        if "finished_at" in self.sweep():
            return None
        sessions = self._killed_sessions_closed()
        ended = max((session["end_unix"] for session in sessions if "end_unix" in session), default=None)
        return self.update_sweep(sessions=sessions, wall_time_s=_wall(sessions), finished_at=runlog.now_iso(ended))

    def close_session(self, done: bool, ended: float | None = None) -> None:
        """This session's end (Unix time `ended`, now if None: one clock read) and wall time; wall_time_s is the sum
        over sessions; finished_at, the same moment, once every trial is (`done`)."""
        sessions, ended = self.sweep()["sessions"], time.time() if ended is None else ended
        sessions[-1] |= {"end_unix": ended, "wall_s": ended - sessions[-1]["start_unix"]}
        finished = {"finished_at": runlog.now_iso(ended)} if done else {}
        self.update_sweep(sessions=sessions, wall_time_s=_wall(sessions), **finished)
        self._session_open = False

    def end_session(self, names: list[str]) -> None:
        """Once the session's slots and Dispatcher are stopped: its trials `names` still running marked
        interrupted, then the session closed (done when every trial is final), each trial.json read once."""
        records = self.mark_interrupted(names)
        self.close_session(all(record.status in runlog.FINAL_STATUSES for record in records))
        for record in records:  # no Dispatcher writes them until the next session
            self._records[record.name] = record

    def last_activity(self, since: float) -> float:
        """When the run's trials last logged something (an epoch's end, a trial's start or end) after `since`."""
        times = []
        for trial in runlog.load_run(self.path).trials:
            times += [row.get("end_unix") for row in trial.epochs]
            times += [trial.record.started_unix, trial.record.finished_unix]
        return max((t for t in times if isinstance(t, (int, float)) and t >= since), default=since)

    def record_provenance(self, session: int, git: dict, diff: str, packages: dict, gpu: dict) -> None:
        """Session `session`'s provenance record and diff (core/provenance.py); one already there is refused."""
        provenance.write_session(self.path, session, git, diff, packages, gpu)

    # -- writes: the trials --------------------------------------------------------------------------------------

    def update_trial(self, name: str, **fields: Any) -> TrialRecord:
        """Set `fields` in trial `name`'s trial.json, keeping its other keys (read from the file, unless this object
        holds it)."""
        if name in self._records:
            return self._write_trial(self._records[name], **fields)
        return self._keep(TrialRecord.from_json(name, runlog.update_json(self.trial_file(name), **fields)))

    def _write_trial(self, record: TrialRecord, **fields: Any) -> TrialRecord:
        data = record.to_json() | fields
        runlog.write_json(self.trial_file(record.name), data)
        return self._keep(TrialRecord.from_json(record.name, data))

    def add_note(self, name: str, line: str) -> None:
        """A line trial `name`'s log must keep (a damaged checkpoint passed over): appended to its notes."""
        self.update_trial(name, notes=[*self.trial(name).notes, line])

    def record_failure(self, name: str, status: str, error: str) -> None:
        self.update_trial(name, status=status, error=error, finished_at=runlog.now_iso())

    def record_outcome(self, name: str) -> None:
        """Mark a trial whose training has ended finished or diverged (from its logged epochs), once. The
        Dispatcher calls it when a slot tells it the last (or a diverged) epoch ended, logged and checkpointed, and
        again when the slot is done with the trial: a sweep interrupted in between keeps the trial finished."""
        if self.trial(name).status in runlog.TRAINED_STATUSES:
            return
        diverged = [row["epoch"] for row in runlog.read_epochs(self.path / name) if row.get("diverged")]
        self.update_trial(
            name,
            status="diverged" if diverged else "finished",
            diverged_epoch=diverged[0] if diverged else None,
            finished_at=runlog.now_iso(),
            finished_unix=time.time(),
        )

    def mark_interrupted(self, names: list[str]) -> list[TrialRecord]:
        """Trials still `running` once the slots are stopped are not: interrupted, continued by --resume. Returns
        the records of `names` as they now are."""
        records = self.trials(names)
        return [
            self._write_trial(r, status="interrupted", interrupted_at=runlog.now_iso()) if r.status == "running" else r
            for r in records
        ]


def _wall(sessions: list[dict]) -> float:
    return sum(session.get("wall_s", 0.0) for session in sessions)
