"""Worker slots on real Ray (warm by default; `--isolate` gives each trial a one-trial slot): trials one after
another in one worker group give the metrics of fresh runs; a diverged trial does not end its slot; a worker
killed during a slot's second trial continues that trial from its own checkpoint; --resume trains a failed trial
again; a slot whose run fails or whose controller dies is reported to the Dispatcher; a slot whose Dispatcher is
gone ends; no slot outlives a sweep that fails before Tuner.fit."""

from __future__ import annotations

import json
import threading
import time

import psutil
import pytest
from helpers import COMPUTED, PROGRESS_S, logged_and_checkpointed, reserved_placement_groups, wait_for

from cifar_ray.cli import main
from cifar_ray.cluster.dispatcher import dispatcher_name
from cifar_ray.cluster.slots import SlotLaunch, StartedSlots
from cifar_ray.core import runlog
from cifar_ray.core.checkpoints import CHECKPOINTS
from cifar_ray.core.config import TrainConfig

pytestmark = pytest.mark.usefixtures("ray_cluster")

TINY = (
    "dataset=synthetic",
    "train_subset=512",
    "test_subset=128",
    "train_eval_size=128",
    "width=4",
    "depth=2",
    "epochs=2",
    "batch_size=32",
    "norm=none",
    "dropout=0.2",
)


def command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # ended meanwhile
        return ""


def computed(trial_dir) -> list[dict]:
    return [{key: row.get(key) for key in COMPUTED} for row in runlog.read_epochs(trial_dir)]


@pytest.mark.slow
def test_one_slot_runs_trial_after_trial_with_the_numbers_of_fresh_runs(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text("name: slots\ngrid:\n  lr: [0.05, 1.0e+12, 0.02]\n")  # the middle one diverges
    code = main(
        [
            "sweep",
            str(tmp_path / "s.yaml"),
            "--max-concurrent",
            "1",
            "--storage",
            str(tmp_path / "runs"),
            "--json",
            "--set",
            *TINY,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    run = runlog.load_run(tmp_path / "runs" / "slots")
    assert run.sweep["warm"] is True
    assert [t.status for t in run.trials] == ["finished", "diverged", "finished"]
    assert len({t.meta["slot"] for t in run.trials}) == 1  # one worker group ran all three
    # Tune's processes are reused too: a thin trial runs in the process of one that ended (reuse_actors).
    thin = {json.loads((run.path / t.name / "result.json").read_text().splitlines()[-1])["pid"] for t in run.trials}
    assert len(thin) < len(run.trials)
    assert [line for line in err.splitlines() if " starts " in line] and " epoch 2/2 " in err

    # The third trial, after a healthy and a diverged one in the same processes, equals it trained alone.
    code = main(
        ["train", "--isolate", "--storage", str(tmp_path / "runs"), "--name", "fresh", "--set", *TINY, "lr=0.02"]
    )
    assert code == 0, capsys.readouterr().err
    fresh = runlog.load_run(tmp_path / "runs" / "fresh").trials[0]
    warm = run.trials[2]
    assert computed(tmp_path / "runs" / "slots" / warm.name) == computed(tmp_path / "runs" / "fresh" / fresh.name)
    # --isolate runs the same slot code: a slot of its own, the slots' checkpoint layout, no Ray Train run folder.
    assert runlog.read_json(tmp_path / "runs" / "fresh" / "sweep.json")["warm"] is False
    assert fresh.meta["slot"] not in {t.meta["slot"] for t in run.trials}
    fresh_dir = tmp_path / "runs" / "fresh" / fresh.name
    assert sorted(p.name for p in (fresh_dir / CHECKPOINTS).iterdir()) == ["epoch-0001", "epoch-0002"]
    assert not (fresh_dir / "train").exists()


@pytest.mark.slow
def test_a_worker_killed_in_a_slots_second_trial_continues_it_from_its_checkpoint(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(
        "name: slot-kill\n"
        "base: {dataset: synthetic, train_subset: 4096, test_subset: 256, width: 8, epochs: 4, workers: 2, "
        "batch_size: 64}\n"
        "grid:\n  seed: [0, 1]\n"
    )
    run_dir = tmp_path / "runs" / "slot-kill"
    killed, swept = [], threading.Event()

    def kill_a_worker_in_epoch_two_of_the_second_trial():
        """Waits for the second trial's first epoch and its checkpoint (helpers.logged_and_checkpointed), or for the
        sweep's end (asserted below): not for a number of seconds, which ran out once while the first trial still
        trained (20 min beside other sweeps)."""
        second = run_dir / "t001-seed=1"
        while not logged_and_checkpointed(second):
            if swept.wait(0.2):
                return
        first_epoch = runlog.read_epochs(second)[0]
        # Only a worker of this test session's Ray (the descendants of this process): the host may run other Rays,
        # whose workers the whole process table would offer.
        workers = [p for p in psutil.Process().children(recursive=True) if "RayTrainWorker" in command_line(p)]
        workers[-1].kill()  # SIGKILL: no cleanup, like a crash or the OOM killer
        killed.append(first_epoch)

    killer = threading.Thread(target=kill_a_worker_in_epoch_two_of_the_second_trial, daemon=True)
    killer.start()
    try:
        code = main(["sweep", str(tmp_path / "s.yaml"), "--storage", str(tmp_path / "runs"), "--json"])
    finally:
        swept.set()
    killer.join(timeout=60)  # ends a hang: the killer's last step follows the sweep's epoch 1 of the second trial
    out, err = capsys.readouterr()
    assert killed, "no worker of this session's Ray was killed"
    assert code == 0, err
    results = json.loads(out.strip().splitlines()[-1])
    assert [r["status"] for r in results] == ["finished", "finished"]
    run = runlog.load_run(run_dir)
    for trial in run.trials:
        assert [row["epoch"] for row in trial.epochs] == [1, 2, 3, 4], trial.name  # each epoch once, in order
    assert run.trials[1].epochs[0] == killed[0]  # continued from its checkpoint, not trained again from scratch
    assert run.trials[0].meta["slot"] == run.trials[1].meta["slot"]


@pytest.mark.slow
def test_resume_trains_a_failed_trial_again_from_its_checkpoint_as_isolate_does(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text("name: retry\ngrid:\n  seed: [0, 1]\n")
    run_dir = tmp_path / "runs" / "retry"
    sweep = ["sweep", str(tmp_path / "s.yaml"), "--max-concurrent", "1", "--storage", str(tmp_path / "runs")]
    sweep += ["--json", "--set", *TINY, "max_failures=0"]
    # A file where the second trial's epoch-2 checkpoint folder goes: storing that checkpoint fails (as on a full
    # disk), so the trial fails after its epoch-1 checkpoint; gone on resume. Made once the sweep has started: a
    # folder holding a trial's checkpoints and no sweep.json is refused as a run folder.
    blocker = run_dir / "t001-seed=1" / CHECKPOINTS / "epoch-0002"

    def block() -> None:
        wait_for(lambda: (run_dir / runlog.SWEEP_FILE).exists(), PROGRESS_S, "the sweep's start")
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("")

    blocking = threading.Thread(target=block)
    blocking.start()
    code = main(sweep)
    blocking.join()
    assert code == 1, capsys.readouterr().err
    run = runlog.load_run(run_dir)
    assert [t.status for t in run.trials] == ["finished", "failed"]
    assert "epoch-0002" in run.trials[1].meta["error"]
    finished_log = (run_dir / run.trials[0].name / runlog.EPOCHS_FILE).read_text()
    first_epoch = run.trials[1].epochs[0]

    blocker.unlink()
    # Tune's saved experiment unreadable (a store failing those reads): the resume goes by the run folder alone.
    tune_state = [p for p in run_dir.iterdir() if p.is_file() and p.name != runlog.SWEEP_FILE]
    assert any(p.name.startswith("experiment_state") for p in tune_state), tune_state
    for path in tune_state:
        path.unlink()
    code = main([*sweep, "--resume"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [r["status"] for r in json.loads(out.strip().splitlines()[-1])] == ["finished", "finished"]
    run = runlog.load_run(run_dir)
    assert (run_dir / run.trials[0].name / runlog.EPOCHS_FILE).read_text() == finished_log  # not trained again
    assert [row["epoch"] for row in run.trials[1].epochs] == [1, 2]  # epoch 2 redone, each epoch logged once
    assert run.trials[1].epochs[0] == first_epoch  # continued from its checkpoint, not trained from scratch

    sweep_record = (run_dir / runlog.SWEEP_FILE).read_bytes()
    assert main([*sweep, "--resume"]) == 0
    assert "every trial has trained to its end; nothing to resume" in "".join(capsys.readouterr())
    assert (run_dir / runlog.SWEEP_FILE).read_bytes() == sweep_record  # a no-op: no session added


class TunerNotBuilt(RuntimeError):
    pass


@pytest.fixture
def cap_packing_without_a_tuner(monkeypatch):
    """A cluster without cifar_ray_cpu resources (cap packing), and a Tuner that fails to build: a sweep prints
    its first lines, then raises before Tuner.fit. (Cap packing once bounded --isolate's Tune trials, with a
    "packing:" line; they are slots now, packed by the real CPU and GPU resources like warm ones.)"""
    from ray import tune

    from cifar_ray.cluster import orchestrate, placement

    def tuner(*args, **kwargs):
        raise TunerNotBuilt("no Tuner")

    monkeypatch.setattr(orchestrate, "cluster_capacity", lambda: placement.cluster_capacity() | {"packing": "cap"})
    monkeypatch.setattr(tune, "Tuner", tuner)


@pytest.mark.usefixtures("cap_packing_without_a_tuner")
def test_no_slot_outlives_a_sweep_whose_tuner_fails_to_build(tmp_path):
    import ray

    (tmp_path / "s.yaml").write_text("name: no-tuner\ngrid:\n  seed: [0, 1]\n")
    with pytest.raises(TunerNotBuilt):
        main(["sweep", str(tmp_path / "s.yaml"), "--storage", str(tmp_path / "runs"), "--set", *TINY])

    def dispatcher_gone() -> bool:
        try:
            ray.get_actor(dispatcher_name("no-tuner"))
        except ValueError:
            return True
        return False

    wait_for(dispatcher_gone, 60, "the run's Dispatcher (and with it its slots) to end")
    run = runlog.load_run(tmp_path / "runs" / "no-tuner")
    assert [t.status for t in run.trials] == ["pending", "pending"]


def test_a_slot_whose_run_fails_or_whose_controller_dies_is_reported_to_the_dispatcher_as_failed():
    """A slot's Ray Train controller lost (here its process exits, as when it is killed) cannot tell the Dispatcher
    anything, nor can a run that gave up: StartedSlots, watching the runs' ends, does, and the next slot starts in
    its place, unless the Dispatcher says no trial waits for it. A run that ends well is not reported."""
    import os
    import types

    import ray

    from cifar_ray.cluster.trainer import StartedRun

    told = []

    class FakeDispatcher:
        class slot_failed:  # called as dispatcher.slot_failed.remote(...), like an actor method
            @staticmethod
            def remote(*args):
                told.append(args)
                return ray.put(None)

        class wanted:  # the spare slot's shape has no trial left when its turn comes
            @staticmethod
            def remote(shape, slot):
                return ray.put(slot != "slot-spare")

    @ray.remote(num_cpus=0, max_restarts=0)
    class Controller:  # as Ray Train's: run, then get_result
        def __init__(self, ending: str):
            self.ending = ending

        def run(self) -> None:
            if self.ending == "dies":
                os._exit(1)

        def get_result(self):
            return types.SimpleNamespace(error=ValueError("the run gave up") if self.ending == "fails" else None)

    def launch(slot: SlotLaunch) -> StartedRun:
        controller = Controller.remote(slot.slot.split("-")[1])
        return StartedRun(controller, controller.run.remote())

    names = ("slot-dies", "slot-ends", "slot-spare", "slot-fails")
    launches = [SlotLaunch(TrainConfig(), "shape", name, 0) for name in names]
    started = StartedSlots(FakeDispatcher(), launch, launches, limit=1)
    started.wait()
    # Each slot started when the one before ended, but the spare: it would only have started to end.
    assert [slot.slot for _, slot in started.slot_of.values()] == ["slot-dies", "slot-ends", "slot-fails"]
    assert [(slot, shape, status) for slot, shape, status, _ in told] == [
        ("slot-dies", "shape", "failed"),
        ("slot-fails", "shape", "failed"),
    ]
    assert "ActorDiedError" in told[0][3] or "died" in told[0][3], told
    assert told[1][3] == "ValueError: the run gave up"


@pytest.mark.slow
def test_a_slot_stopped_in_the_middle_of_a_trial_leaves_no_placement_group_reserved(tmp_path):
    """A stopped sweep kills its slots' Ray Train controllers: the placement group of a killed controller's worker
    group would then stay reserved (its cores unusable by the next sweep of a notebook)
    until the job ends. Ray Train's cleaner process is not started (trainer.LeanTrainer): StartedSlots.stop removes
    the group, after the controller."""
    from cifar_ray.cluster.placement import cluster_capacity, resolve_plan
    from cifar_ray.cluster.slots import plan_slots
    from cifar_ray.core.config import parse_overrides
    from cifar_ray.core.run import RunFolder
    from cifar_ray.core.sweep import build_plan

    before = reserved_placement_groups()
    base = parse_overrides(TINY) | {"epochs": 50, "train_subset": 2048}  # typed, as --set reads them
    plan = resolve_plan(build_plan({"name": "stopped", "base": base, "grid": {"seed": [0]}}), cluster_capacity(), print)
    run = RunFolder(tmp_path / "stopped")
    run.create(plan, {})
    started = plan_slots(plan, run, cluster_capacity(), None, one_trial=False).start()
    try:
        wait_for(lambda: runlog.read_epochs(run.path / plan.trials[0].name), PROGRESS_S, "the trial's first epoch")
        assert reserved_placement_groups() - before, "the slot's worker group holds a placement group while it trains"
    finally:
        started.stop()
    wait_for(lambda: not reserved_placement_groups() - before, 60, "the stopped slot's placement group to be removed")


def test_a_slot_ended_while_its_worker_group_waits_for_cores_leaves_no_placement_group(tmp_path):
    """A sweep may end a slot whose controller has asked for its worker group's placement group but has no workers
    yet (a sweep stopped or ended just after its slots started; here every core is taken, so the group waits, and
    the sweep's progress can say so: cores_awaited). Ray scopes the group to the job, not to the killed controller:
    left, it takes a core once one frees and keeps it until the driver exits, and the next run's worker group waits
    for that core forever (a CI run hung so)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from cifar_ray.cluster.placement import cores_awaited, placement_groups_of
    from cifar_ray.cluster.slots import end_slot_runs
    from cifar_ray.cluster.trainer import TrainRun, torch_trainer
    from cifar_ray.core.config import parse_config
    from cifar_ray.core.storage import StoragePath

    every_core = placement_group([{"CPU": ray.cluster_resources()["CPU"]}])
    ray.get(every_core.ready(), timeout=60)
    try:
        run = TrainRun("waits", StoragePath.of(tmp_path))
        started = torch_trainer(lambda config: None, {}, parse_config({"dataset": "synthetic"}), run).start()
        controller = {started.controller._actor_id.hex()}
        wait_for(lambda: placement_groups_of(controller), 60, "the controller to ask for its worker group's cores")
        cores = ray.cluster_resources()["CPU"]
        assert f"ask for 1 CPU, and 0 of {cores:g} CPU are free" in cores_awaited()
        end_slot_runs([started])
        assert placement_groups_of(controller) == [] and cores_awaited() is None
    finally:
        remove_placement_group(every_core)


def test_a_slot_whose_dispatcher_is_gone_ends_instead_of_restarting():
    """A slot cannot work without its Dispatcher: once the Dispatcher is gone (its run stopped), the slot's
    question for its next trial ends the slot, where raising would restart its worker group to ask again."""
    import ray

    from cifar_ray.cluster.slots import next_trial

    @ray.remote(num_cpus=0)
    class Dispatcher:
        def take(self, shape: str, slot: str) -> str:
            return f"a trial of {shape} for {slot}"

    dispatcher = Dispatcher.remote()
    assert next_trial(dispatcher, "shape", "slot-a") == "a trial of shape for slot-a"
    ray.kill(dispatcher)  # asynchronous: a question already on its way may still be answered
    deadline, answer = time.monotonic() + 60, "not asked"
    while answer is not None and time.monotonic() < deadline:
        answer = next_trial(dispatcher, "shape", "slot-a")  # once the actor is dead: None, never an exception
    assert answer is None
