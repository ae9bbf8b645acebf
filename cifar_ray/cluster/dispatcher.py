"""What a trial is as it travels (RunTrial: from the driver to Tune, the Dispatcher and the slots) and the
Dispatcher: the trials not yet finished, per shape, handed to slots as they ask, and the one writer of trial.json
while a sweep runs, through the run folder's owner (core/run.py) (an async Ray actor, pinned to the driver's node:
cluster/slots.py starts it)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from typing import Any

from ..core import runlog
from ..core.checkpoints import complete_checkpoints
from ..core.config import TrainConfig
from ..core.run import RunFolder
from ..core.shapes import trial_shape
from ..core.storage import StoragePath
from ..core.sweep import TrialSpec

DISPATCHER = "cifar-ray-dispatcher"
WORKER_DIED = "a worker of the trial's slot died"


@dataclasses.dataclass(frozen=True)
class RunTrial:
    """A trial of a run as it travels from the driver to Tune, the Dispatcher and the slots: the plan's
    TrialSpec with its run folder and shape, and the run options that change how it is watched, never what it
    trains (not config keys: they are no part of a trial's identity or of --resume's checks)."""

    name: str
    swept: dict[str, Any]
    config: TrainConfig
    run_dir: StoragePath
    shape: str
    profile: bool = False  # --profile: rank 0 profiles a few steps of its first epoch (training/profile.py)

    @classmethod
    def of(cls, trial: TrialSpec, run_dir: StoragePath, profile: bool = False) -> RunTrial:
        return cls(trial.name, trial.swept, trial.config, run_dir, trial_shape(trial.config).key, profile)

    @property
    def trial_dir(self) -> StoragePath:
        return self.run_dir / self.name

    @property
    def trial_file(self) -> StoragePath:
        return self.trial_dir / runlog.TRIAL_FILE

    @property
    def run(self) -> RunFolder:
        """The owner of the trial's run folder, the one writer of its trial.json."""
        return RunFolder(self.run_dir)


def tune_trial(trial: TrialSpec, run_dir: StoragePath) -> dict:
    """A thin Tune trial's value in the param_space: Tune sees the name as is (its folder and trial name are made
    from it before anything else is resolved), the RunTrial only once it runs the trial."""
    return {"name": trial.name, "run": RunTrial.of(trial, run_dir)}


def tune_run_trial(tune_config: dict) -> RunTrial:
    """The RunTrial in a thin Tune trial's config."""
    return tune_config["trial"]["run"]


class Dispatcher:
    """The trials not yet finished, per shape, and what happened to each (an async Ray actor), and the one
    writer of trial.json while a sweep runs. A slot takes trials from it and tells it what happens; a thin Tune
    trial waits on it for its trial's news (no polling: on 2 cores, five thin trials asking five times a second
    slowed the training next to them). `one_trial`: each slot takes one trial, then ends (--isolate)."""

    def __init__(self, specs: list[RunTrial], slots: dict[str, list[str]], one_trial: bool = False):
        self.specs = {spec.name: spec for spec in specs}
        self.live = {shape: set(names) for shape, names in slots.items()}  # slots that may still take a trial
        self.pending: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        for spec in specs:
            self.pending[spec.shape].append(spec)
        self.one_trial = one_trial
        self.served: set[str] = set()  # slots that took a trial
        self.in_flight: dict[str, RunTrial] = {}  # slot -> the trial it runs
        self.attempts: collections.Counter = collections.Counter()
        self.errors: dict[str, tuple[str, str]] = {}  # trial -> (status, one-line error) of its last failure
        self.news: dict[str, list[dict]] = collections.defaultdict(list)
        self.log: list[tuple[str, dict]] = []  # every trial's news, in the order it came (the driver prints it)
        self.changed: asyncio.Condition | None = None  # made in the actor's event loop, on first use
        self.followed = True  # false once the driver stops printing events: a read waiting for some returns

    def _condition(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed

    async def _tell(self, trial: str, event: dict) -> None:
        async with self._condition():
            self.news[trial].append(event)
            self.log.append((trial, event))
            self._condition().notify_all()

    async def read(self, trial: str, since: int, wait_s: float) -> list[dict]:
        """The trial's news from index `since`, waiting up to wait_s for some."""
        async with self._condition():
            if len(self.news[trial]) <= since:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._condition().wait_for(lambda: len(self.news[trial]) > since), wait_s)
            return self.news[trial][since:]

    async def events(self, since: int, wait_s: float) -> list[tuple[str, dict]]:
        """Every trial's news from index `since` of the log, as (trial, event), waiting up to wait_s for some (not
        once end_events was called)."""
        async with self._condition():
            if len(self.log) <= since and self.followed:
                with contextlib.suppress(asyncio.TimeoutError):
                    news = self._condition().wait_for(lambda: len(self.log) > since or not self.followed)
                    await asyncio.wait_for(news, wait_s)
            return self.log[since:]

    async def end_events(self) -> None:
        """The driver stops following the events: its waiting read returns now, not up to a second later."""
        async with self._condition():
            self.followed = False
            self._condition().notify_all()

    async def take(self, shape: str, slot: str) -> RunTrial | None:
        """The slot's next trial: the one it was running, if its worker group was restarted (continued
        from its checkpoint while it has failures left), else the next of its shape; None when none is left
        (or, one_trial, once the slot took its trial): the slot then ends."""
        spec = self.in_flight.get(slot)
        if spec is not None and self.attempts[spec.name] > spec.config.max_failures:
            await self._fail(slot, spec)
            spec = None
        if spec is None:
            if not self.pending[shape] or (self.one_trial and slot in self.served):
                self.live[shape].discard(slot)  # it ends: a trial handed back later must not wait for it
                return None
            spec = self.in_flight[slot] = self.pending[shape].popleft()
            self.served.add(slot)
        self.attempts[spec.name] += 1
        start, logged = resume_point(spec.trial_dir)
        await self._tell(spec.name, {"start": start, "logged": logged})
        return spec

    async def wanted(self, shape: str, slot: str) -> bool:
        """Whether a slot about to start would get a trial: one of its shape waits. If none does, the slot is not
        started and no longer counts as live, as if it had started, asked take() and ended (--max-concurrent starts
        a shape's later slots only as earlier ones end, by when those may have trained every trial of it)."""
        if self.pending[shape]:
            return True
        self.live[shape].discard(slot)
        return False

    async def record(self, trial: str, fields: dict) -> None:
        """Facts a slot's rank 0 found about the trial (running, system, slot, timeline) into its trial.json."""
        self.specs[trial].run.update_trial(trial, **fields)

    async def epoch(self, trial: str, metrics: dict) -> None:
        """An epoch ended, logged and checkpointed: the last one (or a diverged one) ends the trial, recorded
        before the news goes out, so the progress line counts it and an interrupted sweep keeps it."""
        if metrics["epoch"] == self.specs[trial].config.epochs or metrics.get("diverged"):
            self.specs[trial].run.record_outcome(trial)
        await self._tell(trial, {"epoch": metrics})

    async def note(self, trial: str, line: str) -> None:
        """Something the trial's log must say (a damaged checkpoint passed over): kept in trial.json's notes and
        printed by the progress callback."""
        self.specs[trial].run.add_note(trial, line)
        await self._tell(trial, {"note": line})

    async def done(self, slot: str, trial: str) -> None:
        self.specs[trial].run.record_outcome(trial)
        self.in_flight.pop(slot, None)
        await self._tell(trial, {"done": True})

    async def failed_attempt(self, trial: str, status: str, error: str, trace: str | None, final: bool = False) -> None:
        """An attempt of the trial raised (`trace`: rank 0's traceback, kept in error.txt). `final` (out of GPU
        memory): no attempt is left, so the restarted slot's question fails the trial instead of retrying it."""
        self.errors[trial] = (status, error)
        if final:
            self.attempts[trial] = self.specs[trial].config.max_failures + 1
        if trace is not None:
            (self.specs[trial].trial_dir / runlog.ERROR_FILE).write_text(trace)

    async def worker_died(self, slot: str, status: str, error: str) -> None:
        """A worker of the slot died (killed, out of memory, its node lost): the attempt of its trial failed."""
        spec = self.in_flight.get(slot)
        if spec is not None:
            self.errors[spec.name] = (status, error)

    async def slot_failed(self, slot: str, shape: str, status: str, error: str) -> None:
        """A slot's Ray Train run gave up (its restarts used up, or its workers never started) or its task died
        (with its node): its trial goes to another slot of its shape while it has attempts left, else fails; every
        trial of its shape still waiting fails when no other slot of the shape is left to run it."""
        self.live[shape].discard(slot)
        spec = self.in_flight.get(slot)
        if spec is not None and self.live[shape] and self.attempts[spec.name] <= spec.config.max_failures:
            del self.in_flight[slot]
            self.pending[shape].appendleft(spec)  # continued from its checkpoint by the next slot that asks
        elif spec is not None:
            self.errors.setdefault(spec.name, (status, error))
            await self._fail(slot, spec)
        while not self.live[shape] and self.pending[shape]:
            spec = self.pending[shape].popleft()
            self.errors[spec.name] = (status, f"no slot left to run it: {error}")
            await self._fail(None, spec)

    async def _fail(self, slot: str | None, spec: RunTrial) -> None:
        """The trial failed for good. Its thin trial is told even when trial.json cannot be written (else it
        would wait forever); the slot keeps it in flight until the write succeeds: a restarted slot retries it."""
        status, error = self.errors.get(spec.name, ("failed", WORKER_DIED))
        try:
            spec.run.record_failure(spec.name, status, error)
        finally:
            await self._tell(spec.name, {"failed": error, "status": status})
        self.in_flight.pop(slot, None)


def resume_point(trial_dir: StoragePath) -> tuple[int, int]:
    """Where a trial taken now continues: after its newest complete checkpoint at or before its last logged epoch
    (training.state.resume_newest starts there; it says so should that one not load), 0 without one; and how many
    epochs it had logged (more than the first: it starts again from epoch 1)."""
    logged = runlog.read_epochs(trial_dir)
    last = logged[-1]["epoch"] if logged else 0
    newest = complete_checkpoints(trial_dir, last) if last else []
    return (newest[0] if newest else 0), len(logged)


def dispatcher_name(run_name: str) -> str:
    return f"{DISPATCHER}-{run_name}"


def broker_name() -> str:
    """The name of this job's pool broker (a job has one pool at a time, cluster/pool.py): thin trials find their
    Dispatcher by it."""
    import ray

    return f"cifar-ray-pool-{ray.get_runtime_context().get_job_id()}"
