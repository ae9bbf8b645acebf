"""`sweep FILE --estimate`: the arithmetic (core/estimate.py, pure), the step timing (the loop's own step, timed
without Ray), the plan's estimate with the sweep's concurrency, the CLI's output and refusals, and the header of a
real sweep repeating it."""

from __future__ import annotations

import math
import re
from concurrent.futures import Future

import pytest
import torch

from cifar_ray.cli import main
from cifar_ray.cluster import progress
from cifar_ray.cluster import session as ray_session
from cifar_ray.cluster.estimate import estimate_plan
from cifar_ray.cluster.placement import RESOURCE_CPU
from cifar_ray.core import estimate, runlog
from cifar_ray.core.config import TrainConfig, parse_config
from cifar_ray.core.estimate import (
    COMPUTE_RANGE,
    FIXED_RANGE,
    RAY_START_S,
    SHAPE_SWITCH_S,
    SLOT_START_S,
    WARM_TRIAL_S,
    StepTime,
    TrialEstimate,
    dealt_wall,
    estimate_line,
    step_key,
    sweep_estimate,
    trial_estimate,
)
from cifar_ray.core.run import RunOptions
from cifar_ray.core.sweep import build_plan
from cifar_ray.core.text import rough_duration
from cifar_ray.training import step_time
from cifar_ray.training.step_time import time_step

TINY = {"dataset": "synthetic", "train_subset": 256, "test_subset": 64, "train_eval_size": 32, "width": 4}
TINY_SWEEP = (
    "name: tiny\n"
    "base: {dataset: synthetic, train_subset: 256, test_subset: 64, train_eval_size: 32, width: 4, epochs: 1, "
    "batch_size: 32, norm: none}\n"
    "grid:\n  workers: [1, 2]\n  lr: [0.05, 0.1]\n"
)


def test_trials_are_dealt_in_order_to_the_slot_free_first():
    assert dealt_wall([3, 1, 1, 1], 2) == 3  # the second slot takes the three short ones while the first runs
    assert dealt_wall([1, 1, 1], 1) == 3
    assert dealt_wall([2, 2, 2], 2) == 4
    assert dealt_wall([5], 4) == 5
    assert dealt_wall([], 2) == 0


def test_a_trial_is_its_steps_its_evaluations_and_its_start():
    config = parse_config(
        TINY
        | {"train_subset": 1000, "test_subset": 301, "train_eval_size": 2000, "batch_size": 64, "workers": 2}
        | {"accum_steps": 2, "epochs": 3}
    )
    timing = StepTime(step_s=0.5, eval_image_s=0.01, first_step_extra_s=2.0)
    warm = trial_estimate("t", config, timing, isolate=False)
    steps = 1000 // 128 * 3  # whole optimizer steps of the effective batch per epoch, every epoch
    # the busiest rank's shard of the test set (151 of 301) and of the train_eval images (capped at the 1000 trained)
    evaluated = 3 * (151 + 500)
    assert warm.shape == "2 workers x 1 CPU"
    assert math.isclose(warm.train_s, steps * 0.5) and math.isclose(warm.eval_s, evaluated * 0.01)
    assert math.isclose(warm.start_s, 2.0 + WARM_TRIAL_S)
    assert math.isclose(warm.total_s, warm.train_s + warm.eval_s + warm.start_s)
    isolated = trial_estimate("t", config, timing, isolate=True)  # a fresh slot per trial
    assert math.isclose(isolated.total_s - warm.total_s, SLOT_START_S - WARM_TRIAL_S)


def trial(shape: str, total: float) -> TrialEstimate:
    return TrialEstimate("t", shape, total, 0.0, 0.0, total)


def test_the_sweep_adds_its_shapes_each_dealt_to_its_slots():
    trials = [trial("one", 10), trial("one", 10), trial("one", 10), trial("two", 7), trial("two", 5)]
    warm = sweep_estimate(trials, {"one": 2, "two": 1}, isolate=False)
    assert [(s.shape, s.trials, s.at_once) for s in warm.shapes] == [("one", 3, 2), ("two", 2, 1)]
    assert math.isclose(warm.shapes[0].wall_s, 20 + SLOT_START_S)  # slots start side by side, once
    # the second shape's slots started beside the first ones: only the switch to it is paid
    assert math.isclose(warm.shapes[1].wall_s, 12 + SHAPE_SWITCH_S) and SHAPE_SWITCH_S < SLOT_START_S
    assert math.isclose(warm.wall_s, RAY_START_S + 32 + SLOT_START_S + SHAPE_SWITCH_S)
    assert math.isclose(warm.fixed_s, RAY_START_S + SLOT_START_S + SHAPE_SWITCH_S)  # these trials have no start
    isolated = sweep_estimate(trials, {"one": 5, "two": 1}, isolate=True)  # each trial pays its own start
    assert isolated.shapes[0].at_once == 3  # never more slots than trials
    assert math.isclose(isolated.wall_s, RAY_START_S + 10 + 12)
    line = estimate_line(warm)
    low, high = warm.range_s
    assert line.startswith(f"estimated wall time ~{warm.wall_s:.0f} s (likely {low:.0f} s to {high:.0f} s, fixed ")
    assert "two: 2 trials, 1 at once" in line and "\n" not in line


def test_the_estimate_states_its_range_from_its_timed_and_fixed_parts():
    started = [TrialEstimate("t", "one", 10.0, 2.0, 3.0, 15.0), TrialEstimate("u", "one", 10.0, 2.0, 3.0, 15.0)]
    estimate = sweep_estimate(started, {"one": 1}, isolate=False)
    fixed = RAY_START_S + SLOT_START_S + 6.0  # both trials' starts in the one slot
    assert math.isclose(estimate.fixed_s, fixed) and math.isclose(estimate.wall_s, RAY_START_S + SLOT_START_S + 30)
    compute = estimate.wall_s - fixed
    low, high = estimate.range_s
    assert math.isclose(low, compute * COMPUTE_RANGE[0] + fixed * FIXED_RANGE[0])
    assert math.isclose(high, compute * COMPUTE_RANGE[1] + fixed * FIXED_RANGE[1])
    assert low < estimate.wall_s < high


def test_trials_that_differ_in_what_a_step_does_not_depend_on_are_timed_once():
    base = TrainConfig(**TINY, batch_size=32)
    assert step_key(base) == step_key(base.model_copy(update={"lr": 0.1, "seed": 3, "epochs": 7}))
    # one worker's share of the batch is what it steps with
    assert step_key(base) == step_key(parse_config(TINY | {"batch_size": 64, "workers": 2}))
    for change in ({"batch_size": 64}, {"optimizer": "adam"}, {"accum_steps": 2}, {"width": 8}, {"norm": "group"}):
        assert step_key(base) != step_key(parse_config(TINY | {"batch_size": 32} | change)), change


def test_a_step_is_timed_with_the_trials_threads_and_the_threads_are_given_back():
    before = torch.get_num_threads()
    config = parse_config(TINY | {"batch_size": 16, "accum_steps": 2, "cpus_per_worker": 1, "use_gpu": "false"})
    timing = time_step(config)
    assert timing.step_s > 0 and timing.eval_image_s > 0 and timing.first_step_extra_s >= 0
    assert torch.get_num_threads() == before


def test_a_gpu_step_is_timed_in_a_child_process_that_takes_its_cuda_context_along(monkeypatch):
    """`--estimate` on a GPU kept a CUDA context (and what the timing cached) in the driver, which then starts Ray:
    the step is timed in a spawned child process (a fake pool here records it; no GPU on this machine)."""
    events = []

    class Pool:  # a ProcessPoolExecutor that runs its one task here
        def __init__(self, workers, mp_context):
            events.append(("start", workers, mp_context.get_start_method()))

        def __enter__(self):
            return self

        def __exit__(self, *error):
            events.append("child gone")

        def submit(self, fn, cfg):
            events.append(("timed", cfg.use_gpu))
            done = Future()
            done.set_result(fn(cfg))
            return done

    measured = StepTime(step_s=0.01, eval_image_s=1e-4, first_step_extra_s=0.5)
    monkeypatch.setattr(step_time, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(step_time, "timed_step", lambda cfg: measured)
    assert step_time.time_step(parse_config(TINY | {"use_gpu": "true", "backend": "nccl"})) == measured
    assert events == [("start", 1, "spawn"), ("timed", "true"), "child gone"]
    events.clear()
    assert step_time.time_step(parse_config(TINY | {"use_gpu": "false"})) == measured and events == []  # CPU: here


def two_cpus(monkeypatch) -> None:
    """This machine as a 2-core one without GPUs, as the embedded Ray would see it."""
    monkeypatch.setattr(ray_session.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ray_session, "_local_gpu_count", lambda: 0)


def test_a_plan_runs_as_many_trials_at_once_as_the_sweep_would(monkeypatch):
    two_cpus(monkeypatch)
    document = {
        "name": "p",
        "base": TINY | {"batch_size": 32, "epochs": 1},
        "grid": {"workers": [1, 2], "seed": [0, 1]},
    }
    plan = build_plan(document)
    timed = estimate_plan(plan, max_concurrent=None, isolate=False)
    assert [(s.shape, s.trials, s.at_once) for s in timed.sweep.shapes] == [
        ("1 worker x 1 CPU", 2, 2),  # two 1-worker slots on 2 cores
        ("2 workers x 1 CPU", 2, 1),
    ]
    assert [(row["per_worker_batch"], row["trials"]) for row in timed.timings] == [(32, 2), (16, 2)]  # seeds: once
    capped = estimate_plan(plan, max_concurrent=1, isolate=False)
    assert [s.at_once for s in capped.sweep.shapes] == [1, 1]


@pytest.fixture
def no_ray(monkeypatch) -> None:
    """Starting Ray fails the test: an estimate runs without it."""

    def init_ray(**options):
        raise AssertionError(f"Ray started: {options}")

    monkeypatch.setattr(ray_session, "init_ray", init_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_dry_run_estimate_prints_the_timed_steps_and_the_wall_time(tmp_path, capsys, monkeypatch, no_ray):
    two_cpus(monkeypatch)
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(TINY_SWEEP)
    assert main(["sweep", str(sweep_file), "--dry-run", "--estimate", "--storage", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "timing 2 distinct training step(s) on this machine (no Ray) ..." in out
    header = out.index("timing 2 distinct training step(s) on this machine (no Ray) ...") + 1
    # workers and lr change no step key: a column only for what varies among the steps
    columns = ["per_worker_batch", "trials", "step_s", "train_img_per_s", "eval_img_per_s", "warm_up_s"]
    assert out[header].split() == columns
    assert [row.split()[:2] for row in out[header + 1 : header + 3]] == [["32", "2"], ["16", "2"]]
    assert re.fullmatch(
        r"estimated wall time ~\d+ s \(likely \d+ s to \d+ s, fixed costs ~\d+ s of it; "
        r"1 worker x 1 CPU: 2 trials, 2 at once, ~\d+ s; "
        r"2 workers x 1 CPU: 2 trials, 1 at once, ~\d+ s; Ray start ~4 s\); .*",
        out[-1],
    ), out[-1]
    assert sorted(tmp_path.rglob("*")) == [sweep_file]  # nothing written


@pytest.mark.parametrize(
    "words, env, message",
    [
        (["--resume"], {}, "--estimate times a whole sweep before it starts, --resume continues one; drop one"),
        (
            ["--address", "127.0.0.1:1"],
            {},
            "--estimate times the steps on this machine, but --address (or RAY_ADDRESS)",
        ),
        ([], {"RAY_ADDRESS": "127.0.0.1:1"}, "--estimate times the steps on this machine, but --address"),
        (["--max-concurrent", "0"], {}, "--max-concurrent must be >= 1, got 0"),
    ],
)
def test_estimate_with_flags_it_cannot_honour_is_one_line(words, env, message, tmp_path, capsys, monkeypatch, no_ray):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(TINY_SWEEP)
    for dry_run in (["--dry-run"], []):
        argv = ["sweep", str(sweep_file), "--estimate", *words, *dry_run, "--storage", str(tmp_path / "runs")]
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("cifar-ray: error: ") and message in err and err.count("\n") == 1, err
    assert sorted(tmp_path.rglob("*")) == [sweep_file]


def test_the_sweep_header_repeats_the_estimate():
    plan = build_plan({"name": "p", "base": TINY | {"batch_size": 32}})
    capacity = {"cpus": 2.0, "gpus": 0.0, "nodes": 1, "packing": "slots", "per_node": [{"CPU": 2.0, RESOURCE_CPU: 2.0}]}
    header = progress.sweep_header(plan, capacity, None, "runs/p", options=RunOptions(estimate_s=300.0))
    assert header.endswith("; logs and checkpoints in runs/p; estimated wall time ~5 min (--estimate)")
    assert "estimated" not in progress.sweep_header(plan, capacity, None, "runs/p")


@pytest.mark.slow
def test_a_sweep_run_with_estimate_says_it_in_its_header_and_records_it(ray_cluster, tmp_path, capsys, monkeypatch):
    two_cpus(monkeypatch)
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(TINY_SWEEP.replace("workers: [1, 2]", "workers: [1]"))
    assert main(["sweep", str(sweep_file), "--estimate", "--storage", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "timing 1 distinct training step(s) on this machine (no Ray) ..." in out.splitlines()  # lr: one step
    [header] = [line for line in out.splitlines() if line.startswith("tiny: 2 trials, at once")]
    expected = runlog.read_json(tmp_path / "runs" / "tiny" / runlog.SWEEP_FILE)["estimate_s"]
    assert expected > estimate.RAY_START_S + estimate.SLOT_START_S
    assert header.endswith(f"; estimated wall time ~{rough_duration(expected)} (--estimate)"), header
