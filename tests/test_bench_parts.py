"""The benchmark's measurements of where a sweep's time goes, on hand-made run folders and processes (no Ray): the
hand-off gap between a warm slot's trials, CPU seconds per kind of process, and how the page shows them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from cifar_ray.cluster.bench import GOALS, ProcessCpu, handoff_gaps
from cifar_ray.core import runlog
from cifar_ray.report.bench import _pool_lines, _warm_details


def write_trial(run_dir, name: str, slot: str, started: float, finished: float) -> None:
    runlog.write_json(
        run_dir / name / runlog.TRIAL_FILE, {"slot": slot, "started_unix": started, "finished_unix": finished}
    )


def test_the_handoff_gap_is_from_a_slots_previous_trial_end_to_the_next_ones_start(tmp_path):
    run_dir = tmp_path / "run"
    runlog.write_json(run_dir / runlog.SWEEP_FILE, {"trials": ["a", "b", "c", "d"]})
    write_trial(run_dir, "a", "slot-1", 100.0, 103.0)
    write_trial(run_dir, "b", "slot-2", 100.5, 104.0)
    write_trial(run_dir, "c", "slot-1", 103.25, 106.0)  # 0.25 s after a ended, in a's slot
    write_trial(run_dir, "d", "slot-2", 104.5, 107.0)  # 0.5 s after b
    runlog.write_json(run_dir / "e" / runlog.TRIAL_FILE, {"slot": "slot-1", "status": "pending"})  # never ran
    assert handoff_gaps(run_dir) == [0.25, 0.5]


def test_cpu_seconds_are_charged_to_the_kind_of_process_that_spent_them():
    busy = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    with ProcessCpu(interval_s=0.05) as cpu:
        started = time.time()
        child = subprocess.Popen([sys.executable, "-c", busy + "\ntime.sleep(0.3)"])  # sampled after its work
        child.wait()
    kind = next(k for k in cpu.seconds() if k.startswith("python"))
    assert 0.5 <= cpu.seconds()[kind] <= 1.5 and cpu.first_seen[kind] >= started
    assert cpu.seconds().get("driver", 0) < 0.5  # this process mostly waited


def test_the_page_shows_the_gap_the_cpu_per_added_trial_and_the_start_up():
    run = {"trials": 2, "slots": 2, "handoff_gaps_s": [0.1], "cpu_s": {"ray::RayTrainWorker": 4.0}}
    warm = {
        "runs": [
            run | {"startup_s": {"ray::run_slot started": 1.5, "its first epoch ended": 9.0}},
            run | {"trials": 4},
        ],
        "median_handoff_gap_s": 0.1,
        "cpu_s_per_added_trial": {"ray::RayTrainWorker": 1.25},
    }
    peer = {"trials": 2, "wall_s": 3.0, "training_s": 2.5, "overhead_s_per_trial": 0.25}
    text = "\n".join(_warm_details(json.loads(json.dumps(warm)), peer, GOALS))
    assert "median over 2: 0.10 s: met (goal ≤ 0.15)" in text
    assert "| `ray::RayTrainWorker` | 4.00 | 4.00 | 1.25 |" in text
    assert "| its first epoch ended | 9.0 |" in text and "0.25 s per trial beyond its training" in text
    assert _warm_details({"runs": [run, run]}, None, GOALS) == []  # a record from before these were measured


def test_the_page_shows_what_the_later_sweeps_of_a_pool_cost_beyond_their_training():
    pooled = [
        {"wall_s": 40.0, "training_s": 2.0, "beyond_training_s": 38.0},
        {"wall_s": 3.5, "training_s": 2.1, "beyond_training_s": 1.4},
        {"wall_s": 3.9, "training_s": 2.0, "beyond_training_s": 1.9},
    ]
    text = "\n".join(_pool_lines(pooled, GOALS))
    assert "| 1 | 40.0 | 2.0 | 38.0 |" in text
    assert "cost at most 1.9 s beyond their training: NOT met (goal ≤ 1.5)" in text  # the worst later sweep
    assert _pool_lines(None, GOALS) == []  # a record from before pools were measured
