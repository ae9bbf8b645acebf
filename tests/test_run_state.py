"""What the driver writes into a run folder, without Ray: every session's wall time, the trials a stopped sweep
leaves interrupted, and the --resume refusal of changed configs."""

from __future__ import annotations

import time

import pytest

from cifar_ray.core import runlog
from cifar_ray.core.config import TrainConfig
from cifar_ray.core.run import RunFolder
from cifar_ray.core.storage import StoragePath
from cifar_ray.core.sweep import SweepPlan, TrialSpec


def test_every_sessions_wall_time_is_kept_and_summed_an_interrupted_one_too(tmp_path):
    run_dir = StoragePath.of(tmp_path)
    sweep_file = run_dir / runlog.SWEEP_FILE
    runlog.write_json(sweep_file, {"name": "s", "wall_time_s": 100.0})  # a run from before sessions were kept
    now = time.time()
    RunFolder(run_dir).open_session(now - 30)
    RunFolder(run_dir).close_session(done=False, ended=now)  # interrupted: no finished_at
    assert "finished_at" not in runlog.read_json(sweep_file)
    RunFolder(run_dir).open_session(now + 20)
    RunFolder(run_dir).close_session(done=True, ended=now + 30)
    sweep = runlog.read_json(sweep_file)
    walls = [s["wall_s"] for s in sweep["sessions"]]
    assert walls == [100.0, 30.0, 10.0] and sweep["wall_time_s"] == pytest.approx(140.0)
    assert sweep["finished_at"] == runlog.now_iso(now + 30)  # the session's end, read once


def test_a_sessions_end_is_read_from_the_clock_once(tmp_path, monkeypatch):
    """Its end_unix and wall_s and the run's finished_at were two clock reads apart (finished_at could name the
    next second on a loaded machine)."""
    run_dir = StoragePath.of(tmp_path)
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"name": "s"})
    RunFolder(run_dir).open_session(1000.0)
    monkeypatch.setattr(time, "time", lambda: 1030.0)  # what the session's end reads; now_iso() reads the real clock
    RunFolder(run_dir).close_session(done=True)
    monkeypatch.undo()
    sweep = runlog.read_json(run_dir / runlog.SWEEP_FILE)
    assert (sweep["sessions"][-1]["end_unix"], sweep["sessions"][-1]["wall_s"]) == (1030.0, 30.0)
    assert sweep["finished_at"] == runlog.now_iso(1030.0)


def test_a_killed_drivers_session_ends_at_its_last_logged_epoch(tmp_path):
    """SIGKILL runs no `finally`: the session it leaves open is closed by the next one, ended at the last thing its
    trials logged, and counted in wall_time_s."""
    run_dir = StoragePath.of(tmp_path)
    sweep_file = run_dir / runlog.SWEEP_FILE
    runlog.write_json(sweep_file, {"name": "s", "trials": ["t000"]})
    killed_at = time.time() - 100
    RunFolder(run_dir).open_session(killed_at - 60)  # killed 60 s in, after logging two epochs
    runlog.write_json(run_dir / "t000" / runlog.TRIAL_FILE, {"status": "running", "started_unix": killed_at - 50})
    for epoch, end in ((1, killed_at - 30), (2, killed_at)):
        runlog.append_epoch(run_dir / "t000", {"epoch": epoch, "end_unix": end})
    RunFolder(run_dir).open_session(time.time())
    first, second = runlog.read_json(sweep_file)["sessions"]
    assert first["wall_s"] == pytest.approx(60) and first["end"].startswith("killed") and "end_unix" not in second
    assert runlog.read_json(sweep_file)["wall_time_s"] == pytest.approx(60)


def plan_of(tmp_path, **config) -> tuple[SweepPlan, StoragePath]:
    trials = [TrialSpec(i, f"t{i:03d}", {"seed": i}, TrainConfig(seed=i, **config)) for i in range(2)]
    plan = SweepPlan("s", "", {}, {"seed": [0, 1]}, 1, "test_acc", "max", trials)
    return plan, StoragePath.of(tmp_path)


def test_trials_left_running_by_a_stopped_sweep_are_marked_interrupted(tmp_path):
    plan, run_dir = plan_of(tmp_path)
    for trial, status in zip(plan.trials, ("running", "finished")):
        runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": status})
    RunFolder(run_dir).mark_interrupted([t.name for t in plan.trials])
    statuses = [runlog.read_json(run_dir / t.name / runlog.TRIAL_FILE)["status"] for t in plan.trials]
    assert statuses == ["interrupted", "finished"]


def test_a_resume_compares_the_resolved_configs_with_the_recorded_ones(tmp_path):
    recorded, run_dir = plan_of(tmp_path, use_gpu="false")  # what use_gpu=auto resolved to when the run started
    for trial in recorded.trials:
        runlog.write_json(run_dir / trial.name / runlog.TRIAL_FILE, trial.as_dict() | {"status": "running"})
    assert RunFolder(run_dir).changed_configs_refusal(recorded) is None
    changed, _ = plan_of(tmp_path, use_gpu="true", width=64)
    refusal = RunFolder(run_dir).changed_configs_refusal(changed)
    assert "t000 (width 32 -> 64, use_gpu 'false' -> 'true'); t001 (" in refusal, refusal
