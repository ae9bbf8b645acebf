"""`cifar-ray bench`'s peers and cold starts: `cifar-ray sweep` of one trial from nothing, the same trial by plain Ray
Train, the trials by our loop with no Ray (the lower bound) and by plain Ray Tune over a TorchTrainer per trial.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..core import runlog
from ..core.config import parse_config
from ..core.storage import StoragePath
from ..training.distributed import Worker
from ..training.loop import torch_threads
from .bench_cpu import ProcessCpu
from .bench_sweeps import SUB_SECOND


def cold_sweep(base: dict, storage: Path) -> dict:
    """`cifar-ray sweep` of one sub-second trial as a new user runs it: a process of its own that starts (and stops)
    its own Ray. Seconds from the command to each step of its trial (trial.json, metrics.jsonl) and to its exit; the
    trial's training; the exit beyond it; per kind of process (the command's and its Ray's), when it was first seen
    and the CPU seconds it spent. Run while no other Ray runs here."""
    import json
    import subprocess
    import sys

    folder = storage / "bench-cold-sweep"
    folder.mkdir(parents=True, exist_ok=True)
    trial = base | {"workers": 1} | SUB_SECOND
    sweep_file = folder / "one-trial.yaml"
    sweep_file.write_text(json.dumps({"name": "bench-cold", "description": "cifar-ray bench", "base": trial}))
    command = [sys.executable, "-m", "cifar_ray.cli", "sweep", str(sweep_file), "--storage", str(folder)]
    called = time.time()
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as sweep:
        with ProcessCpu(named={sweep.pid: COMMAND}) as cpu:
            _, errors = sweep.communicate(timeout=600)
        exited = time.time() - called
    cpu.first_seen.setdefault(COMMAND, called)
    if sweep.returncode:
        raise subprocess.CalledProcessError(sweep.returncode, command, stderr=errors)
    (only,) = runlog.load_run(StoragePath.of(folder) / "bench-cold").trials
    training = sum(row["epoch_time_s"] for row in only.epochs)
    spent = cpu.seconds()
    spent.pop("driver", None)  # this bench's own process
    return {
        "training_s": training,
        "beyond_training_s": exited - training,
        "steps_s": {
            "its slot took the trial": only.meta["started_unix"] - called,
            "its first epoch began (data and model ready)": only.meta["timeline"]["ready_unix"] - called,
            "its first epoch ended": only.epochs[0]["end_unix"] - called,
            "the command exited": exited,
        },
        "processes": {
            kind: {"seen_s": cpu.first_seen[kind] - called if kind in cpu.first_seen else None, "cpu_s": used}
            for kind, used in spent.items()
        },
    }


COMMAND = "cifar-ray sweep (the command: driver)"  # cold_sweep's name for the command's own process

# The least a Ray Train program costs from nothing: Ray's start and a 1-worker TorchTrainer running our loop on one
# trial (as tune_peer's trainers do), no Tune, no slots; Ray started as cifar-ray starts it (no dashboard).
RAY_TRAIN_PEER = """
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

config, folder = {config!r}, {folder!r}


def train(config):
    import torch
    from ray import train
    from cifar_ray.core.config import parse_config
    from cifar_ray.core.storage import StoragePath
    from cifar_ray.training.distributed import Worker
    from cifar_ray.training.loop import run_trial

    worker = Worker(0, 1, [torch.device("cpu")])
    run_trial(parse_config(config), StoragePath.of(folder) / "trial", worker, lambda m, _: train.report(m))


ray.init(include_dashboard=False, log_to_driver=False)
scaling, run = ScalingConfig(num_workers=1), RunConfig(storage_path=folder)
TorchTrainer(train, train_loop_config=config, scaling_config=scaling, run_config=run).fit()
"""


def cold_ray_train_peer(base: dict, storage: Path) -> dict:
    """cold_sweep's trial run by plain Ray Train (RAY_TRAIN_PEER) in a process of its own: seconds from the command
    to its first epoch's end (metrics.jsonl) and to its exit; the trial's training; the exit beyond it."""
    import subprocess
    import sys

    folder = storage / "bench-cold-ray-train"
    folder.mkdir(parents=True, exist_ok=True)
    script = RAY_TRAIN_PEER.format(config=base | {"workers": 1} | SUB_SECOND, folder=str(folder))
    called = time.time()
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=600)
    exited = time.time() - called
    epochs = runlog.read_epochs(StoragePath.of(folder) / "trial")
    training = sum(row["epoch_time_s"] for row in epochs)
    return {
        "training_s": training,
        "beyond_training_s": exited - training,
        "steps_s": {"its first epoch ended": epochs[0]["end_unix"] - called, "the command exited": exited},
    }


def loop_peer(base: dict, trials: int) -> dict:
    """The lower bound: the same trials (seeds) one after another in this process, trained by our loop with no
    Ray (training/loop.run_trial, as a slot's worker runs it, 1 thread): its wall and the trials' training."""
    import tempfile

    from ..training.loop import run_trial

    training, started = 0.0, time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, torch_threads(1):
        for seed in range(trials):
            cfg = parse_config(base | {"workers": 1, "seed": seed})
            trial_dir = StoragePath.of(folder) / f"t{seed}"
            epochs: list[dict] = []
            run_trial(cfg, trial_dir, Worker(0, 1, [torch.device("cpu")]), lambda m, _, kept=epochs: kept.append(m))
            training += sum(row["epoch_time_s"] for row in epochs)
    wall = time.perf_counter() - started
    return {
        "trials": trials,
        "wall_s": wall,
        "training_s": training,
        "slots": 1,
    }


def tune_peer(base: dict, trials: int, storage: Path) -> dict:
    """The peer a user would write instead: plain Ray Tune over a TorchTrainer per trial (a function trainable
    that fits a fresh 1-worker TorchTrainer running our loop, which reports each epoch; no slots, no Dispatcher,
    Tune's defaults), on the same trials, as many at once as there are cores: its wall and the trials' training
    (their metrics.jsonl)."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer

    from ..training.loop import run_trial

    logs = StoragePath.of(storage) / "bench-tune-peer-logs"

    def train_loop(config: dict) -> None:
        cfg = parse_config(config)
        run_trial(cfg, logs / f"seed-{cfg.seed}", Worker(0, 1, [torch.device("cpu")]), lambda m, _: ray.train.report(m))

    def trainable(config: dict) -> None:
        run = ray.train.RunConfig(name=f"bench-tune-peer-{config['seed']}", storage_path=str(storage))
        scaling = ray.train.ScalingConfig(num_workers=1)
        TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling, run_config=run).fit()

    slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
    started = time.perf_counter()
    tune.Tuner(
        tune.with_resources(trainable, {"CPU": 0, "memory": 1}),  # the trainer's worker holds the core
        param_space=base | {"workers": 1, "seed": tune.grid_search(list(range(trials)))},
        tune_config=tune.TuneConfig(max_concurrent_trials=slots),
        run_config=tune.RunConfig(name="bench-tune-peer", storage_path=str(storage), verbose=0),
    ).fit()
    wall = time.perf_counter() - started
    epochs = [runlog.read_epochs(logs / f"seed-{seed}") for seed in range(trials)]
    return {
        "trials": trials,
        "finished": sum(1 for rows in epochs if rows),
        "slots": slots,
        "wall_s": wall,
        "training_s": sum(row["epoch_time_s"] for rows in epochs for row in rows),
    }
