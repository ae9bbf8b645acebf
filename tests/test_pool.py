"""A warm pool (`with cifar_ray.pool():`, cluster/pool.py): a second sweep of the same shape and code trains in the
first one's slots, each sweep writing its own run folder; a shape or code change gets fresh slots; nothing outlives
the pool. The broker's hand-off between sweeps, on a stand-in Dispatcher (no Ray)."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from cifar_ray import api
from cifar_ray.cluster import dispatcher, pool
from cifar_ray.core import runlog

TINY = {
    "dataset": "synthetic",
    "train_subset": 256,
    "test_subset": 64,
    "train_eval_size": 64,
    "width": 8,
    "depth": 2,
    "epochs": 1,
    "batch_size": 32,
    "norm": "none",
}


def test_source_hash_changes_with_a_file_and_only_then(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not code")
    before = pool.source_hash(tmp_path)
    assert pool.source_hash(tmp_path) == before
    (tmp_path / "notes.txt").write_text("still not code")
    assert pool.source_hash(tmp_path) == before
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert pool.source_hash(tmp_path) != before


class Remote:
    """A stand-in actor method: `.remote(...)` gives an awaitable, as a Ray actor handle's does in an async actor."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)

        return call()


class FakeDispatcher:
    def __init__(self, trials: list[str]):
        self.pending, self.begun, self.deaths = list(trials), None, []
        self.begin = Remote(lambda specs, slots: setattr(self, "begun", (specs, slots)))
        self.take = Remote(lambda shape, slot: self.pending.pop(0) if self.pending else None)
        self.worker_died = Remote(lambda slot, status, error: self.deaths.append((slot, status)))


def test_broker_hands_a_slot_each_sweep_in_turn_and_says_which_slots_are_busy():
    async def scenario():
        broker = pool.SlotBroker()
        first, second = FakeDispatcher(["a1", "a2"]), FakeDispatcher(["b1"])

        async def take():
            return await asyncio.wait_for(broker.take("shape", "slot-1", 123), 60)  # ends a hang, not a speed

        waiting = asyncio.ensure_future(take())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # no sweep yet: the slot waits
        await broker.attach("run-a", first, ["specs"], {"shape": ["slot-1"]})
        assert first.begun == (["specs"], {"shape": ["slot-1"]})
        assert await broker.dispatcher_of("run-a") is first
        assert await waiting == (first, "a1")
        await broker.worker_died("slot-1", "failed", "killed")  # told to the sweep whose trial it trains
        assert first.deaths == [("slot-1", "failed")]
        assert await take() == (first, "a2")
        waiting = asyncio.ensure_future(take())  # the first sweep has no trial left: the slot waits for the next
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert await broker.detach(0.0) == []  # no slot trains a trial of it
        await broker.attach("run-b", second, [], {})
        assert await waiting == (second, "b1")
        assert await broker.detach(0.0) == ["slot-1"]  # interrupted: slot-1 still trains b1
        await broker.worker_died("slot-1", "failed", "killed")  # no sweep attached: nobody to tell
        assert second.deaths == []
        waiting = asyncio.ensure_future(take())
        await asyncio.sleep(0.05)
        await broker.retire(["slot-1"])
        assert await waiting is None  # a retired slot ends
        assert (await broker.slot_pids()) == {"slot-1": 123}

    asyncio.run(scenario())


def test_the_pools_dispatcher_serves_the_next_sweep_unless_a_slot_was_cut_off_in_a_trial(monkeypatch):
    """A sweep every slot came back from leaves the pool's Dispatcher to the next sweep (no process to start); one
    that ended with a slot still in a trial (its controller killed) gets it replaced: a message of that slot may
    still be on its way, naming a trial the next sweep may have too. On stand-ins for Ray's calls."""
    import threading

    import ray

    from cifar_ray.cluster import slots
    from cifar_ray.cluster.trainer import StartedRun

    busy: list[str] = []
    killed, started = [], []

    class Broker:
        detach = type("detach", (), {"remote": staticmethod(lambda wait_s: list(busy))})

    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart=True: killed.append(actor))
    ended_runs: list[list] = []
    monkeypatch.setattr(slots, "end_slot_runs", ended_runs.append)
    monkeypatch.setattr(pool.WarmPool, "_new_dispatcher", staticmethod(lambda: started.append(1) or len(started)))
    warm = object.__new__(pool.WarmPool)
    warm.broker, warm.lock, warm.running, warm.dispatcher = Broker(), threading.Lock(), None, "first"
    run = StartedRun("controller-a", "ended-a")
    warm.slots = {"slot-a": pool.PoolSlot(slots.SlotLaunch(None, "shape", "slot-a", 1), ("shape", "code"), run)}
    warm._end_sweep("first", finished=True)
    assert warm.dispatcher == "first" and not killed and not started and ended_runs == [[]]
    busy.append("slot-a")
    warm._end_sweep("first", finished=False)
    assert ended_runs[-1] == [run]  # its controller killed, its placement groups removed
    assert killed == ["first"] and warm.dispatcher == 1 and "slot-a" not in warm.slots


def _sweep(name: str, storage, **overrides):
    plan = {"name": name, "base": TINY | overrides, "grid": {"seed": [0]}}
    run = api.sweep(plan, name=name, storage=storage, print_line=lambda line: None)
    trials = runlog.load_run(run.path).trials
    assert [t.status for t in trials] == ["finished"], [t.meta.get("error") for t in trials]
    assert len(runlog.read_epochs(run.path / trials[0].name)) == 1
    return trials[0].meta["slot"]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_pool_reuses_slots_of_the_same_shape_and_code_only_and_ends_them_all(tmp_path, monkeypatch):
    import ray

    storage = tmp_path / "runs"
    with api.pool():
        first = _sweep("p1", storage)
        serving = pool.active().dispatcher
        assert _sweep("p2", storage) == first  # same shape, same code: the warm slot trains it
        other_shape = _sweep("p3", storage, cpus_per_worker=2)
        assert other_shape != first
        monkeypatch.setattr(pool, "source_hash", lambda: "edited")
        assert _sweep("p4", storage, cpus_per_worker=2) != other_shape  # the code changed: a fresh slot
        pids = pool.active().slot_pids()
        name = dispatcher.broker_name()
        assert pool.active().dispatcher is serving  # every sweep finished: one Dispatcher served all four
    assert set(pids) >= {first, other_shape}
    assert pool.active() is None
    with pytest.raises(ValueError):
        ray.get_actor(name)
    deadline = time.monotonic() + 60  # ends a hang, not a speed
    while (alive := [pid for pid in pids.values() if psutil.pid_exists(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, f"slot processes left running after the pool closed: {alive}"
