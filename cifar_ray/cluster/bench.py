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
   breakdown.
Numbers are medians over epochs after the first (warm-up); every record states the machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..core import runlog, sysinfo
from ..core.config import TrainConfig, parse_config
from ..core.storage import StoragePath
from ..core.sweep import build_plan
from ..training.data import CIFAR_MEAN, CIFAR_STD, iterate_train, load_splits, normalise
from ..training.flops import device_peak, throughput, training_flops_per_image
from ..training.loop import MEMORY_FORMAT, build_training, torch_threads, train_epoch
from ..training.models import build_model
from ..training.timing import PhaseTimer

GOALS = {
    "ray_vs_bare": 0.9,
    "sweep_wall_vs_training": 1.15,
    "loader_speedup": 10.0,
    "data_share": 0.03,
    "warm_overhead_s": 1.0,
    "warm_marginal_ratio": 1.10,
}


def bench_config(quick: bool, **overrides) -> TrainConfig:
    base = {
        "dataset": "synthetic",
        "model": "simple_cnn",
        "width": 16,
        "batch_size": 64,
        "augment": "flip_crop",
        "train_subset": 512 if quick else 4096,
        "test_subset": 256,
        "epochs": 2 if quick else 4,
        "use_gpu": "false",
        "backend": "gloo",
    }
    return parse_config(base | overrides)


# The batch-size scan's models (section 5): the bench's workload and a model of ~10x its FLOPs per image.
SCAN_MODELS = ({"model": "simple_cnn", "width": 16}, {"model": "resnet9", "width": 32})
MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def bare_loop(cfg: TrainConfig) -> dict:
    """Our loop without Ray: train_epoch in this process, cfg.cpus_per_worker threads; its model FLOP/s and MFU."""
    cpu = torch.device("cpu")
    with torch_threads(cfg.cpus_per_worker):
        torch.manual_seed(cfg.seed)
        train, _ = load_splits(cfg)
        model = build_model(cfg).to(memory_format=MEMORY_FORMAT)
        flops_per_image, peak = training_flops_per_image(model), device_peak(cpu, cfg.amp)
        training = build_training(cfg, model, len(train) // cfg.effective_batch, cpu, world=1)
        rates, phases, times = [], [], []
        for epoch in range(1, cfg.epochs + 1):
            timer = PhaseTimer(cpu)
            started = time.perf_counter()
            steps = iterate_train(train, cfg, epoch, 0, 1, MEMORY_FORMAT)
            totals = train_epoch(training, steps, cfg, cpu, timer)
            elapsed = time.perf_counter() - started
            rates.append(totals[2].item() / elapsed)
            times.append(elapsed)
            phases.append(timer.seconds())
    last = phases[-1]
    rate = median_after_warmup(rates)
    return {
        "samples_per_s": rate,
        **throughput(flops_per_image, rate, 1.0, peak.flops_per_s),  # flops_per_s, mfu
        "peak_source": peak.source,
        "epoch_time_s": median_after_warmup(times),
        "breakdown_s": last,
        "data_share": last.get("data", 0.0) / sum(last.values()),
    }


def bare_pytorch_loop(cfg: TrainConfig, memory_format: torch.memory_format) -> float:
    """Images/s of the plainest loop PyTorch allows for cfg's model, batch and threads: forward, loss, backward,
    SGD step on batches normalised beforehand (no data pipeline, no metrics, no schedule), in `memory_format`;
    the median over epochs after the first."""
    with torch_threads(cfg.cpus_per_worker):
        torch.manual_seed(cfg.seed)
        train, _ = load_splits(cfg)
        model = build_model(cfg).to(memory_format=memory_format).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        images = normalise(train.images).contiguous(memory_format=memory_format)
        batches = [
            (images[i : i + cfg.batch_size], train.labels[i : i + cfg.batch_size])
            for i in range(0, len(train) - cfg.batch_size + 1, cfg.batch_size)
        ]
        rates = []
        for _ in range(cfg.epochs):
            started = time.perf_counter()
            for x, y in batches:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            rates.append(len(batches) * cfg.batch_size / (time.perf_counter() - started))
    return median_after_warmup(rates)


def loader_comparison(cfg: TrainConfig, batches: int) -> dict:
    """Images/s of batch production only: ours (gather + normalise + flip/crop on tensors) vs a
    torchvision DataLoader with per-sample PIL transforms (the tutorial pipeline), one thread each."""
    import numpy as np
    from PIL import Image
    from torchvision import transforms

    train, _ = load_splits(cfg)
    n = min(len(train), batches * cfg.batch_size)
    with torch_threads(1):
        started = time.perf_counter()
        produced = 0
        for step in iterate_train(train, cfg, 1, 0, 1):
            produced += sum(len(labels) for _, labels in step)
            if produced >= n:
                break
        ours = produced / (time.perf_counter() - started)

        pipeline = transforms.Compose(
            [
                transforms.RandomCrop(32, padding=4, padding_mode="reflect"),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(CIFAR_MEAN, CIFAR_STD),
            ]
        )
        images = train.images[:n].permute(0, 2, 3, 1).numpy()
        labels = train.labels[:n]

        class PilDataset(torch.utils.data.Dataset):
            def __len__(self):
                return n

            def __getitem__(self, i):
                return pipeline(Image.fromarray(np.ascontiguousarray(images[i]))), labels[i]

        loader = torch.utils.data.DataLoader(PilDataset(), batch_size=cfg.batch_size, shuffle=True, num_workers=0)
        started = time.perf_counter()
        produced = sum(len(y) for _, y in loader)
        theirs = produced / (time.perf_counter() - started)
    return {"ours_images_per_s": ours, "dataloader_images_per_s": theirs, "speedup": ours / theirs}


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


def run_sweep(
    name: str,
    base: dict,
    grid: dict,
    storage: Path,
    max_concurrent: int | None,
    say: Callable[[str], None],
    warm: bool = False,
) -> tuple[StoragePath, float]:
    """warm=False: each trial in a one-trial slot, a Ray Train run of its own (`--isolate`), whose start and stop
    sections 2-5 measure."""
    from .orchestrate import run_plan

    plan = build_plan({"name": name, "description": "cifar-ray bench", "base": base, "grid": grid})
    started = time.perf_counter()
    run_dir = run_plan(plan, storage=storage, max_concurrent=max_concurrent, print_line=say, warm=warm)
    return run_dir, time.perf_counter() - started


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


def warm_sweeps(base: dict, sizes: tuple[int, int], storage: Path, say: Callable[[str], None]) -> dict:
    """The same sweep of identical-shape trials with few and with more trials, in warm slots: the marginal
    cost of a trial (wall added per trial vs the training it adds per slot) and the per-trial overhead."""
    runs = []
    for n in sizes:
        run_dir, wall = run_sweep(
            f"bench-warm-{n}", base | {"workers": 1}, {"seed": list(range(n))}, storage, None, say, warm=True
        )
        trials = runlog.load_run(run_dir).trials
        slots = len({t.meta.get("slot") for t in trials})
        runs.append(
            {
                "trials": n,
                "slots": slots,
                "wall_s": wall,
                "training_s": sum(row["epoch_time_s"] for t in trials for row in t.epochs),
                "overheads_s": warm_overheads(run_dir),
            }
        )
    few, more = runs
    added_training = (more["training_s"] - few["training_s"]) / more["slots"]
    overheads = few["overheads_s"] + more["overheads_s"]
    return {
        "runs": runs,
        "marginal_ratio": (more["wall_s"] - few["wall_s"]) / added_training,
        "median_overhead_s": statistics.median(overheads) if overheads else None,
    }


def measure(quick: bool = False, storage: str | Path | None = None, say: Callable[[str], None] = print) -> dict:
    """Runs every section on the connected Ray (started here, and stopped, when none is); returns the record that
    bench.json holds and report/bench.py renders."""
    import tempfile

    from .placement import cluster_capacity
    from .session import init_ray

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
    record["workload"] = {
        k: getattr(base_cfg, k)
        for k in ("dataset", "model", "width", "batch_size", "augment", "train_subset", "epochs")
    }

    # Ray is up (and idle) for every measurement, the bare loop's included: both compete with the
    # same background processes, and the bare loop is not favoured by running before Ray exists.
    t0 = time.perf_counter()
    owns_ray = init_ray()
    record["ray_init_s"] = (time.perf_counter() - t0) if owns_ray else None
    try:
        record["cluster"] = cluster_capacity()
        say("bench 1/6: batch-size scan of our loop without Ray, both models (1 thread)")
        sizes = [32, 128] if quick else [16, 32, 64, 128, 256]
        record["batch_sizes"] = [
            {**model, "batch_size": b, **bare_loop(bench_config(quick, **model, batch_size=b, epochs=2))}
            for model in SCAN_MODELS
            for b in sizes
        ]

        say("bench 2/6: data path, ours vs torchvision DataLoader + PIL transforms")
        record["data_path"] = loader_comparison(base_cfg, batches=8 if quick else 32)

        base = {
            k: getattr(base_cfg, k)
            for k in ("dataset", "model", "width", "batch_size", "augment", "train_subset", "test_subset", "epochs")
        }
        rounds = 1 if quick else 3
        say(
            f"bench 3/6: {rounds} round(s) of bare PyTorch loops (contiguous, channels_last), our loop without Ray, "
            "then our loop in a 1-worker warm slot (1 thread each)"
        )
        record["loop_rounds"], record["trials"] = [], []
        for i in range(rounds):  # interleaved, so that a slow phase of the machine hits every side
            bare = {name: bare_pytorch_loop(base_cfg, layout) for name, layout in MEMORY_FORMATS.items()}
            ours = bare_loop(base_cfg)
            run_dir, _ = run_sweep(f"bench-loop-{i + 1}", base, {"workers": [1]}, storage, 1, say, warm=True)
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

        say("bench 4/6: trials one at a time: 2 workers x 1 thread, 1 worker x 2 threads")
        layouts = [{"workers": 2, "cpus_per_worker": 1}, {"workers": 1, "cpus_per_worker": 2}]
        run_dir, _ = run_sweep("bench-trials", base, {"layout": layouts}, storage, 1, say)
        record["trials"] += trial_overheads(run_dir)

        if not quick:  # 8 more trials: too long for a first look
            say("bench 5/6: an 8-trial sweep of 1-worker trials, packed by cifar-ray")
            run_dir, wall = run_sweep(
                "bench-sweep", base | {"workers": 1}, {"seed": list(range(8))}, storage, None, say
            )
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

        say("bench 6/6: warm slots: the same short 1-worker trials, few and more of them, in warm worker slots")
        record["warm"] = warm_sweeps(base | {"epochs": 3}, (2, 4) if quick else (4, 12), storage, say)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    record["bench_wall_s"] = time.perf_counter() - started
    return record
