"""The benchmark harness runs end to end (--quick) and writes parseable output. No timing asserts."""

import json

import pytest

from cifar_ray.cluster.bench import GOALS
from cifar_ray.cluster.bench_peers import COMMAND, cold_ray_train_peer, cold_sweep
from cifar_ray.commands.bench import run_bench

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]
WORKER_CPU_S = 1.0  # the least CPU a Ray Train worker spends on a trial: importing torch alone takes ~2 CPU-s here


def test_quick_bench_writes_json_and_markdown(tmp_path):
    readme = run_bench(quick=True, out_dir=tmp_path / "bench", storage=tmp_path / "runs", say=lambda line: None)
    record = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert record["goals"] == GOALS and record["versions"]["torch"] and record["host"]["cpu_count"]
    scanned = [(row["model"], row["batch_size"]) for row in record["batch_sizes"]]
    assert scanned == [("simple_cnn", 32), ("simple_cnn", 128), ("resnet9", 32), ("resnet9", 128)]
    for row in record["batch_sizes"]:
        assert row["samples_per_s"] > 0 and set(row["breakdown_s"]) == {"data", "forward_backward", "optimizer"}
        assert (
            0 < row["mfu"] < 1
            and row["flops_per_s"] > 0
            and row["peak_source"].endswith("the faster of GEMM and convolution")
        )
    # FLOPs per image do not depend on the batch, so FLOP/s follow images/s; resnet9 costs more FLOPs per image
    per_image = {row["model"]: row["flops_per_s"] / row["samples_per_s"] for row in record["batch_sizes"]}
    assert per_image["resnet9"] > 5 * per_image["simple_cnn"]
    assert record["data_path"]["ours_images_per_s"] > 0 and record["data_path"]["dataloader_images_per_s"] > 0
    (loop_round,) = record["loop_rounds"]  # interleaved rounds: 1 with --quick
    bare = [loop_round["bare_contiguous_samples_per_s"], loop_round["bare_channels_last_samples_per_s"]]
    assert min(bare) > 0 and loop_round["ours_samples_per_s"] > 0
    assert loop_round["ratio"] == pytest.approx(loop_round["ray_samples_per_s"] / max(bare))
    layouts = sorted((t["workers"], t["cpus_per_worker"]) for t in record["trials"])
    assert layouts == [(1, 2), (2, 1)]  # the isolated trials of section 4 (section 3's runs in a warm slot)
    for trial in record["trials"]:
        assert (
            0 < trial["training_s"] < trial["wall_s"] and trial["worker_start_s"] > 0 and 0 <= trial["data_share"] < 1
        )
    assert "sweep" not in record  # the 8-trial sweep is skipped with --quick
    assert [sweep["trials"] for sweep in record["pool"]] == [1, 1, 1, 1, 1]
    for sweep in record["pool"]:
        assert 0 < sweep["training_s"] < sweep["wall_s"]
    assert "cold" not in record and "cold_ray_train" not in record  # Ray was up: no start from nothing to measure
    switch = record["shape_switch"]  # a 1-worker trial, then a 2-worker one: its steps follow the first's end
    assert switch["shapes"] == ["1 worker(s)", "2 worker(s)"] and 0 < switch["taken_s"] < switch["switch_s"]
    warm = record["warm"]
    few, more = warm["runs"]
    assert [few["trials"], more["trials"]] == [1, 3] and 1 <= more["slots"] <= 2
    assert len(more["overheads_s"]) == more["trials"] - more["slots"]  # one per trial after a slot's first
    # No sign asserted: with trials of seconds, wall times are noise (speed is measured by `cifar-ray bench`).
    added_training = (more["training_s"] - few["training_s"]) / more["slots"]
    assert warm["marginal_ratio"] == pytest.approx((more["wall_s"] - few["wall_s"]) / added_training)
    for run in warm["runs"]:  # `sweep --estimate` of the same sweep, Ray's start left out
        assert 0 < run["estimate_range_s"][0] < run["estimate_s"] < run["estimate_range_s"][1]
    peer = record["tune_peer"]  # plain Tune over a TorchTrainer per trial, on the first sweep's trials
    assert peer["trials"] == peer["finished"] == few["trials"] and 0 < peer["training_s"] < peer["wall_s"]
    text = readme.read_text()
    assert "| plain Ray Tune, a TorchTrainer per trial | 1 |" in text and "`sweep --estimate` against" in text
    for heading in (
        "## 1. Training loop",
        "## 2. Orchestration overhead",
        "## 2b. Warm slots",
        "## 2e. A shape switch",
        "## 3. Data path",
        "## 4. Scaling",
        "## 5. Batch size",
        "| resnet9 (width 32) | 128 |",
    ):
        assert heading in text
    assert "Ray was already running" in text  # the session's Ray was reused, so ray.init is not timed


def test_a_cold_sweep_is_timed_from_the_command_to_its_trials_steps_and_its_exit(tmp_path):
    """Section 2d's measure: `cifar-ray sweep` of one trial in a process of its own (its own Ray)."""
    cold = cold_sweep({"dataset": "synthetic", "epochs": 1, "width": 8, "train_subset": 256}, tmp_path)
    steps = list(cold["steps_s"].values())
    assert 0 < steps[0] < steps[1] < steps[2] <= steps[3] and steps == sorted(steps)
    assert 0 < cold["training_s"] < steps[3] and cold["beyond_training_s"] == pytest.approx(
        steps[3] - cold["training_s"]
    )
    # First seen: the command's own Ray's processes (the test session's Ray, also this process's descendants, was up
    # before and is not seen starting); its CPU is counted beside the command's, so CPU is asserted only from below,
    # in CPU-seconds: wall seconds (the trial's training) stretch with the machine's load, CPU-seconds do not. When
    # each was first seen is a sample of a thread of this process: only the order the raylet imposes is asserted.
    processes = cold["processes"]
    print(
        {kind: processes[kind] for kind in (COMMAND, "raylet", "ray::RayTrainWorker")}, "training", cold["training_s"]
    )
    assert processes[COMMAND]["seen_s"] == 0 and processes[COMMAND]["cpu_s"] > 0.5
    assert 0 < processes["raylet"]["seen_s"] <= processes["ray::RayTrainWorker"]["seen_s"]  # the raylet starts it
    assert processes["ray::RayTrainWorker"]["cpu_s"] > WORKER_CPU_S  # it imported torch and trained
    assert "driver" not in processes  # the bench's own process


def test_plain_ray_train_runs_the_cold_sweeps_trial_from_a_process_of_its_own(tmp_path):
    """Section 2d's peer: the same trial by a 1-worker TorchTrainer of a script that starts its own Ray."""
    peer = cold_ray_train_peer({"dataset": "synthetic", "epochs": 1, "width": 8}, tmp_path)
    ended, exited = peer["steps_s"].values()
    assert 0 < peer["training_s"] < ended <= exited and peer["beyond_training_s"] == pytest.approx(
        exited - peer["training_s"]
    )
