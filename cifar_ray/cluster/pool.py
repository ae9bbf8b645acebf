"""A warm pool: slots that outlive a sweep, for the sweeps of one Python session (`with cifar_ray.pool(): ...`) and
for the rounds of a sweep that settles its question (settling.rounds_pool).

A slot (cluster/slots.py) costs seconds to start: a Ray Train controller, a worker group, a process group, imports
and the dataset. Outside a pool each sweep starts its own and ends them. In a pool, a slot of a single-shape sweep
does not end when its sweep has no trial left: it waits in the pool's SlotBroker (an actor on the driver's node)
for the next sweep, and takes that sweep's trials from that sweep's Dispatcher, the one writer of that run's
trial.json files, so every run folder keeps its guarantees (resume, failures, Ctrl-C marking running trials
interrupted). A slot is reused only by a sweep of the same trial shape and the same code (source_hash of the
package's files, read again at each sweep); any other slot is retired (ended, its resources freed) before the
sweep's own slots start. A sweep with several shapes, --isolate or a concurrency limit runs its own slots as outside
a pool, after the pool's slots are retired (they would hold the cores its slots wait for). A sweep that does not
finish (Ctrl-C, an error) ends the slots that were training its trials; the idle ones stay. The pool ends every slot
when it closes (the context's exit, or at the interpreter's exit); Ray ending ends them too. A pool's slot keeps
the worker-group restarts its first sweep gave it (every attempt of that sweep's trials): a slot that uses them up
fails as outside a pool (its trial goes to another slot or fails), and the next sweep starts a fresh one.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import slots as slots_module
from .dispatcher import Dispatcher, broker_name
from .slots import SlotLaunch, SlotPlan
from .trainer import StartedRun

PACKAGE_DIR = Path(__file__).resolve().parents[1]
RETIRE_WAIT_S = 30.0  # how long a retired slot may take to end on its own (its Ray Train run's shutdown) before
# it is cancelled
FINISH_WAIT_S = 10.0  # how long a finished sweep waits for its slots to come back from their last trial's report

_active: WarmPool | None = None


def source_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 of every .py file of the package as it is on disk now (paths and contents): the code a slot that
    starts now imports. A file edited between two sweeps changes it."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(str(path.relative_to(package_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def active() -> WarmPool | None:
    """The pool of the `with cifar_ray.pool()` this session is in, if any."""
    return _active


@contextlib.contextmanager
def activate() -> Iterator[WarmPool]:
    """A pool that sweeps started inside use (start_slots), closed at the end: every slot ends."""
    global _active
    if _active is not None:
        from ..core.errors import UsageError

        raise UsageError("a warm pool is already open in this session; one pool at a time (no nested pool())")
    _active = WarmPool()
    atexit.register(_active.close)  # a notebook whose kernel exits without leaving the context
    try:
        yield _active
    finally:
        pool, _active = _active, None
        atexit.unregister(pool.close)
        pool.close()


def start_slots(slot_plan: SlotPlan):
    """The run's Dispatcher and slots: from the active pool where there is one, else the run's own."""
    return _active.start(slot_plan) if _active is not None else slot_plan.start()


class PooledDispatcher(Dispatcher):
    """The pool's Dispatcher: one process serves one sweep after another (begin() gives it each sweep), so that no
    sweep starts one (a process: seconds of a core, during the sweep before). It is replaced
    by a new one after a sweep that ended with a slot cut off in its trial: that slot may have a message on its
    way, naming a trial the next sweep may have too."""

    def __init__(self):
        super().__init__([], {})

    async def begin(self, specs: list, slots: dict[str, list[str]]) -> None:
        super().__init__(specs, slots)


class SlotBroker:
    """The pool's slots' source of trials (an async Ray actor): a slot asks it for its next trial; it asks the
    Dispatcher of the sweep now attached, and when that has none left for the slot, waits for the next sweep, or
    for the slot to be retired or the pool closed (the slot then ends)."""

    def __init__(self):
        self.dispatcher = None  # the Dispatcher of the sweep now running, if any
        self.dispatchers: dict[str, Any] = {}  # run name -> its Dispatcher, for its thin trials (find_dispatcher)
        self.generation = 0  # counts the sweeps attached: a slot asks each sweep's Dispatcher until it has none left
        self.exhausted: dict[str, int] = {}  # slot -> the generation whose Dispatcher had no trial left for it
        self.serving: dict[str, int] = {}  # slot -> the generation whose trial it trains now
        self.pids: dict[str, int] = {}  # slot -> its rank 0's process id (tests: nothing outlives the pool)
        self.retired: set[str] = set()
        self.closed = False
        self.changed: asyncio.Condition | None = None  # made in the actor's event loop, on first use

    def _condition(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed

    async def _notify(self) -> None:
        async with self._condition():
            self._condition().notify_all()

    async def attach(self, run_name: str, dispatcher, specs: list, slots: dict[str, list[str]]) -> None:
        """The sweep `run_name` begins in its Dispatcher (a PooledDispatcher) and the slots take its trials."""
        await dispatcher.begin.remote(specs, slots)
        self.dispatcher, self.generation = dispatcher, self.generation + 1
        self.dispatchers = {run_name: dispatcher}
        await self._notify()

    async def dispatcher_of(self, run_name: str):
        return self.dispatchers[run_name]

    async def detach(self, wait_s: float) -> list[str]:
        """No slot takes from the attached Dispatcher any more; returns the slots still training one of its
        trials after up to wait_s (a finished sweep's slots come back as their last report is done)."""
        generation, self.dispatcher = self.generation, None
        await self._notify()

        def busy() -> list[str]:
            return [slot for slot, served in self.serving.items() if served == generation]

        async with self._condition():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._condition().wait_for(lambda: not busy()), wait_s)
        return busy()

    async def retire(self, slots: list[str]) -> None:
        self.retired.update(slots)
        await self._notify()

    async def close(self) -> None:
        self.closed = True
        await self._notify()

    async def take(self, shape: str, slot: str, pid: int) -> tuple[Any, Any] | None:
        """(the Dispatcher, its next trial for the slot), waiting for a sweep that has one; None: the slot ends."""
        import ray

        self.pids[slot] = pid
        self.serving.pop(slot, None)
        await self._notify()  # a detach may wait for this slot to come back

        def stop() -> bool:
            return self.closed or slot in self.retired

        def askable() -> bool:
            return self.dispatcher is not None and self.exhausted.get(slot) != self.generation

        while True:
            async with self._condition():
                await self._condition().wait_for(lambda: stop() or askable())
            if stop():
                return None
            dispatcher, generation = self.dispatcher, self.generation
            try:
                spec = await dispatcher.take.remote(shape, slot)
            except ray.exceptions.RayActorError:  # its sweep ended and was stopped: wait for the next
                spec = None
            if spec is not None:
                self.serving[slot] = generation
                return dispatcher, spec
            self.exhausted[slot] = generation

    async def worker_died(self, slot: str, status: str, error: str) -> None:
        """A worker of the slot died: told to the Dispatcher whose trial the slot trains, if any."""
        if self.dispatcher is not None and self.serving.get(slot) == self.generation:
            await self.dispatcher.worker_died.remote(slot, status, error)

    async def slot_pids(self) -> dict[str, int]:
        return dict(self.pids)


@dataclasses.dataclass
class PoolSlot:
    launch: SlotLaunch
    key: tuple[str, str]  # (trial shape, source_hash) it was started with
    run: StartedRun


class WarmPool:
    """The driver's side of a pool: its broker, its slots' runs, and a thread that tells the Dispatcher of the
    sweep running when one of its slots ends with an error (as StartedSlots does outside a pool)."""

    def __init__(self):
        import ray

        self.job = ray.get_runtime_context().get_job_id()
        here = slots_module.driver_node()
        self.broker = ray.remote(num_cpus=0)(SlotBroker).options(name=broker_name(), scheduling_strategy=here).remote()
        self.dispatcher = self._new_dispatcher()  # the next sweep's
        self.slots: dict[str, PoolSlot] = {}
        self.running: tuple[Any, set[str]] | None = None  # (Dispatcher, its slots) of the sweep running
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="cifar-ray-pool", daemon=True)
        self.watcher.start()

    def slot_pids(self) -> dict[str, int]:
        """Every slot's rank 0 process id, as the slots told the broker (ended slots' too)."""
        import ray

        return ray.get(self.broker.slot_pids.remote())

    def start(self, slot_plan: SlotPlan):
        """The run's Dispatcher and slots: the pool's slots of its shape and code, started where there are none
        (kept for the next sweep); for a plan the pool does not serve, the run's own slots."""
        import ray

        shapes = list(slot_plan.slots)
        if slot_plan.one_trial or slot_plan.limit is not None or len(shapes) != 1:
            self._retire(list(self.slots))
            return slot_plan.start()
        key = (shapes[0], source_hash())
        self._retire([name for name, slot in self.slots.items() if slot.key != key])
        reused = list(self.slots)  # all of the shape serve: a slot the Dispatcher does not know could take a trial
        launches = slot_plan.launches[len(reused) :]
        plan = dataclasses.replace(slot_plan, slots={key[0]: reused + [launch.slot for launch in launches]})
        dispatcher = self.dispatcher
        try:
            with self.lock:
                self.running = (dispatcher, set(plan.slots[key[0]]))
            ray.get(self.broker.attach.remote(plan.run_name, dispatcher, plan.specs, plan.slots))
            storage = plan.run_dir / ".slots"
            for launch in launches:
                started = slots_module.start_slot(launch, None, storage, False, self.broker)
                with self.lock:
                    self.slots[launch.slot] = PoolSlot(launch, key, started)
        except BaseException:
            self._end_sweep(dispatcher, finished=False)
            raise
        return PooledSlots(self, dispatcher)

    @staticmethod
    def _new_dispatcher():
        """On the driver's node, as every run's Dispatcher (it writes the run's trial.json files)."""
        import ray

        return ray.remote(num_cpus=0)(PooledDispatcher).options(scheduling_strategy=slots_module.driver_node()).remote()

    def _end_sweep(self, dispatcher, finished: bool) -> None:
        """Detaches the sweep: the slots still training its trials (none once it finished) are ended, and then the
        Dispatcher is replaced (PooledDispatcher); after a sweep every slot came back from, it serves the next."""
        import ray

        busy = ray.get(self.broker.detach.remote(FINISH_WAIT_S if finished else 0.0))
        with self.lock:
            self.running = None
            ended = [self.slots.pop(name) for name in busy if name in self.slots]
        slots_module.end_slot_runs([slot.run for slot in ended])
        if busy:
            ray.kill(dispatcher)
            self.dispatcher = self._new_dispatcher()

    def _retire(self, names: list[str]) -> None:
        """The slots end (their Ray Train runs shut down and free their resources), waited for."""
        import ray

        with self.lock:
            ended = [self.slots.pop(name) for name in names if name in self.slots]
        if not ended:
            return
        ray.get(self.broker.retire.remote([slot.launch.slot for slot in ended]))
        runs = [slot.run.ended for slot in ended]
        ray.wait(runs, num_returns=len(runs), timeout=RETIRE_WAIT_S)
        slots_module.end_slot_runs([slot.run for slot in ended])

    def _watch(self) -> None:
        import ray

        while not self.closed.is_set():
            with self.lock:
                runs = {slot.run.ended: slot for slot in self.slots.values()}
            if not runs:
                self.closed.wait(0.5)
                continue
            ended, _ = ray.wait(list(runs), num_returns=1, timeout=0.5)
            for run in ended:
                slot = runs[run]
                with self.lock:
                    if self.slots.get(slot.launch.slot) is not slot:  # retired or ended by the pool itself
                        continue
                    del self.slots[slot.launch.slot]
                    running = self.running
                if running is not None and slot.launch.slot in running[1]:
                    slots_module.report_slot_failure(running[0], slot.run, slot.launch)
                slots_module.end_slot_runs([slot.run])

    def close(self) -> None:
        """Every slot ends; the broker goes. Safe to call twice, and after Ray has ended (nothing is left then)."""
        import ray

        if self.closed.is_set():
            return
        self.closed.set()
        self.watcher.join(timeout=5)
        if not ray.is_initialized() or ray.get_runtime_context().get_job_id() != self.job:
            return
        self._retire(list(self.slots))
        ray.kill(self.dispatcher)
        ray.kill(self.broker)


class PooledSlots:
    """A sweep's Dispatcher and pool slots, as orchestrate.run_plan uses StartedSlots: wait once every trial is
    final, stop in every case."""

    def __init__(self, pool: WarmPool, dispatcher):
        self.pool, self.dispatcher = pool, dispatcher
        self.finished = False

    def wait(self) -> None:
        """Every trial is final: the slots stay for the next sweep (their failures are told as they happen)."""
        self.finished = True

    def stop(self) -> None:
        self.pool._end_sweep(self.dispatcher, self.finished)
