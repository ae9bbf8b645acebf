"""`cifar-ray bench`'s sweeps on Ray (sections 2, 4 and 6 of cluster/bench.py), read back from their run folders: each
trial's overheads, warm slots with few and more trials (the marginal trial, the hand-off gap, the start-up's steps,
CPU seconds per kind of process), a warm pool's sweeps and a shape switch.
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from ..core import runlog
from ..core.run import RunOptions
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan, build_plan
from .bench_cpu import ProcessCpu
from .bench_loop import median_after_warmup


def bench_plan(name: str, base: dict, grid: dict) -> SweepPlan:
    return build_plan({"name": name, "description": "cifar-ray bench", "base": base, "grid": grid})


def run_sweep(name: str, base: dict, grid: dict, options: RunOptions) -> tuple[StoragePath, float]:
    """options.isolate: each trial in a one-trial slot, a Ray Train run of its own, whose start and stop sections 2-5
    measure."""
    from .orchestrate import run_plan

    plan = bench_plan(name, base, grid)
    started = time.perf_counter()
    run_dir = run_plan(plan, options)
    return run_dir, time.perf_counter() - started


def sweep_estimate_s(name: str, base: dict, grid: dict) -> dict:
    """What `sweep --estimate` expects of the sweep (cluster/estimate.py), Ray's start left out: the bench's sweeps
    run on a Ray that is already up."""
    from .estimate import estimate_plan

    estimate = estimate_plan(bench_plan(name, base, grid), None, False).sweep
    low, high = estimate.range_s
    ray = estimate.ray_start_s
    return {"estimate_s": estimate.wall_s - ray, "estimate_range_s": [low - ray, high - ray]}


def trial_overheads(run_dir: runlog.Where) -> list[dict]:
    """Per trial: training time vs everything around it, from trial.json timelines and epochs."""
    rows = []
    for trial in runlog.load_run(run_dir).trials:
        meta, epochs = trial.meta, trial.epochs
        timeline = meta.get("timeline", {})
        if not epochs or "started_unix" not in meta or "finished_unix" not in meta or not timeline:
            continue
        train_time = sum(row["epoch_time_s"] for row in epochs)
        rows.append(
            {
                "trial": trial.name,
                "workers": trial.config["workers"],
                "cpus_per_worker": trial.config["cpus_per_worker"],
                "wall_s": meta["finished_unix"] - meta["started_unix"],
                "worker_start_s": timeline["loop_started_unix"] - meta["started_unix"],
                "data_and_model_s": timeline["ready_unix"] - timeline["loop_started_unix"],
                "training_s": train_time,
                "teardown_s": meta["finished_unix"] - epochs[-1]["end_unix"],
                "samples_per_s": median_after_warmup([row["samples_per_s"] for row in epochs]),
                "data_share": median_after_warmup([row["time_data_s"] / row["train_time_s"] for row in epochs]),
            }
        )
    return rows


def warm_overheads(run_dir: runlog.Where) -> list[float]:
    """Per trial that a slot ran after another: the seconds it spent outside its epochs (taking it after the
    slot's previous trial ended, building data and model, finishing after its last epoch)."""
    trials = sorted(
        (t for t in runlog.load_run(run_dir).trials if t.epochs and "finished_unix" in t.meta),
        key=lambda t: t.meta["started_unix"],
    )
    previous_end: dict[str, float] = {}
    overheads = []
    for trial in trials:
        slot, meta = trial.meta.get("slot"), trial.meta
        if slot in previous_end:
            training = sum(row["epoch_time_s"] for row in trial.epochs)
            overheads.append(meta["finished_unix"] - previous_end[slot] - training)
        previous_end[slot] = meta["finished_unix"]
    return overheads


def handoff_gaps(run_dir: runlog.Where) -> list[float]:
    """Per trial that a slot ran after another: seconds from the end of the slot's previous trial (finished_unix)
    to this one's start (started_unix: its slot took it), from trial.json."""
    trials = sorted(
        (t for t in runlog.load_run(run_dir).trials if "started_unix" in t.meta and "finished_unix" in t.meta),
        key=lambda t: t.meta["started_unix"],
    )
    previous_end: dict[str, float] = {}
    gaps = []
    for trial in trials:
        slot = trial.meta.get("slot")
        if slot in previous_end:
            gaps.append(trial.meta["started_unix"] - previous_end[slot])
        previous_end[slot] = trial.meta["finished_unix"]
    return gaps


def startup_phases(run_dir: runlog.Where, called: float, returned: float, cpu: ProcessCpu) -> dict[str, float]:
    """Seconds from the sweep's call to each step of its start, in order: the processes Ray Train starts (when
    each kind was first seen), the first trial taken by its slot's rank 0 (its worker group up, the process
    group set), its data and model ready, its first epoch's end; and the sweep's return after its last trial."""
    trials = [t for t in runlog.load_run(run_dir).trials if t.epochs and "timeline" in t.meta]
    seen = {f"{kind} started": at - called for kind, at in cpu.first_seen.items() if kind in STARTUP_PROCESSES}
    first = min(trials, key=lambda t: t.meta["started_unix"])
    return dict(sorted(seen.items(), key=lambda kv: kv[1])) | {
        "first trial taken by its slot": first.meta["started_unix"] - called,
        "its data and model ready": first.meta["timeline"]["ready_unix"] - called,
        "its first epoch ended": first.epochs[0]["end_unix"] - called,
        "last trial finished": max(t.meta["finished_unix"] for t in trials) - called,
        "sweep returned": returned - called,
    }


# The processes of a sweep's start, in the order they start (process_kind's names).
STARTUP_PROCESSES = (
    "ray::ImplicitFunc",
    "ray::TrainController",
    "ray::SynchronizationActor",
    "ray::RayTrainWorker",
)


def warm_sweeps(base: dict, sizes: tuple[int, int], storage: Path, say: Callable[[str], None]) -> dict:
    """The same sweep of identical-shape trials with few and with more trials, in warm slots: the marginal
    cost of a trial (wall added per trial vs the training it adds per slot), the per-trial overhead, the
    hand-off gap between a slot's trials, the CPU seconds per kind of process, and the start-up's steps."""
    runs = []
    for n in sizes:
        name, trial, grid = f"bench-warm-{n}", base | {"workers": 1}, {"seed": list(range(n))}
        estimate = sweep_estimate_s(name, trial, grid)
        called = time.time()
        with ProcessCpu() as cpu:
            run_dir, wall = run_sweep(name, trial, grid, RunOptions(storage, print_line=say))
        trials = runlog.load_run(run_dir).trials
        slots = len({t.meta.get("slot") for t in trials})
        runs.append(
            {
                "trials": n,
                "slots": slots,
                "wall_s": wall,
                "training_s": sum(row["epoch_time_s"] for t in trials for row in t.epochs),
                "overheads_s": warm_overheads(run_dir),
                "handoff_gaps_s": handoff_gaps(run_dir),
                "cpu_s": cpu.seconds(),
                "startup_s": startup_phases(run_dir, called, called + wall, cpu),
                **estimate,
            }
        )
    few, more = runs
    added_training = (more["training_s"] - few["training_s"]) / more["slots"]
    overheads = few["overheads_s"] + more["overheads_s"]
    gaps = few["handoff_gaps_s"] + more["handoff_gaps_s"]
    added = more["trials"] - few["trials"]
    kinds = dict.fromkeys([*more["cpu_s"], *few["cpu_s"]])
    return {
        "runs": runs,
        "marginal_ratio": (more["wall_s"] - few["wall_s"]) / added_training,
        "median_overhead_s": statistics.median(overheads) if overheads else None,
        "median_handoff_gap_s": statistics.median(gaps) if gaps else None,
        # CPU seconds each added trial costs, per kind of process: where the marginal trial's time goes
        "cpu_s_per_added_trial": {
            kind: (more["cpu_s"].get(kind, 0.0) - few["cpu_s"].get(kind, 0.0)) / added for kind in kinds
        },
    }


def pooled_sweeps(base: dict, trials: int, storage: Path, say: Callable[[str], None]) -> list[dict]:
    """Sweeps of identical-shape 1-worker trials in one warm pool (cluster/pool.py): the first (`trials` trials)
    starts the slots, a second like it and three of one sub-second trial each (what a notebook's next call of a
    short sweep costs: the issue's measure; a longer trial would hide the start of its thin Tune trial) train in
    them. Per sweep: its trials, its wall, its training (the busiest slot's epochs) and the wall beyond it."""
    from .pool import activate

    sweeps = []
    with activate():
        for i, size in enumerate([trials, trials, 1, 1, 1]):
            options = RunOptions(storage, print_line=say)  # warm: the pool's slots
            config = base | {"workers": 1} | (SUB_SECOND if size == 1 else {})
            run_dir, wall = run_sweep(f"bench-pool-{i + 1}", config, {"seed": list(range(size))}, options)
            per_slot: dict[str, float] = collections.defaultdict(float)
            for trial in runlog.load_run(run_dir).trials:
                per_slot[trial.meta.get("slot")] += sum(row["epoch_time_s"] for row in trial.epochs)
            training = max(per_slot.values())
            sweeps.append(
                {"trials": size, "wall_s": wall, "training_s": training, "beyond_training_s": wall - training}
            )
    return sweeps


SUB_SECOND = {"train_subset": 1024, "test_subset": 256}  # a short trial's data cut to under a second of training


def shape_switch(base: dict, storage: Path, say: Callable[[str], None]) -> dict:
    """A sweep of two sub-second trials of two shapes (1 worker, then 2), one at a time, as the quickstart switches:
    seconds from the first shape's trial's end to the second's steps (its slot took it; its first epoch began)."""
    options = RunOptions(storage, max_concurrent=1, print_line=say)
    run_dir, wall = run_sweep("bench-shape-switch", base | SUB_SECOND, {"workers": [1, 2]}, options)
    first, second = sorted(runlog.load_run(run_dir).trials, key=lambda t: t.meta["started_unix"])
    ended = first.meta["finished_unix"]
    return {
        "shapes": [f"{t.config['workers']} worker(s)" for t in (first, second)],
        "wall_s": wall,
        "taken_s": second.meta["started_unix"] - ended,
        "switch_s": second.meta["timeline"]["ready_unix"] - ended,
    }
