"""A run folder's logs as pandas frames: epochs (one row per trial and epoch) and trials (one row per trial: swept
values, final and best metrics, costs, status, overfitting), the sweep's grid and the baseline of each factor.
Only the logs are read.

Peak memory comes twice: per worker (the largest peak of one worker process, or one GPU: what must fit on one device)
and total over workers (the sum of every worker's peak: what a configuration occupies)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..core.config import TrainConfig
from ..core.datasets import test_images
from ..core.errors import ConfigError
from ..core.runlog import (
    ALLREDUCE_ESTIMATE_KEY,
    BREAKDOWN_KEYS,
    EPOCH_METRICS,
    OLD_EPOCH_METRICS,
    SWEEP_FILE,
    TRIAL_FILE,
    RunLog,
    TrialLog,
    Where,
    incomplete,
    load_run,
    warm_slice,
)
from ..core.runlog import time_per_epoch as runlog_time_per_epoch
from .format import fmt_value, same_value
from .metrics import INCOMPLETE
from .stats import TRAIN_COLUMNS, Overfit, train_basis, trial_overfitting
from .testset import ImageScores, unpack

# The epochs frame's columns after `epoch`: runlog.EPOCH_METRICS in its order, less the epoch itself, the step-time
# breakdown (its columns follow, those logged) and what the report does not read (_UNREAD).
_UNREAD = (
    "epoch",
    "train_time_s",
    "train_samples",
    "end_unix",
    "diverged",
    "peak_source",
    *BREAKDOWN_KEYS,
    ALLREDUCE_ESTIMATE_KEY,
)
assert set(_UNREAD) <= set(EPOCH_METRICS)
EPOCH_KEYS = tuple(key for key in EPOCH_METRICS if key not in _UNREAD)
# Step-time breakdown keys (runlog.BREAKDOWN_KEYS) come in that order; other `time_*_s` keys follow sorted.


def warm_epochs(epochs: pd.DataFrame) -> pd.DataFrame:
    """A trial's epochs (in epoch order) that runlog.TIME_PER_EPOCH_RULE reads: after its first, or its only one.
    Throughput, MFU and the step-time breakdown are means over the same epochs."""
    return epochs.iloc[warm_slice(len(epochs))]


def time_per_epoch(epochs: pd.DataFrame) -> float:
    """runlog.TIME_PER_EPOCH_RULE over a trial's epochs (in epoch order)."""
    return runlog_time_per_epoch([None if math.isnan(t) else float(t) for t in epochs["epoch_time_s"]])


# What peak memory per worker measures, by the trials' device type (trial.json: system.device_type).
MEMORY_MEASURES = {
    "cpu": "peak RSS of one worker process (the whole process: Python, torch, data)",
    "cuda": "peak memory allocated by torch on one GPU",
}


def load(run_dir: Where) -> RunLog:
    """The run's logs; ConfigError when the folder is missing or holds no trial."""
    try:
        run = load_run(run_dir, per_image=True, damaged=True)
    except FileNotFoundError:
        raise ConfigError(
            f"no run folder at {run_dir}: pass the folder holding {SWEEP_FILE} (<storage>/<sweep name>)"
        ) from None
    if not run.trials:
        listed = len(run.sweep.get("trials", []))
        what = f"{SWEEP_FILE} lists {listed} trial(s) but none has started" if run.sweep else f"no {SWEEP_FILE} either"
        raise ConfigError(f"no trials in {run.path}: no <trial>/{TRIAL_FILE} found ({what}); nothing to report")
    return run


def sweep_grid(sweep: dict) -> dict[str, list]:
    """The sweep's grid: key -> its values (a single value as a list of one)."""
    raw = sweep.get("grid") or {}
    return {key: list(values) if isinstance(values, list) else [values] for key, values in raw.items()}


def resolve_baseline(sweep: dict, factors: list[str], grid: dict[str, list], baseline: dict | None) -> dict[str, Any]:
    """Baseline value per factor: the first grid value unless `baseline` names another one."""
    chosen = {key: grid[key][0] for key in factors if grid[key]}
    for key, value in (baseline or {}).items():
        if key not in factors:
            swept = ", ".join(factors) if factors else "none"
            raise ConfigError(
                f"--baseline {key}={fmt_value(value)}: '{key}' is not a swept factor of "
                f"sweep '{sweep.get('name', '?')}'; swept keys: {swept}"
            )
        match = [v for v in grid[key] if same_value(v, value)]
        if not match:
            allowed = ", ".join(fmt_value(v) for v in grid[key])
            raise ConfigError(f"--baseline {key}={fmt_value(value)}: value not in the grid; allowed: {allowed}")
        chosen[key] = match[0]
    return chosen


def breakdown_keys(run: RunLog) -> list[str]:
    present = {k for t in run.trials for row in t.epochs for k in row if k.startswith("time_") and k.endswith("_s")}
    return [k for k in BREAKDOWN_KEYS if k in present] + sorted(present - set(BREAKDOWN_KEYS))


def epochs_frame(run: RunLog, breakdown: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (trial, epoch); known numeric keys only (an older log's where it has them), null/non-numeric
    values as NaN."""
    rows = [{"trial": t.name, **row} for t in run.trials for row in t.epochs]
    old = [key for key in OLD_EPOCH_METRICS if any(key in row for row in rows)]
    columns = ["trial", "epoch", *EPOCH_KEYS, *breakdown, *old]
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for column in columns[1:]:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    frame["trial"] = frame["trial"].astype(object)
    return frame


def memory_measure(run: RunLog) -> str:
    """What peak memory per worker measures, worded from the trials' device types (trial.json: system)."""
    types = sorted({(t.record.system or {}).get("device_type") for t in run.trials} & set(MEMORY_MEASURES))
    if not types:
        return "the peak memory of one worker as logged (peak_mem_mb; the trials recorded no device)"
    if len(types) == 1:
        return MEMORY_MEASURES[types[0]]
    return "; ".join(f"{MEMORY_MEASURES[kind]} on {'CPU' if kind == 'cpu' else 'GPU'} trials" for kind in types)


def _device(system: dict) -> str:
    if not system:
        return ""
    name = system.get("device_name") or ""
    if system.get("device_type") == "cuda":
        return name or "GPU"
    return f"CPU ({name})" if name else "CPU"


def trial_value(trial: TrialLog, key: str) -> Any:
    """A trial's value of `key`: its swept value (a grid label such as "adam (lr=0.002)"), else its config's."""
    return trial.swept.get(key, trial.config.get(key))


def config_value(config: dict, key: str) -> Any:
    """A config's `key`, or TrainConfig's default where the logged config lacks it (logs of older versions)."""
    return config[key] if key in config else TrainConfig.model_fields[key].default


def trial_test_images(config: dict) -> int | None:
    """The test images a trial's accuracy is measured on, from its logged config (dataset, test_subset): the logs
    record no count; None for a dataset this version does not know."""
    try:
        return test_images(config_value(config, "dataset"), int(config_value(config, "test_subset")))
    except (KeyError, TypeError, ValueError):
        return None


def image_scores(run: RunLog) -> dict[str, ImageScores]:
    """Trial name -> which test images its final evaluation got right, for the trials that logged it at their last
    logged epoch (a record of another epoch is not the evaluation behind their final accuracy)."""
    return {
        trial.name: ImageScores(str(config_value(trial.config, "dataset")), unpack(trial.correct))
        for trial in run.trials
        if trial.correct is not None and trial.epochs and trial.correct.epoch == trial.epochs[-1]["epoch"]
    }


def _outcome(status: str, epochs_done: int, planned: Any) -> str:
    """The status, or INCOMPLETE for a trial marked finished with fewer epochs logged than planned."""
    return INCOMPLETE if incomplete(status, epochs_done, planned) else status


def _trial_row(trial, e: pd.DataFrame, keys: list[str], breakdown: Sequence[str], over: Overfit | None) -> dict:
    cfg = trial.config
    row: dict[str, Any] = {"trial": trial.name, "status": trial.status}
    for key in keys:
        row[key] = trial_value(trial, key)
    row["workers"] = cfg.get("workers")
    batch, accum = cfg.get("batch_size"), cfg.get("accum_steps", 1)
    row["effective_batch"] = batch * accum if isinstance(batch, int) and isinstance(accum, int) else None
    row["epochs_done"] = len(e)
    row["epochs_planned"] = cfg.get("epochs")
    row["outcome"] = _outcome(trial.status, len(e), row["epochs_planned"])
    row["test_images"] = trial_test_images(cfg)

    def final(column: str) -> float:
        return float(e[column].iloc[-1]) if len(e) else math.nan

    row["final_test_acc"] = final("test_acc")
    acc = e["test_acc"]
    if acc.notna().any():
        best = acc.idxmax()
        row["best_test_acc"], row["best_epoch"] = float(acc[best]), int(e.loc[best, "epoch"])
    else:
        row["best_test_acc"], row["best_epoch"] = math.nan, None
    row["final_train_acc"] = final("train_acc")
    row["final_train_eval_acc"] = final("train_eval_acc")
    row["train_basis"] = train_basis(e)
    row["gap"] = final(TRAIN_COLUMNS[row["train_basis"]][1]) - row["final_test_acc"]
    row["final_train_loss"] = final("train_loss")
    row["final_train_eval_loss"] = final("train_eval_loss")
    row["final_test_loss"] = final("test_loss")
    row["train_time_s"] = float(e["epoch_time_s"].sum(min_count=1))
    row["time_per_epoch_s"] = time_per_epoch(e)
    warm = warm_epochs(e)  # throughput and MFU over the epochs time/epoch takes
    row["samples_per_s"] = float(warm["samples_per_s"].mean())
    row["flops_per_s"] = float(warm["flops_per_s"].mean())  # NaN for runs logged before FLOPs were counted
    row["mfu"] = float(warm["mfu"].mean())
    row["peak_source"] = trial.epochs[-1].get("peak_source") if trial.epochs else None
    row["peak_mem_mb"] = float(e["peak_mem_mb"].max())
    row["peak_mem_total_mb"] = float(e["peak_mem_total_mb"].max())
    for key in breakdown:
        row[key] = float(warm_epochs(e)[key].mean())
    row["overfitting"] = over is not None
    row["overfit_epoch"] = over.onset if over else None
    row["error"] = trial.record.error
    row["diverged_epoch"] = trial.record.diverged_epoch
    system = trial.record.system or {}
    row["device"] = _device(system)
    row["gpus"] = system.get("num_gpus") if system.get("device_type") == "cuda" else 0
    return row


def target_times(trials: pd.DataFrame, epochs: pd.DataFrame, target: float) -> pd.DataFrame:
    """`trials` with each one's time to `target` test accuracy: time_to_target_s, the wall time of its epochs up to
    and including the first whose test accuracy reached it (training and evaluation, as epoch_time_s logs them,
    from the first epoch's start), epochs_to_target that epoch; both NaN for a trial that never reached it
    (censored: reached_target False)."""
    times, reached_at = [], []
    for name in trials["trial"]:
        e = epochs[epochs["trial"] == name].sort_values("epoch")
        hit = e[e["test_acc"] >= target]
        if len(hit):
            first = int(hit["epoch"].iloc[0])
            times.append(float(e.loc[e["epoch"] <= first, "epoch_time_s"].sum()))
            reached_at.append(first)
        else:
            times.append(math.nan)
            reached_at.append(math.nan)
    return trials.assign(
        time_to_target_s=times, epochs_to_target=reached_at, reached_target=[not math.isnan(t) for t in times]
    )


def trial_frame(
    run: RunLog, epochs: pd.DataFrame, keys: list[str], breakdown: Sequence[str]
) -> tuple[pd.DataFrame, dict[str, Overfit]]:
    """One row per trial, in sweep order: swept values, final/best metrics, costs, status; and the trials that
    OVERFIT_RULE flags (name -> its Overfit), found once here for the frame, the Markdown and the exports."""
    rows, overfits = [], {}
    for trial in run.trials:
        e = epochs[epochs["trial"] == trial.name].sort_values("epoch").reset_index(drop=True)
        over = trial_overfitting(e)
        if over:
            overfits[trial.name] = over
        rows.append(_trial_row(trial, e, keys, breakdown, over))
    frame = pd.DataFrame(rows)
    for column in (
        "best_epoch",
        "overfit_epoch",
        "diverged_epoch",
        "epochs_planned",
        "effective_batch",
        "workers",
        "gpus",
        "test_images",
    ):
        numbers = pd.to_numeric(frame[column], errors="coerce")
        try:
            frame[column] = numbers.astype("Int64")
        except (TypeError, ValueError):  # not whole numbers: keep them as floats
            frame[column] = numbers
    return frame, overfits
