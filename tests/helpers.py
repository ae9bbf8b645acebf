"""Helpers shared by several test modules: the one place test modules import from (no test_*.py imports another;
tests/test_layers.py holds that). Fault injection lives apart, in tests/faults.py.

- Run folders written by hand exactly as training writes them: the "bs-workers" run (`make_run`, its pieces
  `write_sweep`, `write_trial`, `healthy_epochs`) and a factorial run (`make_factorial`), for the report's tests.
  Trials that `write_correct` gives a per-image log (test_correct.json) are as new versions write them; without
  one, as older versions did.
- `shared_ddp_run`: the suite's one TorchTrainer run of the DDP checks.
- `report_text`: README.md's text for a built report, its plots not drawn.
- `wait_for`: poll a condition while a real run goes on.
- `COMPUTED`: the epoch metrics a trial computes, equal from run to run.
- `fake_gpus`: this machine's GPUs as torch.cuda reports them, monkeypatched (no GPU here).
- `FRESH`, `in_a_fresh_process`: fresh processes that start in a fraction of a second (forked from a server that
  imported torch once).
- `two_gloo_ranks`: what a function finds on each of two gloo ranks, a fresh process each.
- `assert_tensorboard_holds_every_epoch`: a trial folder's TensorBoard files against its metrics.jsonl.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

import numpy
import pytest
import torch

from cifar_ray.cluster import checks as ddp_checks
from cifar_ray.cluster.live_view import TUNE_TAG
from cifar_ray.core import runlog
from cifar_ray.core.checkpoints import complete_checkpoints
from cifar_ray.core.storage import StoragePath
from cifar_ray.report.document import to_markdown
from cifar_ray.report.sections import document
from cifar_ray.training import checks as check

CPU = torch.device("cpu")


# The report's "bs-workers" run.
GRID = {"batch_size": [64, 128], "workers": [1, 2]}
SEEDS = [0, 1]
EPOCHS = 4
STARTED = "2025-03-04T05:06:07+0000"

# Trials in sweep order: batch_size x workers x seed. Index 3 overfits; 5 fails, 6 diverges, 7 never starts.
OVERFIT, FAILED, DIVERGED, PENDING = 3, 5, 6, 7


def trial_name(index: int) -> str:
    return f"trial_{index:03d}"


def combos() -> list[dict]:
    return [
        {"batch_size": b, "workers": w, "seed": s}
        for b, w, s in itertools.product(GRID["batch_size"], GRID["workers"], SEEDS)
    ]


def healthy_epochs(i: int, swept: dict, n: int = EPOCHS) -> list[dict]:
    """Falling losses, rising accuracy; numbers differ per trial so aggregates are non-trivial. A second worker
    lowers the peak per worker but raises the total (each worker holds a model and its own half batch)."""
    bs, w, seed = swept["batch_size"], swept["workers"], swept["seed"]
    epoch_time = 12.0 / w * (64 / bs) + 0.3 * seed + 0.01 * i
    rows = []
    for e in range(1, n + 1):
        test_acc = 0.35 + 0.09 * e + 0.013 * i - (0.12 if e == n and i == 1 else 0.0)
        per_worker = 3.0 * bs / w + 100 + 7 * seed + e
        rows.append(
            {
                "epoch": e,
                "train_loss": 2.0 - 0.3 * e - 0.01 * i,
                "train_acc": 0.40 + 0.10 * e + 0.011 * i,
                "test_loss": 2.1 - 0.25 * e - 0.01 * i,
                "test_acc": test_acc,
                "train_eval_loss": 2.0 - 0.26 * e - 0.01 * i,
                "train_eval_acc": test_acc + 0.02 + 0.001 * e,
                "epoch_time_s": epoch_time + 0.05 * e,
                "samples_per_s": 50000 / (epoch_time + 0.05 * e),
                "peak_mem_mb": per_worker,
                "peak_mem_total_mb": w * per_worker - 5 * (w - 1),  # the other worker peaks 5 MB lower
                "lr": 0.05,
                "amp_skipped_steps": 0,
                "time_data_s": 0.1 * epoch_time,
                "time_compute_s": 0.7 * epoch_time,
                "future_key": "ignored",
            }
        )
    return rows


def overfitting_epochs(i: int, swept: dict) -> list[dict]:
    rows = healthy_epochs(i, swept)
    for row, train, train_eval, test in zip(rows, [1.4, 1.0, 0.6, 0.3], [1.3, 0.9, 0.5, 0.25], [1.5, 1.2, 1.3, 1.45]):
        row["train_loss"], row["train_eval_loss"], row["test_loss"] = train, train_eval, test
    return rows


def write_trial(
    run_dir: Path,
    index: int,
    swept: dict,
    status: str,
    epochs: list[dict],
    error: str | None = None,
    diverged_epoch: int | None = None,
    gpus: bool = True,
    planned: int = EPOCHS,
) -> None:
    folder = run_dir / trial_name(index)
    folder.mkdir(parents=True)
    config = {
        "model": "simple_cnn",
        "optimizer": "momentum",
        "epochs": planned,
        "accum_steps": 2,
        "amp": "off",
        "backend": "nccl",
        "strategy": "ddp",
        "data_dir": "/data/somewhere",
        "train_eval_size": 5000,
    } | swept
    system = (
        {
            "device_type": "cuda",
            "device_name": "NVIDIA H100 80GB HBM3",
            "devices_per_worker": 1,
            "world_size": swept.get("workers", 1),
            "num_gpus": swept.get("workers", 1),
        }
        if gpus
        else {
            "device_type": "cpu",
            "device_name": "Test CPU",
            "devices_per_worker": 1,
            "world_size": swept.get("workers", 1),
            "num_gpus": 0,
        }
    )
    meta = {
        "name": trial_name(index),
        "index": index,
        "swept": swept,
        "config": config,
        "status": status,
        "error": error,
        "diverged_epoch": diverged_epoch,
        "system": system,
        "started_at": STARTED,
        "finished_at": STARTED,
    }
    (folder / "trial.json").write_text(json.dumps(meta, indent=2))
    if epochs:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in epochs))


def write_correct(run_dir: Path, index: int | str, correct, epoch: int) -> None:
    """Trial `index`'s (or the trial folder named so) per-image log as training writes it: `correct`, one bool per
    test image in dataset order."""
    bits = numpy.packbits(numpy.asarray(correct, dtype=bool)).tobytes()
    folder = run_dir / (index if isinstance(index, str) else trial_name(index))
    runlog.write_correct_images(folder, runlog.CorrectImages(epoch, len(correct), bits))


def ranked_correct(accuracy: float, images: int) -> numpy.ndarray:
    """The first round(accuracy x images) test images right, the rest wrong: trials so logged rank the images alike
    (a more accurate one gets right every image a less accurate one does), so any two disagree on the fewest images
    their accuracies allow."""
    return numpy.arange(images) < round(accuracy * images)


def write_sweep(run_dir: Path, names: list[str], grid: dict = GRID, repeats: int = 2, **extra) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    sweep = {
        "name": "bs-workers",
        "description": "Does a bigger batch or more workers train faster at equal accuracy?",
        "metric": "test_acc",
        "mode": "max",
        "grid": grid,
        "base": {"epochs": EPOCHS},
        "repeats": repeats,
        "trials": names,
        "started_at": STARTED,
        "finished_at": "2025-03-04T06:08:09+0000",
        "wall_time_s": 3722.0,
        "git_revision": "abc1234def",
        "host": {"hostname": "node1", "cpu_model": "Test CPU", "cpu_count": 16, "platform": "Linux"},
        "versions": {"python": "3.11.9", "torch": "2.14.1", "ray": "2.60.0", "cuda": "12.8"},
        "cluster": {"cpus": 16.0, "gpus": 4.0, "nodes": 1},
    } | extra
    (run_dir / "sweep.json").write_text(json.dumps(sweep, indent=2))


def make_run(run_dir: Path) -> dict[int, list[dict]]:
    """The 2x2 grid with 2 seeds; returns the epochs written per trial index."""
    written = {}
    all_swept = combos()
    write_sweep(run_dir, [trial_name(i) for i in range(len(all_swept))])
    for i, swept in enumerate(all_swept):
        if i == OVERFIT:
            epochs = overfitting_epochs(i, swept)
            write_trial(run_dir, i, swept, "finished", epochs)
        elif i == FAILED:
            epochs = healthy_epochs(i, swept, n=1)
            write_trial(
                run_dir,
                i,
                swept,
                "failed",
                epochs,
                error="Traceback (most recent call last):\n  File x\nRuntimeError: boom in the loader",
            )
        elif i == DIVERGED:
            epochs = healthy_epochs(i, swept, n=2)
            epochs[1] |= {"train_loss": None, "test_loss": None, "test_acc": 0.1}
            write_trial(run_dir, i, swept, "diverged", epochs, error="loss is nan", diverged_epoch=2)
        elif i == PENDING:
            epochs = []
            write_trial(run_dir, i, swept, "pending", epochs)
        else:
            epochs = healthy_epochs(i, swept)
            write_trial(run_dir, i, swept, "finished", epochs)
        written[i] = epochs
    return written


# A factorial run for the report's statistics.
FACTORIAL_GRID = {"optimizer": ["momentum", "adam"], "workers": [1, 2], "amp": ["off", "bf16"]}
FACTORIAL_SEEDS = [0, 1, 2]
FACTORIAL_NOISE = 0.002  # seed-to-seed std of the final test accuracy: 0.2 pp
FACTORIAL_EPOCHS = 3


def factorial_epochs(acc: float, loss: float, epoch_time: float) -> list[dict]:
    """Three epochs ending at the given final test accuracy, test loss and epoch time."""
    return [
        {
            "epoch": e,
            "train_loss": loss + 0.3 * (3 - e),
            "train_acc": acc - 0.04 * (3 - e),
            "test_loss": loss + 0.2 * (3 - e),
            "test_acc": acc - 0.05 * (3 - e),
            "epoch_time_s": epoch_time,
            "samples_per_s": 50000 / epoch_time,
            "peak_mem_mb": 500.0,
            "lr": 0.05,
        }
        for e in range(1, FACTORIAL_EPOCHS + 1)
    ]


def make_factorial(run_dir: Path, grid: dict = FACTORIAL_GRID, accuracy=None, loss=None, status=None, **sweep) -> dict:
    """optimizer x workers x amp x 3 seeds on the 10,000 test images, each trial with its per-image log
    (ranked_correct). Default truth: adam +10 pp, workers=2 +1 pp, amp nothing, plus 0.2 pp of per-trial noise;
    workers=2 halves the epoch time. Returns the final test accuracy per trial."""
    rng = random.Random(7)
    combos = [
        dict(zip(grid, values)) | {"seed": seed}
        for values in itertools.product(*grid.values())
        for seed in FACTORIAL_SEEDS
    ]
    write_sweep(
        run_dir,
        [trial_name(i) for i in range(len(combos))],
        grid=grid,
        repeats=len(FACTORIAL_SEEDS),
        **{"name": "factorial", "description": "A hand-made factorial run."} | sweep,
    )
    finals = {}
    for i, swept in enumerate(combos):
        acc = (accuracy or (lambda s: 0.70 + 0.10 * (s.get("optimizer") == "adam") + 0.01 * (s["workers"] == 2)))(swept)
        acc = round(acc + rng.gauss(0.0, FACTORIAL_NOISE), 4)  # whole images of the 10,000 logged right
        final_loss = loss(swept) if loss else 1.0 - acc
        epoch_time = 10.0 / swept["workers"] + 0.01 * swept["seed"]
        finals[i] = acc
        write_trial(
            run_dir,
            i,
            swept,
            (status or (lambda s: "finished"))(swept),
            factorial_epochs(acc, final_loss, epoch_time),
            gpus=False,
            planned=FACTORIAL_EPOCHS,
        )
        write_correct(run_dir, i, ranked_correct(acc, 10_000), FACTORIAL_EPOCHS)
    return finals


def report_text(report) -> str:
    """The README.md that `export(report, out)` writes for a built report, less its figures: for the tests of its
    text, as drawing costs ~0.3 s a plot (tests/test_report.py holds the two equal; the tests of the plots and of the
    written files write them)."""
    return to_markdown(document(report, {}))


_check_ddp = ddp_checks.check_ddp  # bound at import: test_check.py swaps ddp_checks.check_ddp for shared_ddp_run


@functools.cache
def shared_ddp_run() -> tuple[check.CheckResult, check.CheckResult]:
    """The suite's ONE TorchTrainer run (2 gloo workers, float64, 4 steps): the parameter and the
    metric check of test_equivalence.py come from it, and test_check.py's `cifar-ray check` test reuses it."""
    return _check_ddp(CPU, workers=2, n_steps=4)


# The longest wait for a sweep's training to get somewhere (an epoch, a trial's end): a deadline that ends a hang,
# never a speed. Beside two busy loops and other sessions' sweeps (load average 30 on 2 cores) an epoch of the
# reliability tests took 4 to 5 min and a 2-trial sweep 20 min.
PROGRESS_S = 1800


def stored_checkpoint(trial_dir: Path) -> bool:
    """Whether a trial folder holds a whole checkpoint (core/checkpoints): what a restart continues from."""
    return bool(complete_checkpoints(StoragePath.of(trial_dir)))


def logged_and_checkpointed(trial_dir: Path) -> bool:
    """A trial's epoch logged and its checkpoint stored whole. Rank 0 logs before it stores: a kill or a stop between
    the two (beside two busy loops) rightly trains that epoch again, from scratch."""
    return bool(runlog.read_epochs(trial_dir)) and stored_checkpoint(trial_dir)


def reserved_placement_groups() -> set[str]:
    """The ids of the placement groups on the session's Ray that are not removed (none before Ray starts)."""
    import ray
    from ray.util.placement_group import placement_group_table

    if not ray.is_initialized():
        return set()
    return {key for key, group in placement_group_table().items() if group["state"] != "REMOVED"}


def wait_for(condition, timeout: float, what: str, proc=None) -> None:
    """Until `condition()` holds; TimeoutError after `timeout` s, or at once when `proc` (a Popen) has ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (rc {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


# What the trial computes; times, timestamps and memory differ from run to run by nature.
COMPUTED = (
    "epoch",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "train_eval_loss",
    "train_eval_acc",
    "train_samples",
    "lr_last",
    "lr_max",
    "peak_lr",
    "amp_skipped_steps",
    "allreduce_bytes_per_step",
    "diverged",
)


def fake_gpus(monkeypatch, *gpus: tuple[str, tuple[int, int]]) -> None:
    """This machine's GPUs as torch.cuda reports them: (name, compute capability) per index; the current
    device is GPU 0. The functions take an index, a torch.device or nothing (the current device), as torch's do."""

    def index_of(device=None) -> int:
        if isinstance(device, int):
            return device
        return 0 if device is None else torch.device(device).index or 0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(gpus))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpus[index_of(device)][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpus[index_of(device)][1])


# multiprocessing's forkserver: its server imports torch, the training code and what the test modules whose functions
# run in a child import (the command line, the report: pandas) once, ~4 s; then each process is forked from it in a
# fraction of a second, where a spawned one imported them again. As fresh as a spawned one: the server imports and
# never trains (nor starts a thread). It ends with the test session's process.
FRESH = "forkserver"
multiprocessing.get_context(FRESH).set_forkserver_preload(
    ["helpers", "cifar_ray.training.loop", "cifar_ray.cli", "cifar_ray.report"]
)


def in_a_fresh_process(function, *args):
    """`function(*args)` (a module-level function) in a fresh process: nothing an earlier test did here (memory
    freed but kept resident, a process group, torch's state) reaches it. Its result, or its exception."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(FRESH)) as child:
        return child.submit(function, *args).result()


def _gloo_rank(rank: int, world: int, folder: str, findings) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(findings(rank, world, folder)))
    dist.destroy_process_group()


def two_gloo_ranks(findings, folder: Path) -> list[dict]:
    """`findings(rank, world, folder)` (a module-level function, returning JSON) run on two gloo ranks of one
    process group, a fresh process each; its results in rank order."""
    import torch.multiprocessing as mp

    mp.start_processes(_gloo_rank, args=(2, str(folder), findings), nprocs=2, join=True, start_method=FRESH)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def tensorboard_scalars(trial_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the trial folder's event files, as TensorBoard's own reader sees them: tag -> (step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(trial_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def epochs_in_metrics(trial_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What metrics.jsonl holds of each numeric epoch metric, as (epoch, value)."""
    by_metric: dict[str, list[tuple[int, float]]] = {}
    for row in runlog.read_epochs(trial_dir):
        for key in runlog.EPOCH_METRICS:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                by_metric.setdefault(key, []).append((row["epoch"], float(value)))
    return by_metric


def assert_tensorboard_holds_every_epoch(trial_dir: Path) -> None:
    scalars, logged = tensorboard_scalars(trial_dir), epochs_in_metrics(trial_dir)
    assert logged, f"{trial_dir} logged no epoch"
    for metric, rows in logged.items():
        seen = scalars.get(TUNE_TAG.format(metric))
        assert seen is not None, (trial_dir.name, metric, sorted(scalars))
        # A driver killed within a flush of a result leaves some of its scalars: the resume writes that epoch whole
        # again, the same points twice. A step with two values stays twice and fails.
        seen = sorted(set(seen))
        assert [step for step, _ in seen] == [epoch for epoch, _ in rows], (trial_dir.name, metric, seen, rows)
        assert [value for _, value in seen] == pytest.approx([value for _, value in rows], rel=1e-6), metric


# Hand-made runs for the report's effects: interactions (accuracy) and costs (time and memory).
INTERACTION_GRID = {"optimizer": ["momentum", "adam"], "batch_size": [64, 512]}
INTERACTION_NOISE = 0.002  # seed-to-seed std of the final test accuracy: 0.2 pp


def grid_run(
    run_dir: Path, seeds: int, accuracy, grid: dict = INTERACTION_GRID, noise: float = INTERACTION_NOISE
) -> Path:
    """Every configuration of `grid` x `seeds` seeds, each finished at accuracy(swept) plus N(0, noise), in whole
    images of the 10,000 it logs per image (ranked_correct: any two disagree on the fewest images they can)."""
    rng = random.Random(3)
    combos = [
        dict(zip(grid, values)) | ({"seed": seed} if seeds > 1 else {})
        for values in itertools.product(*grid.values())
        for seed in range(seeds)
    ]
    write_sweep(
        run_dir, [trial_name(i) for i in range(len(combos))], grid=grid, repeats=seeds, name="grid", description=""
    )
    for i, swept in enumerate(combos):
        acc = round(accuracy(swept) + rng.gauss(0.0, noise), 4)
        write_trial(
            run_dir, i, swept, "finished", factorial_epochs(acc, 1 - acc, 10.0), gpus=False, planned=FACTORIAL_EPOCHS
        )
        write_correct(run_dir, i, ranked_correct(acc, 10_000), FACTORIAL_EPOCHS)
    return run_dir


def epoch_rows(times: list[float], acc: float = 0.8, memory: float = 1000.0) -> list[dict]:
    return [
        {
            "epoch": e,
            "train_loss": 1.0,
            "train_acc": acc,
            "test_loss": 1.0,
            "test_acc": acc,
            "epoch_time_s": t,
            "samples_per_s": 50000 / t,
            "peak_mem_mb": memory,
            "peak_mem_total_mb": memory,
        }
        for e, t in enumerate(times, start=1)
    ]


def cost_run(run_dir: Path, trials: list[dict], grid: dict, extra_planned: int = 0) -> Path:
    """Trials as dicts: swept (the grid values and seed), times (per epoch), and optionally acc, memory, status,
    meta (merged into trial.json). `extra_planned` more trials are listed in sweep.json but never written."""
    names = [trial_name(i) for i in range(len(trials) + extra_planned)]
    write_sweep(run_dir, names, grid=grid, repeats=len({t["swept"]["seed"] for t in trials}), name="costs")
    for i, t in enumerate(trials):
        rows = epoch_rows(t["times"], t.get("acc", 0.8), t.get("memory", 1000.0))
        status = t.get("status", "finished")
        if status != "finished":
            rows = rows[:1]
        write_trial(run_dir, i, t["swept"], status, rows, gpus=False, planned=len(t["times"]))
        if "meta" in t:
            path = run_dir / trial_name(i) / "trial.json"
            meta = json.loads(path.read_text())
            for key, value in t["meta"].items():
                meta[key] = meta[key] | value if isinstance(value, dict) else value
            path.write_text(json.dumps(meta))
    return run_dir


# Golden files: the rendered text of a few reports, kept whole so that a wording change is one reviewed diff.
# `python tests/regenerate_golden.py` writes them all (and reports/quickstart); tests/test_golden.py compares.
GOLDEN_DIR = Path(__file__).parent / "golden"


def golden_texts(scratch: Path) -> dict[str, str]:
    """Each golden file's name -> the text the code renders now: the many-factor report of make_factorial
    (optimizer x workers x amp x 3 seeds), its figures left out."""
    from cifar_ray.report import build_report

    run_dir = scratch / "factorial"
    make_factorial(run_dir)
    return {"factorial.md": report_text(build_report(run_dir))}
