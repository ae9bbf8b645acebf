"""Warm worker slots: trials stream through long-lived Ray Train runs instead of one run each.

A fresh `TorchTrainer.fit()` per trial costs ~20 s here before and after its training (a controller, a
worker group, a process group, every process importing torch: reports/bench). A **slot** is one
long-lived `fit()` of a trial shape (workers, CPUs and GPUs per worker, backend, strategy). Its workers
loop: rank 0 takes the next trial of that shape from the Dispatcher, broadcasts it to every rank, and
the ranks train it with the same code as a fresh run (`train.run_trial`: model, optimizer, DDP wrapper,
hooks and every random stream are built from the trial's config), then take the next. The processes,
the process group, the imports and the loaded dataset stay warm.

Ray Tune stays the sweep engine: each trial is still a Tune trial (names, results, experiment state,
restore), now a thin one that holds no core and forwards the epochs the Dispatcher collected for it.
The Dispatcher holds the whole plan, so slots never wait on Tune: a slot takes trials whether or not
Tune has started their thin trial yet, and Tune runs only as many thin trials as there are slots plus
LOOK_AHEAD. Every shape gets as many slots as copies of it fit the cluster; Ray starts a slot's worker
group when its resources are free (a placement group takes all its bundles or none), and a slot ends when
its shape has no trial left, so shapes never deadlock each other.

Failures: checkpoints are the trial's own (in the trial folder: checkpoints.py). A worker that dies, or a
trial that raises, ends the slot's worker group; Ray Train starts a new one, whose rank 0 gets the same
trial back from the Dispatcher and continues it from its last checkpoint, up to the trial's
max_failures times; then the trial is failed and the slot goes on with the next. A diverged trial just
ends: the slot goes on. `--resume` trains a failed trial again from its last checkpoint, as with --isolate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import runlog, sysinfo
from ..core.checkpoints import fetch_checkpoint, store_checkpoint
from ..core.config import TrainConfig
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan
from .placement import trial_bundles, trials_that_fit, worker_resources
from .session import error_line, failure_status

DISPATCHER = "cifar-ray-dispatcher"
LOOK_AHEAD = 1  # thin trials started beyond the slots: a trial a slot takes is forwarded at once
NEWS_WAIT_S = 30.0  # the longest a thin trial's question for news waits before it asks again
STARTED = "slot_started_after_epoch"  # the result a thin trial reports when its slot takes the trial


def shape_key(cfg: TrainConfig) -> str:
    """Trials with the same key can run one after another in the same worker group."""
    resources = ",".join(f"{k}={v:g}" for k, v in sorted(worker_resources(cfg).items()))
    return f"{cfg.ray_workers}x[{resources}]/{cfg.backend}/{cfg.strategy}"


class Dispatcher:
    """The trials not yet finished, per shape, and what happened to each (an async Ray actor). A slot takes
    trials from it; a thin Tune trial waits on it for its trial's news (no polling: on 2 cores, five thin
    trials asking five times a second slowed the training next to them)."""

    def __init__(self, specs: list[dict], run_dir: StoragePath, slots: dict[str, list[str]]):
        self.run_dir = run_dir
        self.live = {shape: set(names) for shape, names in slots.items()}  # slots whose Ray Train run has not failed
        self.pending: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        for spec in specs:
            self.pending[spec["shape"]].append(spec)
        self.in_flight: dict[str, dict] = {}  # slot -> the trial it runs
        self.attempts: collections.Counter = collections.Counter()
        self.errors: dict[str, tuple[str, str]] = {}  # trial -> (status, one-line error) of its last failure
        self.news: dict[str, list[dict]] = collections.defaultdict(list)
        self.changed: asyncio.Condition | None = None  # made in the actor's event loop, on first use

    def _condition(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed

    async def _tell(self, trial: str, event: dict) -> None:
        async with self._condition():
            self.news[trial].append(event)
            self._condition().notify_all()

    async def read(self, trial: str, since: int, wait_s: float) -> list[dict]:
        """The trial's news from index `since`, waiting up to wait_s for some."""
        async with self._condition():
            if len(self.news[trial]) <= since:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._condition().wait_for(lambda: len(self.news[trial]) > since), wait_s)
            return self.news[trial][since:]

    async def take(self, shape: str, slot: str) -> dict | None:
        """The slot's next trial: the one it was running, if its worker group was restarted (continued
        from its checkpoint while it has failures left), else the next of its shape; None when none is left."""
        spec = self.in_flight.get(slot)
        if spec is not None and self.attempts[spec["name"]] > spec["config"]["max_failures"]:
            await self._fail(slot, spec)
            spec = None
        if spec is None:
            if not self.pending[shape]:
                return None
            spec = self.in_flight[slot] = self.pending[shape].popleft()
        self.attempts[spec["name"]] += 1
        await self._tell(spec["name"], {"start": len(runlog.read_epochs(self.run_dir / spec["name"]))})
        return spec

    async def failed_attempt(self, trial: str, status: str, error: str) -> None:
        self.errors[trial] = (status, error)

    async def slot_failed(self, slot: str, shape: str, error: str) -> None:
        """A slot's Ray Train run gave up (its restarts used up, or its workers never started): its trial fails,
        and so does every trial of its shape still waiting when no other slot of the shape is left to run it."""
        self.live[shape].discard(slot)
        spec = self.in_flight.get(slot)
        if spec is not None:
            self.errors.setdefault(spec["name"], ("failed", error))
            await self._fail(slot, spec)
        while not self.live[shape] and self.pending[shape]:
            spec = self.pending[shape].popleft()
            self.in_flight[slot] = spec
            self.errors[spec["name"]] = ("failed", f"no slot left to run it: {error}")
            await self._fail(slot, spec)

    async def epoch(self, trial: str, metrics: dict) -> None:
        await self._tell(trial, {"epoch": metrics})

    async def done(self, slot: str, trial: str) -> None:
        self.in_flight.pop(slot, None)
        await self._tell(trial, {"done": True})

    async def _fail(self, slot: str, spec: dict) -> None:
        del self.in_flight[slot]
        status, error = self.errors.get(spec["name"], ("failed", "a worker of the trial's slot died"))
        runlog.update_json(
            self.run_dir / spec["name"] / runlog.TRIAL_FILE, status=status, error=error, finished_at=runlog.now_iso()
        )
        await self._tell(spec["name"], {"failed": error, "status": status})


# ------------------------------------------------------------------------------------- the slot


def epoch_reporter(
    dispatcher, trial: str, trial_dir: StoragePath, keep_checkpoints: int, rank: int
) -> Callable[[dict, Path | None], None]:
    """run_trial's `report` for `trial` in a slot: rank 0 keeps the epoch's checkpoint in the trial's folder
    and tells the Dispatcher the epoch; the other ranks have nothing to add (the metrics are all-reduced)."""
    import ray

    def report(metrics: dict, folder: Path | None) -> None:
        if rank == 0:
            if folder is not None:  # written before the epoch is announced: a restart finds it
                store_checkpoint(trial_dir, folder, metrics["epoch"], keep_checkpoints)
            ray.get(dispatcher.epoch.remote(trial, metrics))

    return report


def slot_loop(loop_config: dict) -> None:
    """What every worker of a slot runs (Ray Train's train_loop_per_worker): trial after trial."""
    import ray
    import ray.train
    import torch
    from ray.train.collective import broadcast_from_rank_zero

    from ..training.loop import Worker, run_trial, select_devices, worker_system

    dispatcher, shape, slot = loop_config["dispatcher"], loop_config["shape"], loop_config["slot"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    worker, system = None, None
    while True:
        spec = broadcast_from_rank_zero(ray.get(dispatcher.take.remote(shape, slot)) if rank == 0 else None)
        if spec is None:
            return
        taken = time.time()
        cfg = TrainConfig(**spec["config"])
        trial_dir = spec["run_dir"] / spec["name"]
        if worker is None:  # the first trial sets the worker up; every trial of the shape shares it
            torch.set_num_threads(cfg.cpus_per_worker)
            worker = Worker(rank, world, select_devices(cfg))
            system = worker_system(worker)
        if cfg.compile:  # dynamo's caches hold the previous trial's model: past 8 recompiles it runs eager
            torch._dynamo.reset()
        if rank == 0:
            runlog.update_json(
                trial_dir / runlog.TRIAL_FILE,
                status="running",
                error=None,
                started_at=runlog.now_iso(),
                started_unix=taken,
                system=system,
                slot=slot,
                driver=sysinfo.worker_placement(),
            )
        report = epoch_reporter(dispatcher, spec["name"], trial_dir, cfg.keep_checkpoints, rank)
        with tempfile.TemporaryDirectory() as scratch:
            try:
                run_trial(cfg, trial_dir, worker, report, fetch_checkpoint(trial_dir, Path(scratch)), taken)
            except Exception as error:
                if rank == 0:
                    (trial_dir / runlog.ERROR_FILE).write_text("".join(traceback.format_exception(error)))
                ray.get(dispatcher.failed_attempt.remote(spec["name"], failure_status(error), error_line(error)))
                raise  # Ray Train restarts the worker group, whose rank 0 gets this trial back
        if rank == 0:
            runlog.record_outcome(trial_dir)
            ray.get(dispatcher.done.remote(slot, spec["name"]))


def run_slot(shape_cfg: dict, shape: str, slot: str, dispatcher, storage: StoragePath, restarts: int) -> None:
    """One slot: a TorchTrainer whose workers run slot_loop until their shape has no trial left (a Ray task)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    cfg = TrainConfig(**shape_cfg)
    trainer = TorchTrainer(
        slot_loop,
        train_loop_config={"dispatcher": dispatcher, "shape": shape, "slot": slot},
        torch_config=TorchConfig(backend=cfg.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.ray_workers, use_gpu=cfg.use_gpu == "true", resources_per_worker=worker_resources(cfg)
        ),
        run_config=ray.train.RunConfig(
            name=slot, **storage.ray_storage(), failure_config=ray.train.FailureConfig(max_failures=restarts)
        ),
    )
    try:
        trainer.fit()
    except Exception as error:
        ray.get(dispatcher.slot_failed.remote(slot, shape, error_line(error)))
        raise


class StartedSlots:
    """The Dispatcher and the slot tasks of a run. With a limit, at most that many slots run at once: the next
    is started as one ends (a thread here), so `--max-concurrent N` means N trials at once across shapes."""

    def __init__(self, dispatcher, launches: list[Callable[[], Any]], limit: int | None):
        import threading

        self.dispatcher, self.launches = dispatcher, list(launches)
        self.tasks = [launch() for launch in self.launches[: limit or len(self.launches)]]
        self.stopped = threading.Event()
        self.launcher = threading.Thread(target=self._launch_as_slots_end, name="cifar-ray-slots", daemon=True)
        self.launcher.start()

    def _launch_as_slots_end(self) -> None:
        import ray

        running, waiting = list(self.tasks), self.launches[len(self.tasks) :]
        while waiting and not self.stopped.is_set():
            ended, running = ray.wait(running, num_returns=1, timeout=1.0)
            for _ in ended[: len(waiting)]:
                task = waiting.pop(0)()
                self.tasks.append(task)
                running.append(task)

    def wait(self) -> None:
        """Until every slot has ended (each ends when its shape has no trial left)."""
        import ray

        self.launcher.join()
        ray.get(self.tasks)

    def stop(self) -> None:
        """Ends the slots (their worker groups go with them) and the Dispatcher; a no-op once they ended."""
        import ray

        self.stopped.set()
        self.launcher.join(timeout=5)
        # Only the running ones: cancelling a task as it completes crashes the driver in Ray 2.60 ("Check
        # failed: it != submissible_tasks_.end()" in task_manager.cc, seen here after a sweep's last trial).
        _, running = ray.wait(self.tasks, num_returns=len(self.tasks), timeout=0)
        for task in running:
            ray.cancel(task, force=True)
        ray.kill(self.dispatcher)


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    """The slots of a run, worked out before any starts: orchestrate.run_plan sizes Tune by `count` and
    starts them last, so that nothing that fails on the way to Tuner.fit leaves slots training."""

    run_name: str
    run_dir: StoragePath
    specs: list[dict]  # the trials to train, each with its shape
    slots: dict[str, list[str]]  # shape -> the names of its slots
    launches: list[tuple[dict, str, str, int]]  # per slot: its shape's config, shape, name, worker group restarts
    limit: int | None  # slots running at once at most (--max-concurrent)

    @property
    def count(self) -> int:
        """Slots running at once at most."""
        return min(len(self.launches), self.limit or len(self.launches))

    def start(self) -> StartedSlots:
        """The Dispatcher (named per run) and the slots."""
        import functools

        import ray

        dispatcher = (
            ray.remote(num_cpus=0)(Dispatcher)
            .options(name=dispatcher_name(self.run_name))
            .remote(self.specs, self.run_dir, self.slots)
        )
        task = ray.remote(num_cpus=0, max_retries=0)(run_slot)
        storage = self.run_dir / ".slots"
        try:
            launches = [
                functools.partial(task.remote, shape_cfg, shape, slot, dispatcher, storage, restarts)
                for shape_cfg, shape, slot, restarts in self.launches
            ]
            return StartedSlots(dispatcher, launches, self.limit)
        except BaseException:
            ray.kill(dispatcher)  # slots already launched end at their next question to it
            raise


def plan_slots(plan: SweepPlan, run_dir: StoragePath, capacity: dict[str, Any], max_concurrent: int | None) -> SlotPlan:
    """The slots of every shape of the plan's trials still to train (a failed one continues from its checkpoint,
    as with --isolate): as many per shape as copies of it fit the cluster (and, with max_concurrent, at most
    that many in all at once)."""
    untrained = [
        t
        for t in plan.trials
        if runlog.read_json(run_dir / t.name / runlog.TRIAL_FILE).get("status") not in runlog.TRAINED_STATUSES
    ]
    by_shape: dict[str, list] = collections.defaultdict(list)
    for trial in untrained:
        by_shape[shape_key(trial.config)].append(trial)
    slots, launches = {}, []
    for shape, trials in by_shape.items():
        fit = max(1, trials_that_fit(trials[0].config, capacity["per_node"], slots=False))
        slots[shape] = [f"slot-{uuid.uuid4().hex[:8]}" for _ in range(min(len(trials), fit))]
        restarts = sum(t.config.max_failures + 1 for t in trials)  # every attempt of every trial may restart it
        launches += [(trials[0].config.model_dump(), shape, slot, restarts) for slot in slots[shape]]
    specs = [t.as_dict() | {"run_dir": run_dir, "shape": shape_key(t.config)} for t in untrained]
    return SlotPlan(plan.name, run_dir, specs, slots, launches, max_concurrent)


def dispatcher_name(run_name: str) -> str:
    return f"{DISPATCHER}-{run_name}"


# ----------------------------------------------------------------------------- thin Tune trials


class TrialFailed(RuntimeError):
    """A trial's attempts are used up; its trial.json has the status and the one-line error."""


def thin_trial(tune_config: dict) -> None:
    """A trial as Tune runs it with slots: it forwards the epochs its slot trains to Tune."""
    import ray
    from ray import tune

    spec, run_dir = tune_config["trial"], tune_config["run_dir"]
    if runlog.read_json(run_dir / spec["name"] / runlog.TRIAL_FILE).get("status") in runlog.TRAINED_STATUSES:
        return  # trained before the driver died; Tune's saved state may lag behind our log
    dispatcher = ray.get_actor(dispatcher_name(run_dir.name))
    seen = 0
    while True:
        news = ray.get(dispatcher.read.remote(spec["name"], seen, NEWS_WAIT_S))
        seen += len(news)
        for event in news:
            if "start" in event:  # its slot took it: the progress callback prints "starts" now, not at Tune's start
                tune.report({STARTED: event["start"]})
            elif "epoch" in event:
                tune.report(event["epoch"])
            elif "failed" in event:
                raise TrialFailed(event["failed"])
            else:
                return


def thin_trainable() -> Callable[[dict], None]:
    """thin_trial with no core of its own (see orchestrate.trial_trainable for why a local function)."""
    from ray import tune

    def cifar_ray_thin_trial(config: dict) -> None:
        thin_trial(config)

    head = trial_bundles(TrainConfig(), slots=False)
    return tune.with_resources(cifar_ray_thin_trial, tune.PlacementGroupFactory(head))
