"""Worker slots: every trial runs in a slot, a Ray Train run whose workers take trials from a Dispatcher.

A fresh Ray Train `fit()` costs ~20 s here before and after its training (a controller, a worker group, a
process group, every worker importing torch: reports/bench). A **slot** is one `fit()` of a trial shape
(workers, CPUs and GPUs per worker, backend, strategy). Its workers loop: rank 0 takes the next trial of that
shape from the Dispatcher, broadcasts it to every rank, and the ranks train it with the same code as a fresh
run (`train.run_trial`: model, optimizer, DDP wrapper, hooks and every random stream are built from the trial's
config), then take the next. A warm slot (the default) keeps its processes, process group, imports and loaded
dataset for the next trial; a one-trial slot (`--isolate`) ends after its trial, so each trial gets a fresh
worker group, with the same code, checkpoints and failure handling.

Ray Tune stays the sweep engine: each trial is a Tune trial (names, results, callbacks), a
thin one that holds no core and forwards the epochs the Dispatcher collected for it. The Dispatcher holds the
whole plan, so slots never wait on Tune: a slot takes trials whether or not Tune has started their thin trial
yet, and Tune runs only as many thin trials as slots run at once (each is a process that imports Ray Tune: one
more would only tell Tune of a trial's start a moment sooner). Every shape gets as many
slots as copies of it fit the cluster; Ray starts a slot's worker group when its resources are free (a
placement group takes all its bundles or none), and a slot ends when its shape has no trial left (a one-trial
slot: after its trial), so shapes never deadlock each other.

Run state has one writer: the Dispatcher, pinned to the driver's node, writes trial.json from what the slots
tell it (running, system, slot, timeline, each epoch's end, the outcome, failures and error.txt); rank 0 of a
slot writes only metrics.jsonl and checkpoints; the driver writes sweep.json and the trials' first trial.json.
The slots' Ray Train controllers, started by the driver (no process of ours waits in `fit()`), live on the driver's
node too, and the thin trials on the head (the driver's node wherever a sweep is started from): a lost node takes
only workers with it.

Failures: checkpoints are the trial's own (in the trial folder: core/checkpoints.py). A worker that dies, or a trial
that raises, ends the slot's worker group; Ray Train starts a new one, whose rank 0 gets the same trial back
from the Dispatcher and continues it from its last checkpoint, up to the trial's max_failures times; then the
trial is failed (oom when memory ran out) and the slot goes on with the next. A slot whose Ray Train run gives
up, or whose controller is lost, hands its trial to a surviving slot of its shape while the trial has
attempts left, else fails it. A diverged trial just ends: the slot goes on. `--resume` trains a failed,
interrupted or incomplete trial again from its last checkpoint. A stored checkpoint that does not load is passed
over for the one before (training.state.resume_newest; the trial's progress line says so); when none loads the
trial starts again from epoch 1 with them set aside, once; a second time it fails at once, not retried.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import runlog
from ..core.checkpoints import store_checkpoint
from ..core.config import TrainConfig
from ..core.run import RunFolder
from ..core.shapes import trial_shape
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan
from .dispatcher import Dispatcher, RunTrial, dispatcher_name
from .placement import trials_that_fit, worker_placement
from .session import error_line, failure_status
from .trainer import StartedRun, TrainRun, torch_trainer

CONTROLLER_END_S = 5.0  # how long a killed Ray Train controller may take to end before its placement group goes


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


def next_trial(dispatcher, shape: str, slot: str) -> RunTrial | None:
    """The slot's next trial from the Dispatcher; None, so that the slot ends, when it has none left or the
    Dispatcher is gone (its run stopped): raising instead would restart the worker group to ask a dead actor
    again, ~20 s per restart, until the slot's restarts are used up."""
    import ray

    try:
        return ray.get(dispatcher.take.remote(shape, slot))
    except ray.exceptions.ActorDiedError:
        return None


def next_pooled(broker, shape: str, slot: str) -> tuple[Any, RunTrial] | None:
    """A pool's slot's next trial and the Dispatcher of its sweep (cluster/pool.py: SlotBroker.take waits for
    the next sweep of the slot's shape); None when the pool closes or retires the slot, or its broker is gone."""
    import os

    import ray

    try:
        return ray.get(broker.take.remote(shape, slot, os.getpid()))
    except ray.exceptions.ActorDiedError:
        return None


def keep_out_of_collections() -> None:
    """Moves every object this process holds now (the imports of torch, Ray and ours: ~300,000 of them) out of
    the garbage collector's reach, so that release_trial's collection examines only what the next trial makes.
    Called at the slot's set-up and after each trial's collection: what survives that collection outlives the
    trial (modules the first trial imported lazily, caches); collections that walked it again were most of a
    warm slot's hand-off between trials (reports/bench/README.md)."""
    gc.freeze()


def after_trial(devices) -> None:
    """A warm slot between two trials: what the trial left is collected and its cached GPU memory handed back
    (release_trial), and what survives is kept out of the next trial's collections (keep_out_of_collections)."""
    from ..training.memory import release_trial

    release_trial(devices)
    keep_out_of_collections()


def slot_loop(loop_config: dict) -> None:
    """What every worker of a slot runs (Ray Train's train_loop_per_worker): trial after trial. Rank 0 writes
    the trial's metrics.jsonl and checkpoints; everything else it learns goes to the Dispatcher."""
    import ray
    import ray.train
    import torch
    from ray.train.collective import broadcast_from_rank_zero

    from ..training.distributed import Worker, select_devices, worker_system
    from ..training.loop import TrialOptions, run_trial
    from ..training.memory import GpuOutOfMemoryError
    from ..training.state import NoCheckpointLoadsError

    source, broker = loop_config["dispatcher"], loop_config.get("broker")
    shape, slot = loop_config["shape"], loop_config["slot"]
    launched = loop_config["launched_unix"]  # a one-trial slot's: its trial's wall includes the slot's start
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    worker, system = None, None
    while True:
        handed = None
        if rank == 0 and broker is not None:  # a pool's slot serves one sweep's Dispatcher after another
            handed = next_pooled(broker, shape, slot)
        elif rank == 0:
            spec = next_trial(source, shape, slot)
            handed = None if spec is None else (source, spec)
        handed = broadcast_from_rank_zero(handed)
        if handed is None:
            return
        dispatcher, spec = handed
        taken = time.time()
        cfg = spec.config
        if worker is None:  # the first trial sets the worker up; every trial of the shape shares it
            torch.set_num_threads(cfg.cpus_per_worker)
            worker = Worker(rank, world, select_devices(cfg))
            system = worker_system(worker, trial_shape(cfg).gpus, worker_placement())  # GPUs per Ray worker, dp's all
            # else imported by the first optimizer step: its objects would stay outside the freeze for the first trial
            # only, whose collections would walk them (its epochs measurably slower than its slot's later trials')
            import torch._dynamo  # noqa: F401

            keep_out_of_collections()
        if cfg.compile:  # dynamo's caches hold the previous trial's model: past 8 recompiles it runs eager
            torch._dynamo.reset()
        if rank == 0:
            running = {"status": "running", "error": None, "started_at": runlog.now_iso()}
            where = {"system": system, "slot": slot, "driver": worker_placement()}
            ray.get(dispatcher.record.remote(spec.name, running | {"started_unix": launched or taken} | where))

        def ready(timeline: dict, name: str = spec.name, dispatcher=dispatcher) -> None:
            ray.get(dispatcher.record.remote(name, {"timeline": timeline}))

        def note(line: str, name: str = spec.name, dispatcher=dispatcher) -> None:  # a checkpoint passed over
            if rank == 0:
                ray.get(dispatcher.note.remote(name, line))

        report = epoch_reporter(dispatcher, spec.name, spec.trial_dir, cfg.keep_checkpoints, rank)
        try:
            run_trial(cfg, spec.trial_dir, worker, report, TrialOptions(True, taken, ready, spec.profile, note))
        except Exception as error:
            trace = "".join(traceback.format_exception(error)) if rank == 0 else None
            # Out of memory, it would run out again; with no checkpoint that loads, it would find the same files.
            final = isinstance(error, (GpuOutOfMemoryError, NoCheckpointLoadsError))
            failure = (spec.name, failure_status(error), error_line(error), trace, final)
            ray.get(dispatcher.failed_attempt.remote(*failure))
            raise  # Ray Train restarts the worker group (a rank may wait in a collective); rank 0 asks again
        if rank == 0:
            ray.get(dispatcher.done.remote(slot, spec.name))
        after_trial(worker.devices)


def slot_callbacks(dispatcher, slot: str) -> list:
    """The Ray Train callbacks of a slot's run (on its controller), telling the Dispatcher (a pool's slot: its
    broker, which tells the Dispatcher of the sweep the slot serves) when a worker of the slot died: no rank lives to
    say why, and the restarted group's rank 0 only gets the trial back. Local classes: slots.py imports no Ray at
    import time, and cloudpickle sends them to the controller by value."""
    from ray.train import UserCallback
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    class WorkerDeaths(UserCallback):
        def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
            deaths = [e for e in worker_exceptions.values() if isinstance(e, WorkerHealthCheckFailedError)]
            if deaths:  # a raised exception was told by its rank (failed_attempt). Not waited for: the controller
                # runs callbacks in its event loop; the restarted group's first question comes seconds later.
                dispatcher.worker_died.remote(slot, failure_status(deaths[0]), error_line(deaths[0]))

    return [WorkerDeaths()]


def start_slot(launch: SlotLaunch, dispatcher, storage: StoragePath, one_trial: bool, broker=None) -> StartedRun:
    """One slot: a Ray Train run (trainer.torch_trainer) whose workers run slot_loop until their shape has no trial
    left, or, one_trial, their one trial is done; started from this driver, its controller on this node (StartedSlots
    tells the Dispatcher when it fails). With a `broker` (a pool's slot, cluster/pool.py; `dispatcher` None) it
    takes trials of one sweep after another until the pool retires it."""
    loop_config = {
        "dispatcher": dispatcher,
        "broker": broker,
        "shape": launch.shape,
        "slot": launch.slot,
        "launched_unix": time.time() if one_trial else None,
    }
    run = TrainRun(launch.slot, storage, launch.restarts, slot_callbacks(broker or dispatcher, launch.slot))
    return torch_trainer(slot_loop, loop_config, launch.shape_cfg, run).start()


def report_slot_failure(dispatcher, started: StartedRun, slot: SlotLaunch) -> None:
    """The ended slot's error, if its run ended with one, told to the Dispatcher of its sweep."""
    import ray

    error = started.ended_with()
    if error is not None:  # a failed run, a controller lost with its node: any way a slot can end badly
        with contextlib.suppress(ray.exceptions.RayError):  # a stopped run's Dispatcher is gone: nothing waits
            ray.get(dispatcher.slot_failed.remote(slot.slot, slot.shape, failure_status(error), error_line(error)))


def end_slot_runs(runs: list[StartedRun]) -> None:
    """Ends the slots' Ray Train runs, ended or not: each controller is killed (one whose run ended stays until then)
    and waited for, so that it cannot start another worker group; then the placement groups it made go, which a
    killed controller leaves reserved until the job ends (the next sweep's slots would wait for its cores), the one of
    a worker group still starting among them (placement.remove_placement_groups_of)."""
    import ray

    from .placement import remove_placement_groups_of

    if not runs:
        return
    for started in runs:
        ray.kill(started.controller, no_restart=True)
    deadline = time.monotonic() + CONTROLLER_END_S
    for started in runs:  # a kill is asynchronous: a call may still be answered just after it
        while time.monotonic() < deadline:
            try:
                ray.get(started.controller.__ray_ready__.remote(), timeout=CONTROLLER_END_S)
            except ray.exceptions.RayError:  # dead (or hung past the deadline): it starts nothing more
                break
            time.sleep(0.05)
    remove_placement_groups_of({started.controller._actor_id.hex() for started in runs})


@dataclasses.dataclass(frozen=True)
class SlotLaunch:
    """One slot, before it starts: its shape (and that shape's config), its name, its worker group restarts."""

    shape_cfg: TrainConfig
    shape: str
    slot: str
    restarts: int


class StartedSlots:
    """The Dispatcher and the slots of a run, watched by a thread here: a slot whose run ends with an error (its Ray
    Train run gave up, or its controller was lost) is reported to the Dispatcher as failed; with a limit, at most
    that many slots run at once, the next started as one ends, so `--max-concurrent N` means N trials at once across
    shapes."""

    def __init__(
        self, dispatcher, launch: Callable[[SlotLaunch], StartedRun], launches: list[SlotLaunch], limit: int | None
    ):
        self.dispatcher, self.launch = dispatcher, launch
        self.waiting = list(launches)
        self.slot_of: dict[Any, tuple[StartedRun, SlotLaunch]] = {}  # the reference of a run's end -> its slot
        self.ended: set = set()  # the runs whose end was told and whose leftovers went (end_slot_runs)
        for _ in range(min(limit or len(launches), len(launches))):
            self._start_next()
        self.stopped = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="cifar-ray-slots", daemon=True)
        self.watcher.start()

    @property
    def runs(self) -> list:
        """The references that resolve as the slots' runs end, in the order the slots started."""
        return list(self.slot_of)

    def _start_next(self):
        slot = self.waiting.pop(0)
        started = self.launch(slot)
        self.slot_of[started.ended] = (started, slot)
        return started.ended

    def _start_next_wanted(self) -> list:
        """The next waiting slot that the Dispatcher says would get a trial, started (as a list of its run's end);
        those before it that would not are dropped, not started only to end."""
        import ray

        while self.waiting:
            try:
                wanted = ray.get(self.dispatcher.wanted.remote(self.waiting[0].shape, self.waiting[0].slot))
            except ray.exceptions.RayError:  # a stopped run's Dispatcher is gone: no slot of it starts
                self.waiting.clear()
                return []
            if wanted:
                return [self._start_next()]
            self.waiting.pop(0)
        return []

    def _watch(self) -> None:
        import ray

        running = self.runs
        while running and not self.stopped.is_set():
            ended, running = ray.wait(running, num_returns=1, timeout=1.0)
            for run in ended:
                started, slot = self.slot_of[run]
                report_slot_failure(self.dispatcher, started, slot)  # first: a failed slot's trial waits again
                if not self.stopped.is_set():  # then the next slot, which waits for no leftovers' end
                    running += self._start_next_wanted()
                end_slot_runs([started])
                self.ended.add(run)

    def wait(self) -> None:
        """Until every slot has ended (each ends when its shape has no trial left) and its failure is told."""
        self.watcher.join()

    def stop(self) -> None:
        """Ends the slots (their worker groups go with their controllers) and the Dispatcher; a no-op once they
        ended."""
        import ray

        self.stopped.set()
        self.watcher.join(timeout=5)
        end_slot_runs([started for run, (started, _) in self.slot_of.items() if run not in self.ended])
        ray.kill(self.dispatcher)


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    """The slots of a run, worked out before any starts: orchestrate.run_plan sizes Tune by `count` and
    starts them last, so that nothing that fails on the way to Tuner.fit leaves slots training."""

    run_name: str
    run_dir: StoragePath
    specs: list[RunTrial]  # the trials to train
    slots: dict[str, list[str]]  # shape -> the names of its slots
    launches: list[SlotLaunch]  # in the order they start
    limit: int | None  # slots running at once at most
    one_trial: bool  # each slot trains one trial, then ends (--isolate)

    @property
    def count(self) -> int:
        """Slots running at once at most."""
        return min(len(self.launches), self.limit or len(self.launches))

    def start_dispatcher(self):
        """The run's Dispatcher: named per run, on this driver's node (it writes the run's trial.json files, which
        must outlive any other node)."""
        import ray

        return (
            ray.remote(num_cpus=0)(Dispatcher)
            .options(name=dispatcher_name(self.run_name), scheduling_strategy=driver_node())
            .remote(self.specs, self.slots, self.one_trial)
        )

    def start(self) -> StartedSlots:
        """The Dispatcher and the slots."""
        import ray

        dispatcher = self.start_dispatcher()
        storage = self.run_dir / ".slots"

        def launch(slot: SlotLaunch) -> StartedRun:
            return start_slot(slot, dispatcher, storage, self.one_trial)

        try:
            return StartedSlots(dispatcher, launch, self.launches, self.limit)
        except BaseException:
            ray.kill(dispatcher)  # slots already launched end at their next question to it
            raise


def driver_node():
    """A scheduling strategy: on this driver's node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def plan_slots(
    plan: SweepPlan,
    run: RunFolder,
    capacity: dict[str, Any],
    max_concurrent: int | None,
    one_trial: bool,
    profile: bool = False,
) -> SlotPlan:
    """The slots of every shape of the plan's trials still to train (a failed or interrupted one continues from
    its checkpoint). Warm: as many per shape as copies of it fit the cluster (with max_concurrent, at most that
    many in all at once). one_trial: a slot per trial, as many at once as copies of each shape fit (or
    max_concurrent), each shape's first ones first. `profile`: --profile, for every trial it trains. `run`: the
    run folder's owner, whose records say what is trained."""
    untrained = [RunTrial.of(t, run.path, profile) for t in plan.trials if _to_train(run, t.name)]
    by_shape: dict[str, list[RunTrial]] = collections.defaultdict(list)
    for spec in untrained:
        by_shape[spec.shape].append(spec)
    slots, placed = {}, []  # placed: ((beyond the copies of its shape that fit, place in its shape), launch)
    for shape, specs in by_shape.items():
        fit = max(1, trials_that_fit(specs[0].config, capacity["per_node"], slots=False))
        if one_trial:
            shape_launches = [SlotLaunch(s.config, shape, new_slot_name(), s.config.max_failures + 1) for s in specs]
        else:
            restarts = sum(s.config.max_failures + 1 for s in specs)  # every attempt of every trial may restart it
            shape_launches = [SlotLaunch(specs[0].config, shape, new_slot_name(), restarts) for _ in specs[:fit]]
        placed += [((i >= fit, i), launch) for i, launch in enumerate(shape_launches)]
        slots[shape] = [launch.slot for launch in shape_launches]
    placed.sort(key=lambda item: item[0])
    first_wave = sum(not beyond for (beyond, _), _ in placed)
    limit = max_concurrent or (first_wave if one_trial else None)
    return SlotPlan(plan.name, run.path, untrained, slots, [launch for _, launch in placed], limit, one_trial)


def _to_train(run: RunFolder, name: str) -> bool:
    """Not trained to its end, or marked finished with an epoch's line lost (runlog.incomplete)."""
    record = run.trial(name)
    status, planned = record.status, (record.config or {}).get("epochs")
    if status not in runlog.TRAINED_STATUSES:
        return True
    return runlog.incomplete(status, len(runlog.read_epochs(run.path / name)), planned)


def new_slot_name() -> str:
    return f"slot-{uuid.uuid4().hex[:8]}"
