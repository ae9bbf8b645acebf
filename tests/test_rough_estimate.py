"""A sweep started without --estimate still says how long it will roughly take (core/estimate.py's `rough_*`): FLOPs
counted from the config at a default CPU speed, nothing timed; GPU trials unknown; a long sweep suggests timing it
first. In the header of a real sweep (cluster/progress.sweep_header) and in the dry run."""

from __future__ import annotations

import math

import pytest

from cifar_ray.cli import main
from cifar_ray.cluster import progress
from cifar_ray.cluster import session as ray_session
from cifar_ray.cluster.placement import RESOURCE_CPU
from cifar_ray.core import estimate, sysinfo
from cifar_ray.core.config import parse_config
from cifar_ray.core.estimate import (
    MODEL_LAYERS,
    RAY_START_S,
    ROUGH_CPU_FLOPS,
    SLOT_START_S,
    config_flops_per_image,
    rough_estimate,
    rough_line,
    rough_step_time,
)
from cifar_ray.core.run import RunOptions
from cifar_ray.core.sweep import build_plan
from cifar_ray.core.text import rough_duration

TWO_CPUS = {"cpus": 2.0, "gpus": 0.0, "nodes": 1, "packing": "slots", "per_node": [{"CPU": 2.0, RESOURCE_CPU: 2.0}]}
BASE = {"dataset": "synthetic", "train_subset": 5000, "test_subset": 1000, "train_eval_size": 1000, "epochs": 3}


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """The header's and the dry run's lines as on an idle machine, whatever runs beside the test."""
    monkeypatch.setattr(sysinfo, "machine_load", lambda: (0.0, 2))


@pytest.mark.parametrize("model, width", [("simple_cnn", 16), ("simple_cnn", 32), ("resnet9", 32)])
def test_flops_counted_from_the_config_are_torchs_count_of_the_built_model(model, width):
    from cifar_ray.training.flops import training_flops_per_image as counted_by_torch
    from cifar_ray.training.models import MODELS, build_model

    assert set(MODEL_LAYERS) == set(MODELS)  # a new model needs its layers here too
    config = parse_config({"model": model, "width": width})
    assert math.isclose(config_flops_per_image(config), counted_by_torch(build_model(config)), rel_tol=0.03)


def test_a_rough_step_is_the_workers_images_at_the_default_speed_of_its_cores():
    config = parse_config(BASE | {"model": "simple_cnn", "width": 16, "batch_size": 64, "workers": 2})
    flops = config_flops_per_image(config)
    timing = rough_step_time(config)
    assert math.isclose(timing.step_s, 32 * flops / ROUGH_CPU_FLOPS)  # each of 2 workers steps on 32 images
    assert math.isclose(timing.eval_image_s, flops / 3 / ROUGH_CPU_FLOPS) and timing.first_step_extra_s == 0
    two_cores = rough_step_time(parse_config(config.model_dump() | {"cpus_per_worker": 2}))
    assert math.isclose(two_cores.step_s, timing.step_s / 2)
    bf16 = rough_step_time(parse_config(config.model_dump() | {"amp": "bf16"}))
    assert math.isclose(bf16.step_s, timing.step_s * estimate.ROUGH_BF16_SLOWDOWN)
    assert rough_step_time(parse_config(config.model_dump() | {"use_gpu": "true"})) is None


def test_a_rough_sweep_is_the_estimates_arithmetic_and_unknown_with_a_gpu_trial():
    configs = [parse_config(BASE | {"lr": lr}) for lr in (0.05, 0.1)]
    label = "1 worker x 1 CPU"
    rough = rough_estimate(configs, {label: 2}, isolate=False)
    [trial, _] = rough.trials
    assert math.isclose(rough.wall_s, RAY_START_S + SLOT_START_S + trial.total_s)  # two slots side by side
    assert rough_estimate([*configs, parse_config(BASE | {"use_gpu": "true"})], {label: 2}, False) is None


def test_the_rough_line_says_what_it_is_and_suggests_timing_a_long_sweep():
    short = rough_estimate([parse_config(BASE)], {"1 worker x 1 CPU": 1}, isolate=False)
    line = rough_line(short, 1, "cifar-ray sweep s.yaml --dry-run --estimate")
    assert line.startswith("wall time ~") and line.endswith(
        ": a rough estimate from default CPU speeds, nothing timed here"
    )
    timed = "; time it on this machine first: cifar-ray sweep s.yaml --dry-run --estimate"
    assert rough_line(short, estimate.SUGGEST_ABOVE_TRIALS + 1, "cifar-ray sweep s.yaml --dry-run --estimate").endswith(
        timed
    )
    hours = parse_config(BASE | {"train_subset": 0, "epochs": 30, "model": "resnet9", "width": 64})
    long = rough_estimate([hours], {"1 worker x 1 CPU": 1}, isolate=False)
    assert long.wall_s > estimate.SUGGEST_ABOVE_S
    assert rough_line(long, 1, "X").startswith(f"wall time ~{rough_duration(long.wall_s)}: ")
    assert rough_line(long, 1, "X").endswith("; time it on this machine first: X")
    assert rough_line(None, 4, "X") == "wall time unknown: GPU trials get no rough estimate (--estimate times them)"


def test_a_rough_estimate_on_a_busy_machine_says_to_expect_longer(monkeypatch):
    """The default speeds are an idle machine's: the demo's ~85 s took 25 min beside two busy loops and a test
    session. A load above the cores is said with the estimate; an idle machine's, or a cluster's (unknown), is not."""
    short = rough_estimate([parse_config(BASE)], {"1 worker x 1 CPU": 1}, isolate=False)
    busy = rough_line(short, 1, "X", (5.94, 2))
    assert busy.endswith("nothing timed here; this machine is busy (load average 5.9 on 2 cores): expect longer")
    assert rough_line(short, 1, "X", (1.5, 2)) == rough_line(short, 1, "X", None) == rough_line(short, 1, "X")
    assert "busy" not in rough_line(None, 1, "X", (5.9, 2))  # no estimate to qualify
    plan = build_plan({"name": "p", "base": BASE, "grid": {"seed": [0, 1]}})
    monkeypatch.setattr(sysinfo, "machine_load", lambda: (8.0, 2))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert "; this machine is busy (load average 8.0 on 2 cores)" in progress.sweep_header(plan, TWO_CPUS, None, "r")
    on_a_cluster = RunOptions(address="10.0.0.1:6379")
    assert "busy" not in progress.sweep_header(plan, TWO_CPUS, None, "r", options=on_a_cluster)


def test_a_new_sweeps_header_gives_its_rough_wall_time_a_resumed_one_none():
    plan = build_plan({"name": "p", "base": BASE, "grid": {"seed": list(range(101))}})
    command = "cifar-ray sweep p.yaml --set epochs=3"
    header = progress.sweep_header(plan, TWO_CPUS, None, "runs/p", options=RunOptions(command=command))
    assert header.startswith("p: 101 trials, at once: 2 of 101 with 1 worker x 1 CPU"), header
    assert "; logs and checkpoints in runs/p; wall time ~" in header
    assert ": a rough estimate from default CPU speeds, nothing timed here; time it on this machine first: " in header
    assert header.endswith(f"first: {command} --dry-run --estimate"), header
    from_python = progress.sweep_header(plan, TWO_CPUS, None, "runs/p")  # no command line to repeat
    assert from_python.endswith("; time it on this machine first: cifar-ray sweep FILE --dry-run --estimate")
    assert "wall time" not in progress.sweep_header(plan, TWO_CPUS, None, "runs/p", unfinished=3)
    gpu = build_plan({"name": "g", "base": BASE | {"use_gpu": "true"}})
    assert progress.sweep_header(gpu, TWO_CPUS, None, "runs/g").endswith(
        "; wall time unknown: GPU trials get no rough estimate (--estimate times them)"
    )


def test_the_dry_run_without_estimate_gives_the_rough_wall_time_on_this_machines_cpus(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ray_session.os, "cpu_count", lambda: 2)
    sweep_file = tmp_path / "many.yaml"
    sweep_file.write_text(f"name: many\nbase: {BASE}\ngrid:\n  seed: {list(range(120))}\n".replace("'", ""))
    assert main(["sweep", str(sweep_file), "--dry-run"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    plan = build_plan({"name": "many", "base": BASE, "grid": {"seed": list(range(120))}})
    rough = rough_estimate([t.config for t in plan.trials], {"1 worker x 1 CPU": 2}, isolate=False)
    assert last == (
        f"on this machine's 2 CPUs: {rough_line(rough, 120, f'cifar-ray sweep {sweep_file} --dry-run --estimate')}"
    ), last
