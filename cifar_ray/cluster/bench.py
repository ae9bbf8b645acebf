"""`cifar-ray bench`'s measurements: where the time goes, measured side by side in one run (report/bench.py renders
the record, commands/bench.py writes both).

1. the training loop inside a Ray Train worker vs a bare PyTorch loop (same model, batch, threads; no data pipeline)
   in both memory formats, in interleaved rounds with Ray up for all, the median of the per-round ratios to the
   faster bare loop;
2. orchestration overhead per trial (worker start, data load, teardown; 1 and 2 workers) and a
   sweep's wall time vs its pure training time, and the trial length at which that meets the goal;
3. our tensor-resident data path vs a torchvision DataLoader with per-sample PIL transforms;
4. scaling on the cores at hand: 1 worker x 2 threads vs 2 workers x 1 thread;
5. images/s, model GFLOP/s and MFU vs batch size for both models (our loop in this process), with the step-time
   breakdown;
6. a warm pool (`cifar_ray.pool()`): what a sweep costs beyond its training in the slots of the sweep before.
Numbers are medians over epochs after the first (warm-up); every record states the machine. The sections' parts:
bench_loop.py (the loop in this process), bench_sweeps.py (sweeps on Ray), bench_peers.py (cold starts and peers),
bench_cpu.py (CPU seconds per kind of process).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..core import runlog, sysinfo
from ..core.config import TrainConfig, parse_config
from ..core.run import RunOptions
from .bench_loop import MEMORY_FORMATS, bare_loop, bare_pytorch_loop, loader_comparison
from .bench_peers import cold_ray_train_peer, cold_sweep, loop_peer, tune_peer
from .bench_sweeps import pooled_sweeps, run_sweep, shape_switch, trial_overheads, warm_sweeps

GOALS = {
    "ray_vs_bare": 0.9,
    "sweep_wall_vs_training": 1.15,
    "loader_speedup": 10.0,
    "data_share": 0.03,
    "warm_overhead_s": 1.0,
    "warm_marginal_ratio": 1.10,
    "handoff_gap_s": 0.15,
    "pool_beyond_training_s": 1.5,
    "cold_first_epoch_s": 6.0,
    "cold_beyond_training_s": 8.0,
    "shape_switch_s": 2.0,
    "estimate_factor": 1.5,
}


def bench_config(quick: bool, **overrides) -> TrainConfig:
    base = {
        "dataset": "synthetic",
        "model": "simple_cnn",
        "width": 16,
        "batch_size": 64,
        "augment": "flip_crop",
        "train_subset": 256 if quick else 4096,
        "test_subset": 256,
        "epochs": 2 if quick else 4,
        "use_gpu": "false",
        "backend": "gloo",
    }
    return parse_config(base | overrides)


# The batch-size scan's models (section 5): the bench's workload and a model of ~10x its FLOPs per image.
SCAN_MODELS = ({"model": "simple_cnn", "width": 16}, {"model": "resnet9", "width": 32})


def measure(quick: bool = False, storage: str | Path | None = None, say: Callable[[str], None] = print) -> dict:
    """Runs every section on the connected Ray (started here, and stopped, when none is); returns the record that
    bench.json holds and report/bench.py renders."""
    import tempfile

    from .placement import cluster_capacity
    from .session import cluster_address, init_ray

    storage = Path(storage or tempfile.mkdtemp(prefix="cifar-ray-bench-"))
    started = time.perf_counter()
    record: dict = {
        "quick": quick,
        "date": runlog.now_iso(),
        "git_revision": sysinfo.git_revision(Path(__file__).parent),
        "host": sysinfo.host_info(),
        "versions": sysinfo.versions(),
        "goals": GOALS,
    }
    base_cfg = bench_config(quick)
    base = {
        k: getattr(base_cfg, k)
        for k in ("dataset", "model", "width", "batch_size", "augment", "train_subset", "test_subset", "epochs")
    }
    record["workload"] = base
    short = base | {"epochs": 1, "width": 8}  # the issue-36 trials: one epoch of about a second
    import ray

    if not ray.is_initialized() and cluster_address(None) is None:  # a start from nothing, before this bench's Ray
        say("bench 0/8: a cold start: `cifar-ray sweep` of one sub-second trial, Ray's start included")
        record["cold"] = cold_sweep(short, storage)
        record["cold_ray_train"] = cold_ray_train_peer(short, storage)
    # Ray is up (and idle) for every measurement, the bare loop's included: both compete with the
    # same background processes, and the bare loop is not favoured by running before Ray exists.
    t0 = time.perf_counter()
    owns_ray = init_ray()
    record["ray_init_s"] = (time.perf_counter() - t0) if owns_ray else None
    try:
        record["cluster"] = cluster_capacity()
        say("bench 1/8: batch-size scan of our loop without Ray, both models (1 thread)")
        sizes = [32, 128] if quick else [16, 32, 64, 128, 256]
        record["batch_sizes"] = [
            {**model, "batch_size": b, **bare_loop(bench_config(quick, **model, batch_size=b, epochs=2))}
            for model in SCAN_MODELS
            for b in sizes
        ]

        say("bench 2/8: data path, ours vs torchvision DataLoader + PIL transforms")
        record["data_path"] = loader_comparison(base_cfg, batches=8 if quick else 32)

        rounds = 1 if quick else 3
        say(
            f"bench 3/8: {rounds} round(s) of bare PyTorch loops (contiguous, channels_last), our loop without Ray, "
            "then our loop in a 1-worker warm slot (1 thread each)"
        )
        record["loop_rounds"], record["trials"] = [], []
        for i in range(rounds):  # interleaved, so that a slow phase of the machine hits every side
            bare = {name: bare_pytorch_loop(base_cfg, layout) for name, layout in MEMORY_FORMATS.items()}
            ours = bare_loop(base_cfg)
            options = RunOptions(storage, max_concurrent=1, print_line=say)
            run_dir, _ = run_sweep(f"bench-loop-{i + 1}", base, {"workers": [1]}, options)
            trial = trial_overheads(run_dir)[0]  # not in the overhead table: a warm slot's start is not the trial's
            record["loop_rounds"].append(
                {
                    **{f"bare_{name}_samples_per_s": rate for name, rate in bare.items()},
                    "ours_samples_per_s": ours["samples_per_s"],
                    "ray_samples_per_s": trial["samples_per_s"],
                    "ratio": trial["samples_per_s"] / max(bare.values()),
                }
            )
            if i == 0:
                record["bare_loop"] = ours

        say("bench 4/8: trials one at a time: 2 workers x 1 thread, 1 worker x 2 threads")
        layouts = [{"workers": 2, "cpus_per_worker": 1}, {"workers": 1, "cpus_per_worker": 2}]
        options = RunOptions(storage, max_concurrent=1, isolate=True, print_line=say)
        run_dir, _ = run_sweep("bench-trials", base, {"layout": layouts}, options)
        record["trials"] += trial_overheads(run_dir)

        if not quick:  # 8 more trials: too long for a first look
            say("bench 5/8: an 8-trial sweep of 1-worker trials, packed by cifar-ray")
            options = RunOptions(storage, isolate=True, print_line=say)
            run_dir, wall = run_sweep("bench-sweep", base | {"workers": 1}, {"seed": list(range(8))}, options)
            rows = trial_overheads(run_dir)
            slots = max(1, int(record["cluster"]["slot_cpus"]))
            pure = sum(r["training_s"] for r in rows) / slots
            # Each trial's fixed start/stop cost, as the sweep saw it: wall = pure + fixed x trials / slots.
            fixed = (wall - pure) * slots / len(rows)
            record["sweep"] = {
                "trials": len(rows),
                "parallel_slots": slots,
                "wall_s": wall,
                "training_s_per_slot": pure,
                "ratio": wall / pure,
                "training_s_per_trial": pure * slots / len(rows),
                "fixed_s_per_trial": fixed,
                "training_s_per_trial_for_goal": fixed / (GOALS["sweep_wall_vs_training"] - 1),
            }

        # The issue-36 grid: few and more short trials.
        sizes = (1, 3) if quick else (20, 120)
        say(
            f"bench 6/8: warm slots: {sizes[0]} and {sizes[1]} short 1-worker trials; the first {sizes[0]} in one "
            "process, and with plain Ray Tune over a TorchTrainer per trial"
        )
        record["warm"] = warm_sweeps(short, sizes, storage, say)
        record["loop_peer"] = loop_peer(short, sizes[0])
        record["tune_peer"] = tune_peer(short, sizes[0], storage)
        say(f"bench 7/8: a warm pool: a {sizes[0]}-trial sweep twice, then three of one sub-second trial, in its slots")
        record["pool"] = pooled_sweeps(short, sizes[0], storage, say)
        say("bench 8/8: a shape switch: a sub-second 1-worker trial, then a 2-worker one, one at a time")
        record["shape_switch"] = shape_switch(short, storage, say)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    record["bench_wall_s"] = time.perf_counter() - started
    return record
