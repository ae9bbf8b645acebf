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
Numbers are medians over epochs after the first (warm-up); every record states the machine.
"""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..core import runlog, sysinfo
from ..core.config import TrainConfig, parse_config
from ..core.run import RunOptions
from ..core.storage import StoragePath
from ..core.sweep import SweepPlan, build_plan
from ..training.data import CIFAR_MEAN, CIFAR_STD, iterate_train, load_splits, normalise
from ..training.distributed import Worker
from ..training.flops import device_peak, throughput, training_flops_per_image
from ..training.loop import MEMORY_FORMAT, start_training, torch_threads, train_epoch
from ..training.models import build_model
from ..training.timing import PhaseTimer

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
MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def bare_loop(cfg: TrainConfig) -> dict:
    """Our loop without Ray: train_epoch in this process, cfg.cpus_per_worker threads; its model FLOP/s and MFU."""
    cpu = torch.device("cpu")
    with torch_threads(cfg.cpus_per_worker):
        train, _ = load_splits(cfg)
        flops: list[float] = []  # of the model as built, before the wrapper

        def as_built(model: torch.nn.Module) -> None:
            flops.append(training_flops_per_image(model))

        training = start_training(cfg, Worker.single(cpu), len(train) // cfg.effective_batch, prepare=as_built)
        flops_per_image, peak = flops[0], device_peak(cpu, cfg.amp)
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


def process_kind(process) -> str:
    """What a process of this sweep is, by its title: Ray names its workers `ray::Actor.method` or `ray::task`
    (`ray::RayTrainWorker`, `ray::TrainController`, the thin trials' `ray::ImplicitFunc`),
    its daemons by their executables (raylet, gcs_server); an idle pooled worker is `ray::IDLE`. A named actor's
    name (the run's Dispatcher's) is dropped: the kind is its class."""
    try:
        words = process.cmdline()
    except Exception:  # it ended between the listing and the read
        return "gone"
    first = words[0] if words else process.name()
    if first.startswith("ray::"):  # an actor's title: ray::[name:]Class.method; a task's: ray::function
        return "ray::" + first[5:].split(" ")[0].split(".")[0].split(":")[-1].lstrip("_")
    for word in words[:3]:  # python .../default_worker.py before it sets its title; a daemon's executable path
        name = Path(word).name
        if name in ("raylet", "gcs_server", "default_worker.py", "log_monitor.py"):
            return name
        for script, kind in RAY_SCRIPTS.items():
            if word.endswith(script):
                return kind
    return "driver" if process.pid == os.getpid() else Path(first).name


# Ray's Python daemons by their script (a head node's; ray.init starts them): the agents by the titles they set later
RAY_SCRIPTS = {
    "ray/dashboard/dashboard.py": "dashboard.py",  # the API server: started (minimal) even with include_dashboard=False
    "ray/autoscaler/_private/monitor.py": "monitor.py",  # the autoscaler's monitor
    "ray/dashboard/agent.py": "ray::DashboardAgent",
    "ray/_private/runtime_env/agent/main.py": "ray::RuntimeEnvAgent",
}


class ProcessCpu:
    """CPU seconds spent by this process and all its descendants (an embedded Ray's daemons and workers) while a
    `with` block runs, per kind of process (process_kind), from samples every `interval_s`, and when each kind
    was first seen. CPU time, unlike wall time, is not stretched by other programs on a loaded machine. A process
    is charged to the first kind it had other than `ray::IDLE` and `default_worker.py` (a pooled worker that
    becomes a trial's actor) and other than its parent's while it still shows its parent's command line (forked, not
    yet running its own program: the raylet's new workers); what a process spends after the last sample before it
    ends is not seen."""

    FORKED = "forked"  # charged to its parent's kind if it never runs a program of its own
    IDLE = ("ray::IDLE", "default_worker.py", "bash", "sh", "gone", FORKED)  # a worker before its first task or actor

    def __init__(self, interval_s: float = 0.1, named: dict[int, str] | None = None):
        self.interval_s = interval_s
        self.named = named or {}  # pid -> its kind, for a process its title does not name (a command run here)
        self.start: dict[int, float] = {}  # pid -> its CPU seconds when the block began (0 for newer processes)
        self.last: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.first_seen: dict[str, float] = {}  # kind -> time.time() it was first seen
        self.parent_kind: dict[int, str] = {}  # pid -> its parent's kind, for a process first seen forked
        self._stop = threading.Event()

    def _sample(self, initial: bool = False) -> None:
        import psutil

        me = psutil.Process()
        for process in [me, *me.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            used = times.user + times.system
            self.start.setdefault(process.pid, used if initial else 0.0)
            self.last[process.pid] = used
            if self.kind.get(process.pid, "ray::IDLE") in self.IDLE:
                try:
                    kind = self._kind_now(process)
                except psutil.Error:
                    continue
                if kind not in self.IDLE or process.pid not in self.kind:
                    self.kind[process.pid] = kind
                    if kind != self.FORKED:
                        self.first_seen.setdefault(kind, time.time())

    def _kind_now(self, process) -> str:
        if not process.cmdline():  # ended (a zombie): it keeps the kind it had
            return "gone"
        kind = self.named.get(process.pid) or process_kind(process)
        parent = process.parent()
        if kind not in self.IDLE and parent is not None and parent.cmdline() == process.cmdline():
            self.parent_kind.setdefault(process.pid, self.named.get(parent.pid) or process_kind(parent))
            return self.FORKED
        return kind

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ProcessCpu:
        self._sample(initial=True)
        self.first_seen.clear()  # kinds present before the block did not start in it
        self._thread = threading.Thread(target=self._run, name="cifar-ray-bench-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self) -> dict[str, float]:
        """CPU seconds per kind spent in the block, largest first."""
        totals: dict[str, float] = collections.Counter()
        for pid, used in self.last.items():
            kind = self.kind.get(pid, "gone")
            totals[self.parent_kind[pid] if kind == self.FORKED else kind] += used - self.start[pid]
        return dict(sorted(((k, v) for k, v in totals.items() if v > 0.005), key=lambda kv: -kv[1]))


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
