"""Turn a run's logs into a report: Markdown with PNG plots, or CSV / JSON tables.

    write_report(run_dir)                 -> reports/<sweep name>/README.md (+ *.png beside it)
    write_report(run_dir, fmt="csv")      -> reports/<sweep name>/trials.csv (+ factor_<key>.csv, effect_<key>.csv, ...)
    write_report(run_dir, fmt="json")     -> reports/<sweep name>/report.json

Pipeline: load_run() -> pandas frames (epochs, trials, per-factor groups, configurations) ->
tables -> plots -> Markdown. Only the logs are read, never the clock or the current checkout: the
same logs give byte-identical files.

Aggregates (factor tables, configurations, findings) use finished trials only; failed, diverged,
out-of-memory and unfinished trials appear in the trial table and are listed with their reason.
A factor's effect is measured on matched pairs (trials that differ only in that factor, seed included)
with a Student-t 95 % interval; per-value means pool the other factors and are shown as means only.
"Best" follows the sweep file's metric and mode.
Peak memory comes twice: per worker (the largest peak of one worker process, or one GPU: what must fit on one device)
and total over workers (the sum of every worker's peak: what a configuration occupies); "least memory" uses the total.
The train/test gap, overfitting and the train loss curve read the training subset evaluated like the test set
(train_eval_*) where logged, else the running train metrics (means over the epoch, augmentation and dropout on).
In CSV/JSON, accuracies stay fractions 0-1 as in metrics.jsonl; Markdown shows percentages.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .config import ConfigError
from .runlog import BREAKDOWN_KEYS, SWEEP_FILE, TRIAL_FILE, RunLog, Where, load_run

FORMATS = ("md", "csv", "json")
EPOCH_KEYS = (
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "train_eval_loss",
    "train_eval_acc",
    "epoch_time_s",
    "samples_per_s",
    "peak_mem_mb",
    "peak_mem_total_mb",
    "lr",
    "peak_lr",
    "amp_skipped_steps",
    "allreduce_bytes_per_step",
)
# Step-time breakdown keys (runlog.BREAKDOWN_KEYS) come in that order; other `time_*_s` keys follow sorted.

OVERFIT_RISE = 0.02
OVERFIT_RULE = (
    "A trial is flagged as overfitting when, after the epoch m with its lowest test loss, a later "
    f"epoch has a test loss more than {OVERFIT_RISE:.0%} above that minimum while its train loss is "
    "below the train loss at epoch m (still falling); the first such epoch is reported as the onset. "
    "Train loss here is the eval train loss where the trial logged it, else the running one."
)

# A trial's train metrics, by basis: "eval" evaluates the first train_eval_size training images after the epoch
# exactly like the test set; "running" are the means over the epoch's steps. Gap, overfitting and the train loss
# curve read "eval" where logged (train_basis).
TRAIN_COLUMNS = {"eval": ("train_eval_loss", "train_eval_acc"), "running": ("train_loss", "train_acc")}
RUNNING_NOTE = (
    "Running train accuracy and loss are means over the epoch's training steps, taken with augmentation "
    "and dropout on while the weights still change, so they trail the model at the end of the epoch and "
    "can read below test accuracy: not a like-for-like comparison with the test metrics."
)
EVAL_NOTE = (
    "Eval train accuracy and loss evaluate the first `train_eval_size` training images{size} after each epoch "
    "exactly as the test set is (eval mode, no augmentation, the same code): the like-for-like comparison."
)
# What peak_mem_mb measures, by the trials' device type (trial.json: system.device_type).
MEMORY_MEASURES = {
    "cpu": "peak RSS of one worker process (the whole process: Python, torch, data)",
    "cuda": "peak memory allocated by torch on one GPU",
}


@dataclass(frozen=True)
class Metric:
    column: str
    label: str
    better: str  # "max" or "min"
    kind: str  # "acc": fraction shown as %, deltas in percentage points; "cost", "loss": deltas in %


FACTOR_METRICS = (
    Metric("final_test_acc", "final test acc (%)", "max", "acc"),
    Metric("best_test_acc", "best test acc (%)", "max", "acc"),
    Metric("time_per_epoch_s", "time/epoch (s)", "min", "cost"),
    Metric("samples_per_s", "throughput (samples/s)", "max", "cost"),
    Metric("peak_mem_mb", "peak mem per worker (MB)", "min", "cost"),
    Metric("peak_mem_total_mb", "peak mem, total over workers (MB)", "min", "cost"),
)
PAIRED_METRICS = (FACTOR_METRICS[0], FACTOR_METRICS[2])  # final test acc (Δ in pp), time/epoch (Δ in s)
# The sweep file's `metric` (sweep.METRICS) -> the trial column that ranks trials by it: epoch metrics at the
# last epoch (final_<metric>), costs aggregated over epochs as in the factor tables.
OBJECTIVES = {
    "test_acc": FACTOR_METRICS[0],
    "train_acc": Metric("final_train_acc", "final running train acc (%)", "max", "acc"),
    "test_loss": Metric("final_test_loss", "final test loss", "min", "loss"),
    "train_loss": Metric("final_train_loss", "final running train loss", "min", "loss"),
    "epoch_time_s": FACTOR_METRICS[2],
    "samples_per_s": FACTOR_METRICS[3],
    "peak_mem_mb": FACTOR_METRICS[4],
}


@dataclass(frozen=True)
class Overfit:
    min_epoch: int
    test_min: float
    train_at_min: float
    onset: int
    test_at_onset: float
    train_at_onset: float


@dataclass
class Report:
    run: RunLog
    name: str
    factors: list[str]  # grid keys other than seed, in grid order
    grid: dict[str, list]  # factor -> its values, in grid order
    baseline: dict[str, Any]  # factor -> baseline value (a grid value)
    seed_column: bool  # trials differ by seed (repeats > 1 or seed in the grid)
    breakdown: list[str]  # step-time keys present in the epochs
    epochs: pd.DataFrame  # one row per (trial, epoch)
    trials: pd.DataFrame  # one row per trial
    groups: dict[str, pd.DataFrame]  # factor -> one row per grid value
    configs: pd.DataFrame  # one row per combination of factor values
    objective: Metric  # what "best" means: the sweep's metric and mode on its trial column
    objective_note: str  # why the sweep's metric was not usable ("" when it is)
    metrics: tuple[Metric, ...]  # the factor tables' metrics: FACTOR_METRICS with the objective
    effects: dict[str, dict[str, pd.DataFrame]]  # factor -> PAIRED_METRICS column -> paired_effects()
    noise: tuple[float, int]  # seed_noise() of final test accuracy: (pooled std, configurations behind it)
    memory_measure: str  # what peak memory per worker measures on these trials' devices


# ----------------------------------------------------------------------------------------- load


def load(run_dir: Where) -> RunLog:
    """The run's logs; ConfigError when the folder is missing or holds no trial."""
    try:
        run = load_run(run_dir)
    except FileNotFoundError:
        raise ConfigError(
            f"no run folder at {run_dir}: pass the folder holding {SWEEP_FILE} (<storage>/<sweep name>)"
        ) from None
    if not run.trials:
        listed = len(run.sweep.get("trials", []))
        what = f"{SWEEP_FILE} lists {listed} trial(s) but none has started" if run.sweep else f"no {SWEEP_FILE} either"
        raise ConfigError(f"no trials in {run.path}: no <trial>/{TRIAL_FILE} found ({what}); nothing to report")
    return run


def _fmt_value(value: Any) -> str:
    """A config value as a user writes it: true/false, 0.001, resnet9."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(float(value))
    if value is None:
        return "—"
    return str(value)


def _same(a: Any, b: Any) -> bool:
    return a == b or _fmt_value(a) == _fmt_value(b)


def resolve_baseline(sweep: dict, factors: list[str], grid: dict[str, list], baseline: dict | None) -> dict[str, Any]:
    """Baseline value per factor: the first grid value unless `baseline` names another one."""
    chosen = {key: grid[key][0] for key in factors if grid[key]}
    for key, value in (baseline or {}).items():
        if key not in factors:
            swept = ", ".join(factors) if factors else "none"
            raise ConfigError(
                f"--baseline {key}={_fmt_value(value)}: '{key}' is not a swept factor of "
                f"sweep '{sweep.get('name', '?')}'; swept keys: {swept}"
            )
        match = [v for v in grid[key] if _same(v, value)]
        if not match:
            allowed = ", ".join(_fmt_value(v) for v in grid[key])
            raise ConfigError(f"--baseline {key}={_fmt_value(value)}: value not in the grid; allowed: {allowed}")
        chosen[key] = match[0]
    return chosen


# --------------------------------------------------------------------------------------- frames


def _breakdown_keys(run: RunLog) -> list[str]:
    present = {k for t in run.trials for row in t.epochs for k in row if k.startswith("time_") and k.endswith("_s")}
    return [k for k in BREAKDOWN_KEYS if k in present] + sorted(present - set(BREAKDOWN_KEYS))


def epochs_frame(run: RunLog, breakdown: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (trial, epoch); known numeric keys only, null/non-numeric values as NaN."""
    columns = ["trial", "epoch", *EPOCH_KEYS, *breakdown]
    rows = [{"trial": t.name, **row} for t in run.trials for row in t.epochs]
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for column in columns[1:]:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    frame["trial"] = frame["trial"].astype(object)
    return frame


def find_overfitting(epochs: Sequence[int], train_loss: Sequence[float], test_loss: Sequence[float]) -> Overfit | None:
    """Apply OVERFIT_RULE to one trial's curves (epochs with a missing loss are skipped)."""
    points = [
        (int(e), float(tr), float(te))
        for e, tr, te in zip(epochs, train_loss, test_loss)
        if tr is not None and te is not None and math.isfinite(tr) and math.isfinite(te)
    ]
    if len(points) < 2:
        return None
    m = min(range(len(points)), key=lambda i: points[i][2])  # the first minimum
    min_epoch, train_at_min, test_min = points[m]
    for epoch, train, test in points[m + 1 :]:
        if test > test_min + OVERFIT_RISE * abs(test_min) and train < train_at_min:
            return Overfit(min_epoch, test_min, train_at_min, epoch, test, train)
    return None


def train_basis(e: pd.DataFrame) -> str:
    """ "eval" when the trial's epochs `e` logged the training subset evaluated like the test set, else "running"."""
    return "eval" if e["train_eval_loss"].notna().any() else "running"


def trial_overfitting(e: pd.DataFrame) -> Overfit | None:
    """OVERFIT_RULE on one trial's epochs, with the train loss of its train_basis."""
    train_loss = TRAIN_COLUMNS[train_basis(e)][0]
    return find_overfitting(e["epoch"].tolist(), e[train_loss].tolist(), e["test_loss"].tolist())


def memory_measure(run: RunLog) -> str:
    """What peak memory per worker measures, worded from the trials' device types (trial.json: system)."""
    types = sorted({(t.meta.get("system") or {}).get("device_type") for t in run.trials} & set(MEMORY_MEASURES))
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


def _trial_row(trial, e: pd.DataFrame, keys: list[str], breakdown: Sequence[str]) -> dict:
    cfg = trial.config
    row: dict[str, Any] = {"trial": trial.name, "status": trial.status}
    for key in keys:
        row[key] = trial.swept.get(key, cfg.get(key))
    row["workers"] = cfg.get("workers")
    batch, accum = cfg.get("batch_size"), cfg.get("accum_steps", 1)
    row["effective_batch"] = batch * accum if isinstance(batch, int) and isinstance(accum, int) else None
    row["epochs_done"] = len(e)
    row["epochs_planned"] = cfg.get("epochs")

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
    row["time_per_epoch_s"] = float(e["epoch_time_s"].mean())
    row["samples_per_s"] = float(e["samples_per_s"].mean())
    row["peak_mem_mb"] = float(e["peak_mem_mb"].max())
    row["peak_mem_total_mb"] = float(e["peak_mem_total_mb"].max())
    for key in breakdown:
        row[key] = float(e[key].mean())
    over = trial_overfitting(e)
    row["overfitting"] = over is not None
    row["overfit_epoch"] = over.onset if over else None
    row["error"] = trial.meta.get("error")
    row["diverged_epoch"] = trial.meta.get("diverged_epoch")
    system = trial.meta.get("system") or {}
    row["device"] = _device(system)
    row["gpus"] = system.get("num_gpus") if system.get("device_type") == "cuda" else 0
    return row


def trial_frame(run: RunLog, epochs: pd.DataFrame, keys: list[str], breakdown: Sequence[str]) -> pd.DataFrame:
    """One row per trial, in sweep order: swept values, final/best metrics, costs, status."""
    rows = []
    for trial in run.trials:
        e = epochs[epochs["trial"] == trial.name].sort_values("epoch").reset_index(drop=True)
        rows.append(_trial_row(trial, e, keys, breakdown))
    frame = pd.DataFrame(rows)
    for column in (
        "best_epoch",
        "overfit_epoch",
        "diverged_epoch",
        "epochs_planned",
        "effective_batch",
        "workers",
        "gpus",
    ):
        numbers = pd.to_numeric(frame[column], errors="coerce")
        try:
            frame[column] = numbers.astype("Int64")
        except (TypeError, ValueError):  # not whole numbers: keep them as floats
            frame[column] = numbers
    return frame


def _stats(values: pd.Series) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); NaN std for fewer than two values."""
    values = values.dropna()
    mean = float(values.mean()) if len(values) else math.nan
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return mean, std


def _with(frame: pd.DataFrame, key: str, value: Any) -> pd.DataFrame:
    """Rows whose `key` is `value` (64 matches 64.0; an empty frame keeps its columns)."""
    return frame.loc[frame[key].map(lambda x: _same(x, value)).astype(bool)]


def _metric_columns(breakdown: Sequence[str], metrics: Sequence[Metric]) -> list[str]:
    return [m.column for m in metrics] + list(breakdown)


def resolve_objective(sweep: dict, trials: pd.DataFrame) -> tuple[Metric, str]:
    """What "best" means: the sweep's metric and mode on its trial column, and "" as the note; else final test
    accuracy (max) and a note saying why the sweep's choice could not be used."""
    name, mode = sweep.get("metric", "test_acc"), sweep.get("mode", "max")
    metric = OBJECTIVES.get(name)
    if metric is None or mode not in ("max", "min"):
        return FACTOR_METRICS[0], f"fallback: sweep metric={name}, mode={mode} has no trial column"
    done = trials.loc[trials["status"] == "finished", metric.column]
    if len(done) and done.isna().all():
        return FACTOR_METRICS[0], f"fallback: no finished trial logged sweep metric={name}"
    return replace(metric, better=mode), ""


def table_metrics(objective: Metric) -> tuple[Metric, ...]:
    """FACTOR_METRICS with the objective in place of the metric on its column (so the sweep's mode picks that
    column's best), or appended when no factor metric has its column."""
    metrics = tuple(objective if m.column == objective.column else m for m in FACTOR_METRICS)
    return metrics if objective in metrics else metrics + (objective,)


def factor_frame(
    trials: pd.DataFrame,
    key: str,
    values: list,
    baseline: Any,
    breakdown: Sequence[str] = (),
    metrics: Sequence[Metric] = FACTOR_METRICS,
) -> pd.DataFrame:
    """One row per grid value of `key`: n finished trials, mean/std of each metric (all other keys and seeds
    pooled: a mean, not an effect; see paired_effects), delta of the means vs baseline."""
    done = trials[trials["status"] == "finished"]
    rows = []
    for value in values:
        chosen = _with(done, key, value)
        row: dict[str, Any] = {key: value, "n": len(chosen), "is_baseline": _same(value, baseline)}
        for column in _metric_columns(breakdown, metrics):
            row[f"{column}_mean"], row[f"{column}_std"] = _stats(chosen[column])
        rows.append(row)
    frame = pd.DataFrame(rows)
    base = frame[frame["is_baseline"]].iloc[0]
    for metric in metrics:
        mean = frame[f"{metric.column}_mean"]
        frame[f"{metric.column}_delta"] = mean - base[f"{metric.column}_mean"]
        if metric.kind != "acc":
            frame[f"{metric.column}_delta_pct"] = 100.0 * (mean / base[f"{metric.column}_mean"] - 1.0)
    return frame


def config_frame(
    trials: pd.DataFrame,
    factors: list[str],
    grid: dict[str, list],
    breakdown: Sequence[str] = (),
    metrics: Sequence[Metric] = FACTOR_METRICS,
) -> pd.DataFrame:
    """One row per combination of factor values (seeds averaged): n, mean/std of each metric."""
    done = trials[trials["status"] == "finished"]
    rows = []
    for combo in itertools.product(*(grid[key] for key in factors)):
        chosen = done
        for key, value in zip(factors, combo):
            chosen = _with(chosen, key, value)
        row: dict[str, Any] = dict(zip(factors, combo)) | {"n": len(chosen)}
        for column in _metric_columns(breakdown, metrics):
            row[f"{column}_mean"], row[f"{column}_std"] = _stats(chosen[column])
        rows.append(row)
    return pd.DataFrame(rows)


def _t_central(theta: float, df: int) -> float:
    """P(|T| <= sqrt(df) tan(theta)) for Student's t with whole df: the finite series of Abramowitz & Stegun
    26.7.3 (odd df) and 26.7.4 (even df)."""
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * 2 * k / (2 * k + 1)
        return 2 / math.pi * (theta + s * total)
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t (0.5 <= p < 1, whole df >= 1): bisection on the exact CDF; no scipy needed."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    low, high = 0.0, math.pi / 2  # in theta = atan(t / sqrt(df)), where the CDF is bounded and monotone
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central(mid, df) < 2 * p - 1 else (low, mid)
    return math.sqrt(df) * math.tan((low + high) / 2)


def _cells(frame: pd.DataFrame, keys: Sequence[str], column: str):
    """`column` grouped by the combination of `keys` values, labelled as written (64 meets 64.0); NaN dropped."""
    labels = [_label(row, keys) for _, row in frame.iterrows()]
    values = pd.Series(frame[column].to_numpy(dtype=float), index=pd.Index(labels, dtype=object), dtype=float)
    return values.dropna().groupby(level=0)


def paired_effects(
    trials: pd.DataFrame, key: str, factors: Sequence[str], grid: dict[str, list], baseline: Any, column: str
) -> pd.DataFrame:
    """Effect of each non-baseline value of `key` on `column`, from matched pairs: a finished trial with that
    value and one with the baseline value that differ in nothing else (other factors and seed equal; several
    trials in one cell are averaged). One row per value: n_pairs, mean_diff and std_diff of the differences
    (value − baseline), the Student-t 95 % CI of their mean, and conclusive (the CI excludes 0)."""
    done = trials[trials["status"] == "finished"]
    match = [k for k in factors if k != key] + (["seed"] if "seed" in done.columns else [])
    base = _cells(_with(done, key, baseline), match, column).mean()
    rows = []
    for value in grid[key]:
        if _same(value, baseline):
            continue
        diffs = (_cells(_with(done, key, value), match, column).mean() - base).dropna()
        mean, std = _stats(diffs)
        n = len(diffs)
        half = t_quantile(0.975, n - 1) * std / math.sqrt(n) if n > 1 else math.nan
        low, high = mean - half, mean + half
        rows.append(
            {
                key: value,
                "n_pairs": n,
                "mean_diff": mean,
                "std_diff": std,
                "ci_low": low,
                "ci_high": high,
                "conclusive": bool(low > 0 or high < 0),
            }
        )  # False with NaN bounds
    return pd.DataFrame(rows, columns=[key, "n_pairs", "mean_diff", "std_diff", "ci_low", "ci_high", "conclusive"])


def seed_noise(trials: pd.DataFrame, factors: Sequence[str], column: str) -> tuple[float, int]:
    """Seed-to-seed noise of `column`: the pooled within-configuration std, sqrt(Σ (n_i − 1) s_i² / Σ (n_i − 1)),
    over configurations with >= 2 finished trials, and how many such configurations there are."""
    cells = _cells(trials[trials["status"] == "finished"], factors, column)
    n, var = cells.count(), cells.var(ddof=1)
    dof = (n - 1)[n >= 2]
    if not len(dof):
        return math.nan, 0
    return math.sqrt(float((dof * var[dof.index]).sum() / dof.sum())), len(dof)


def build_report(run_dir: Where, baseline: dict | None = None) -> Report:
    """Everything the Markdown, CSV and JSON outputs need, computed once from the logs."""
    run = load(run_dir)
    sweep = run.sweep
    raw_grid = sweep.get("grid") or {}
    grid = {key: list(values) if isinstance(values, list) else [values] for key, values in raw_grid.items()}
    factors = [key for key in grid if key != "seed" and grid[key]]
    chosen = resolve_baseline(sweep, factors, grid, baseline)
    seed_column = "seed" in grid or any("seed" in t.swept for t in run.trials)
    breakdown = _breakdown_keys(run)
    epochs = epochs_frame(run, breakdown)
    keys = factors + (["seed"] if seed_column else [])
    trials = trial_frame(run, epochs, keys, breakdown)
    objective, note = resolve_objective(sweep, trials)
    metrics = table_metrics(objective)
    groups = {key: factor_frame(trials, key, grid[key], chosen[key], breakdown, metrics) for key in factors}
    configs = config_frame(trials, factors, grid, breakdown, metrics)
    effects = {
        key: {m.column: paired_effects(trials, key, factors, grid, chosen[key], m.column) for m in PAIRED_METRICS}
        for key in factors
    }
    noise = seed_noise(trials, factors, FACTOR_METRICS[0].column)
    name = str(sweep.get("name") or run.path.name)
    return Report(
        run,
        name,
        factors,
        grid,
        chosen,
        seed_column,
        breakdown,
        epochs,
        trials,
        groups,
        configs,
        objective,
        note,
        metrics,
        effects,
        noise,
        memory_measure(run),
    )


# ------------------------------------------------------------------------------------ formatting


def _places(x: float) -> int:
    """Decimals that show `x` with about three significant digits (none at 1000 and above)."""
    x = abs(x)
    if x >= 1000:
        return 0
    if x >= 100:
        return 1
    if x >= 1 or x == 0:
        return 2
    return min(-math.floor(math.log10(x)) + 2, 12)


def _missing(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def _num(x: Any, like: float | None = None) -> str:
    """A number rounded for reading; `like` sets the decimals (a std shown as its mean is)."""
    if _missing(x):
        return "—"
    x = float(x)
    places = _places(x if _missing(like) else like)
    return f"{x:,.{places}f}"


def _pct(fraction: Any) -> str:
    return "—" if _missing(fraction) else f"{100 * fraction:.2f}"


def _loss(x: Any) -> str:
    return "—" if _missing(x) else f"{x:.4f}"


def _int(x: Any) -> str:
    return "—" if _missing(x) else str(int(x))


def _duration(seconds: float | None) -> str:
    if _missing(seconds):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _mean_std(metric: Metric | None, mean: float, std: float) -> str:
    """`mean ± std`, both to the same decimals; the std of a single trial is shown as —."""
    if math.isnan(mean):
        return "—"
    if metric is not None and metric.kind == "acc":
        return f"{_pct(mean)} ± {_pct(std) if not math.isnan(std) else '—'}"
    return f"{_num(mean)} ± {_num(std, like=mean) if not math.isnan(std) else '—'}"


def _metric_text(metric: Metric, x: Any) -> str:
    return _pct(x) if metric.kind == "acc" else _loss(x) if metric.kind == "loss" else _num(x)


def _best_phrase(metric: Metric) -> str:
    return f"{'highest' if metric.better == 'max' else 'lowest'} {metric.label}"


def _signed(metric: Metric, x: float, like: float) -> str:
    """A difference with its sign: percentage points for accuracies, else to the decimals `like` needs."""
    return f"{100 * x:+.2f}" if metric.kind == "acc" else f"{x:+,.{_places(like)}f}"


def _paired_parts(metric: Metric, row: pd.Series) -> tuple[str, str, str]:
    """Mean paired difference and its CI bounds, to the same decimals (the CI bounds are — below two pairs)."""
    columns = ("mean_diff", "ci_low", "ci_high")
    like = max((abs(row[c]) for c in columns if not _missing(row[c])), default=0.0)
    return tuple("—" if _missing(row[c]) else _signed(metric, row[c], like) for c in columns)


def _verdict(row: pd.Series) -> str:
    if row["n_pairs"] == 0:
        return "no matched pairs"
    if row["conclusive"]:
        return "real effect"
    return "not conclusive (CI includes 0)" if row["n_pairs"] > 1 else "not conclusive (one pair, no CI)"


def _delta(metric: Metric, row: pd.Series) -> str:
    if row["is_baseline"]:
        return "baseline"
    if metric.kind == "acc":
        d = row[f"{metric.column}_delta"]
        return "—" if math.isnan(d) else f"{100 * d:+.2f} pp"
    d = row[f"{metric.column}_delta_pct"]
    return "—" if math.isnan(d) or math.isinf(d) else f"{d:+.1f} %"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table; `align` is one letter per column: l, r or c."""

    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    align = align or "l" * len(headers)
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _label(row: pd.Series | dict, keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={_fmt_value(row[k])}" for k in keys)


def _short(key: str) -> str:
    return key.removeprefix("time_").removesuffix("_s")


def _last_line(text: Any) -> str:
    if _missing(text):  # None, or NaN once in a frame
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


# ---------------------------------------------------------------------------------------- header


def _date(text: str | None) -> str:
    if not text:
        return "unknown"
    try:
        dt = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return str(text)
    return dt.strftime("%Y-%m-%d %H:%M") + (dt.strftime(" (UTC%z)") if dt.tzinfo else "")


def _wall_time(sweep: dict) -> tuple[float | None, str]:
    wall = sweep.get("wall_time_s")
    if isinstance(wall, (int, float)):
        return float(wall), _duration(float(wall))
    try:
        start = datetime.fromisoformat(sweep["started_at"])
        end = datetime.fromisoformat(sweep["finished_at"])
        seconds = (end - start).total_seconds()
        return seconds, _duration(seconds)
    except (KeyError, TypeError, ValueError):
        return None, "not finished (no finished_at in sweep.json)" if sweep else "unknown (no sweep.json)"


def hardware(report: Report) -> str:
    """GPU model and count from the trials' system info, else the host's CPU model and cores."""
    sweep = report.run.sweep
    host, cluster = sweep.get("host") or {}, sweep.get("cluster") or {}
    systems = [t.meta.get("system") or {} for t in report.run.trials]
    gpus = sorted({s.get("device_name", "GPU") for s in systems if s.get("device_type") == "cuda"})
    nodes = cluster.get("nodes")
    where = f" on {nodes} node{'s' if nodes != 1 else ''}" if isinstance(nodes, int) else ""
    if gpus:
        count = cluster.get("gpus") or max((s.get("num_gpus") or 0) for s in systems)
        most = max((s.get("num_gpus") or 0) for s in systems)
        return (
            f"{_fmt_value(float(count))} × {' / '.join(gpus)}{where} (up to {most} per trial); "
            f"host CPU {host.get('cpu_model', 'unknown')}"
        )
    cores = host.get("cpu_count")
    cpus = cluster.get("cpus")
    ray = f", {_fmt_value(float(cpus))} CPUs in the Ray cluster{where}" if isinstance(cpus, (int, float)) else ""
    return f"CPU only: {host.get('cpu_model', 'unknown CPU')}, {cores if cores else '?'} cores{ray}"


def _status_counts(trials: pd.DataFrame) -> dict[str, int]:
    counts = trials["status"].value_counts()
    return {s: int(counts.get(s, 0)) for s in ("finished", "failed", "diverged", "oom", "running", "pending")}


def _trials_line(report: Report) -> str:
    counts = _status_counts(report.trials)
    n = len(report.trials)
    n_configs = len(report.configs)
    repeats = report.run.sweep.get("repeats", 1)
    shape = (
        f" ({n_configs} configuration{'s' if n_configs != 1 else ''} × {repeats} repeats)"
        if isinstance(repeats, int) and repeats > 1
        else ""
    )
    parts = [f"{counts[s]} {s}" for s in ("finished", "failed", "diverged", "oom")]
    parts += [f"{counts[s]} {s}" for s in ("running", "pending") if counts[s]]
    return f"{n} run{'s' if n != 1 else ''}{shape}: " + ", ".join(parts)


def _fixed_settings(report: Report) -> str:
    configs = [t.config for t in report.run.trials if t.config]
    if not configs:
        return "—"
    varying = set(report.factors) | {"seed", "data_dir"}
    same = [k for k in configs[0] if k not in varying and all(c.get(k) == configs[0][k] for c in configs)]
    return ", ".join(f"{k}={_fmt_value(configs[0][k])}" for k in same) or "—"


def header_info(report: Report) -> dict:
    sweep = report.run.sweep
    versions = sweep.get("versions") or {}
    wall_s, wall = _wall_time(sweep)
    metric, mode = sweep.get("metric", "test_acc"), sweep.get("mode", "max")
    return {
        "name": report.name,
        "description": sweep.get("description", ""),
        "date": _date(sweep.get("started_at")),
        "started_at": sweep.get("started_at"),
        "git_revision": sweep.get("git_revision", "unknown"),
        "hardware": hardware(report),
        "versions": {k: versions.get(k, "unknown") for k in ("python", "torch", "ray", "cuda")},
        "wall_time_s": wall_s,
        "wall_time": wall,
        "runs": len(report.trials),
        "status_counts": _status_counts(report.trials),
        "metric": metric,
        "mode": mode,
        "best": f"{_best_phrase(report.objective)} ({report.objective_note or f'sweep metric={metric}, mode={mode}'})",
        "best_column": report.objective.column,
        "best_mode": report.objective.better,
        "grid": report.grid,
        "baseline": report.baseline,
        "repeats": sweep.get("repeats", 1),
        "overfitting_rule": OVERFIT_RULE,
        "memory_measure": report.memory_measure,
    }


def _header_md(report: Report) -> list[str]:
    info = header_info(report)
    v = info["versions"]
    grid = "; ".join(f"{k}: {', '.join(_fmt_value(x) for x in vals)}" for k, vals in report.grid.items()) or "—"
    rows = [
        ("Date", info["date"]),
        ("Git revision", f"`{info['git_revision']}`"),
        ("Hardware", info["hardware"]),
        ("Software", f"Python {v['python']}, torch {v['torch']}, Ray {v['ray']}, CUDA {v['cuda']}"),
        ("Wall time", info["wall_time"]),
        ("Trials", _trials_line(report)),
        ("Grid", grid),
        ("Fixed settings", _fixed_settings(report)),
        ("Best means", info["best"]),
    ]
    lines = [f"# {report.name}", ""]
    if info["description"]:
        lines += [f"> {line}" for line in str(info["description"]).splitlines()] + [""]
    lines += [markdown_table(["", ""], rows), ""]
    return lines


# -------------------------------------------------------------------------------------- findings


def _best(frame: pd.DataFrame, column: str, better: str) -> tuple[int, int] | None:
    """Row labels of the best and the worst value of `column` (NaN ignored), or None."""
    values = frame[column].dropna()
    if len(values) < 1:
        return None
    return (values.idxmax(), values.idxmin()) if better == "max" else (values.idxmin(), values.idxmax())


def findings(report: Report) -> list[str]:
    """Facts read off the configuration tables (best by the sweep's metric, fastest, most accurate, least memory)
    and the paired effects of each factor."""
    configs = report.configs[report.configs["n"] > 0]
    done = int((report.trials["status"] == "finished").sum())
    if not len(configs):
        return ["No trial finished: there is nothing to compare yet."]
    lines = []
    repeated = report.run.sweep.get("repeats", 1) not in (None, 1) or "seed" in report.grid
    unit = "configuration (mean over its finished seeds)" if repeated else "configuration"
    name = lambda i: _label(configs.loc[i], report.factors) or "the only configuration"

    def n_note(i: int) -> str:
        n = int(configs.loc[i, "n"])
        return f", mean of {n} trials" if n > 1 else ""

    if len(configs) == 1:
        i = configs.index[0]
        return [
            f"One {unit}: final test accuracy {_mean_std(FACTOR_METRICS[0], configs.loc[i, 'final_test_acc_mean'], configs.loc[i, 'final_test_acc_std'])} %, "
            f"{_num(configs.loc[i, 'time_per_epoch_s_mean'])} s/epoch, peak memory {_memory_text(configs.loc[i])} "
            f"({done} finished trial{'s' if done != 1 else ''})."
        ]

    best = report.objective
    if report.objective_note:
        lines.append(f"**Best** means the {_best_phrase(best)} ({report.objective_note}).")
    pick = _best(configs, f"{best.column}_mean", best.better) if best != FACTOR_METRICS[0] else None
    if pick:  # the default objective's best is the Most accurate line
        top, low = pick
        lines.append(
            f"**Best** {unit} by the sweep's metric ({_best_phrase(best)}): {name(top)} at "
            f"{_metric_text(best, configs.loc[top, f'{best.column}_mean'])}{n_note(top)}; the worst is "
            f"{name(low)} ({_metric_text(best, configs.loc[low, f'{best.column}_mean'])})."
        )
    pick = _best(configs, "time_per_epoch_s_mean", "min")
    if pick:
        fast, slow = pick
        t_fast, t_slow = configs.loc[fast, "time_per_epoch_s_mean"], configs.loc[slow, "time_per_epoch_s_mean"]
        lines.append(
            f"**Fastest** {unit}: {name(fast)} at {_num(t_fast)} s/epoch{n_note(fast)}; "
            f"{t_slow / t_fast:.2f}× faster than the slowest, {name(slow)} ({_num(t_slow)} s/epoch)."
        )
    pick = _best(configs, "final_test_acc_mean", "max")
    if pick:
        top, low = pick
        a_top, a_low = configs.loc[top, "final_test_acc_mean"], configs.loc[low, "final_test_acc_mean"]
        ratio = f"; {(1 - a_low) / (1 - a_top):.2f}× fewer test errors" if a_top < 1 else ""
        lines.append(
            f"**Most accurate**: {name(top)} at {_pct(a_top)} % final test accuracy{n_note(top)}; "
            f"{100 * (a_top - a_low):+.2f} pp over the least accurate, {name(low)} ({_pct(a_low)} %){ratio}."
        )
    # Ranked by the total (what running the configuration costs) when every configuration logged one.
    by_total = bool(configs["peak_mem_total_mb_mean"].notna().all())
    column = "peak_mem_total_mb_mean" if by_total else "peak_mem_mb_mean"
    pick = _best(configs, column, "min")
    if pick:
        small, big = pick
        m_small, m_big = configs.loc[small, column], configs.loc[big, column]
        ratio = f"{m_big / m_small:.2f}× less than" if m_small > 0 else "versus"
        basis = (
            "by the peak total over workers, what the configuration occupies; per worker is what must fit on one device"
            if by_total
            else "by the peak per worker: not every configuration logged a total"
        )
        lines.append(
            f"**Least memory** ({basis}): {name(small)} at {_memory_text(configs.loc[small])}{n_note(small)}; "
            f"{ratio} the most, {name(big)} ({_memory_text(configs.loc[big])})."
        )
    for key in report.factors:
        lines.extend(_factor_finding(report, key))
    return lines


def _memory_text(config: pd.Series) -> str:
    """`2,200 MB total over workers, 1,100 MB per worker` for a configuration row; per worker alone without a total."""
    per_worker = f"{_num(config['peak_mem_mb_mean'])} MB per worker"
    total = config["peak_mem_total_mb_mean"]
    return per_worker if _missing(total) else f"{_num(total)} MB total over workers, {per_worker}"


def _paired_text(metric: Metric, row: pd.Series, unit: str) -> str:
    """`+1.00 pp (95 % CI +0.85 to +1.15 pp, 9 pairs)`."""
    mean, low, high = _paired_parts(metric, row)
    n = int(row["n_pairs"])
    return f"{mean} {unit} (95 % CI {low} to {high} {unit}, {n} pairs)" if n > 1 else f"{mean} {unit} (1 pair)"


def _factor_finding(report: Report, key: str) -> list[str]:
    acc, time = (report.effects[key][m.column] for m in PAIRED_METRICS)
    if not len(acc):  # a single grid value: nothing to compare
        return []
    base = _fmt_value(report.baseline[key])
    parts = []
    for (_, a), (_, t) in zip(acc.iterrows(), time.iterrows()):
        part = f"{key}={_fmt_value(a[key])}: "
        if a["n_pairs"] == 0:
            parts.append(
                part + f"no matched pairs (no finished trial with {key}={base} and the same other keys "
                "and seed), so no effect is estimated"
            )
            continue
        part += f"final test accuracy {_paired_text(PAIRED_METRICS[0], a, 'pp')}, {_verdict(a)}"
        if t["n_pairs"]:
            part += f"; time/epoch {_paired_text(PAIRED_METRICS[1], t, 's')}"
        parts.append(part)
    line = (
        f"**{key}** (baseline {base}; paired differences vs the trial with {key}={base} and the same other keys "
        "and seed): " + ". ".join(parts) + "."
    )
    std, configs = report.noise
    if configs:
        line += (
            f" Seed noise: {100 * std:.2f} pp (pooled within-configuration std of final test accuracy over "
            f"{configs} configuration{'s' if configs != 1 else ''} with ≥ 2 finished seeds)."
        )
    return [line]


# ------------------------------------------------------------------------------------- md tables


def _trial_table(report: Report) -> str:
    t = report.trials
    keys = report.factors + (["seed"] if report.seed_column else [])
    show_workers = "workers" not in keys
    show_device = t["device"].nunique() > 1
    show_gpus = bool((t["gpus"].fillna(0) > 0).any())
    show_eval = _has_train_eval(report)
    headers = (
        ["trial", *keys]
        + (["workers"] if show_workers else [])
        + (["GPUs"] if show_gpus else [])
        + (["device"] if show_device else [])
        + ["eff. batch", "epochs", "final test acc (%)", "best test acc (%) (epoch)", "train acc, running (%)"]
        + (["train acc, eval (%)"] if show_eval else [])
        + ["gap (pp)", "train loss, running"]
        + (["train loss, eval"] if show_eval else [])
        + [
            "test loss",
            "time",
            "time/epoch (s)",
            "samples/s",
            "peak mem per worker (MB)",
            "peak mem, total over workers (MB)",
            "status",
            "overfitting",
        ]
    )
    rows = []
    for _, r in t.iterrows():
        best = f"{_pct(r['best_test_acc'])} ({_int(r['best_epoch'])})" if not math.isnan(r["best_test_acc"]) else "—"
        planned = _int(r["epochs_planned"])
        gap = _pct(r["gap"]) + (" †" if show_eval and r["train_basis"] == "running" and r["epochs_done"] else "")
        rows.append(
            [f"`{r['trial']}`", *(_fmt_value(r[k]) for k in keys)]
            + ([_int(r["workers"])] if show_workers else [])
            + ([_int(r["gpus"])] if show_gpus else [])
            + ([r["device"]] if show_device else [])
            + [
                _int(r["effective_batch"]),
                f"{r['epochs_done']}/{planned}",
                _pct(r["final_test_acc"]),
                best,
                _pct(r["final_train_acc"]),
            ]
            + ([_pct(r["final_train_eval_acc"])] if show_eval else [])
            + [gap, _loss(r["final_train_loss"])]
            + ([_loss(r["final_train_eval_loss"])] if show_eval else [])
            + [
                _loss(r["final_test_loss"]),
                _duration(r["train_time_s"]),
                _num(r["time_per_epoch_s"]),
                _num(r["samples_per_s"]),
                _num(r["peak_mem_mb"]),
                _num(r["peak_mem_total_mb"]),
                r["status"],
                f"**yes** (from epoch {_int(r['overfit_epoch'])})"
                if r["overfitting"]
                else ("no" if r["epochs_done"] >= 2 else "—"),
            ]
        )
    align = (
        "l" * (1 + len(keys))
        + ("r" if show_workers else "")
        + ("r" if show_gpus else "")
        + ("l" if show_device else "")
        + "r" * (13 + 2 * show_eval)
        + "ll"
    )
    return markdown_table(headers, rows, align)


def _has_train_eval(report: Report) -> bool:
    return bool((report.trials["train_basis"] == "eval").any())


def _factor_table(report: Report, key: str) -> str:
    frame = report.groups[key]
    headers = [key, "n"]
    for metric in report.metrics:
        headers += [metric.label, "Δ"]
    best = {}
    for metric in report.metrics:
        means = frame.loc[frame["n"] > 0, f"{metric.column}_mean"].dropna()
        best[metric.column] = (means.max() if metric.better == "max" else means.min()) if len(means) else None
    rows = []
    for _, r in frame.iterrows():
        row = [_fmt_value(r[key]) + (" (baseline)" if r["is_baseline"] else ""), str(r["n"])]
        for metric in report.metrics:
            mean = r[f"{metric.column}_mean"]
            text = _mean_std(metric, mean, r[f"{metric.column}_std"])
            if best[metric.column] is not None and mean == best[metric.column]:
                text = f"**{text}**"
            row += [text, _delta(metric, r)]
        rows.append(row)
    return markdown_table(headers, rows, "lr" + "r" * 2 * len(report.metrics))


def _paired_table(report: Report, key: str) -> str:
    acc, time = (report.effects[key][m.column] for m in PAIRED_METRICS)
    headers = ["value", "pairs", "Δ final test acc (pp) [95 % CI]", "Δ time/epoch (s) [95 % CI]", "accuracy effect"]

    def cell(metric: Metric, row: pd.Series) -> str:
        mean, low, high = _paired_parts(metric, row)
        return "—" if row["n_pairs"] == 0 else f"{mean} [{low}, {high}]" if row["n_pairs"] > 1 else mean

    rows = [
        [
            f"{key}={_fmt_value(a[key])}",
            str(a["n_pairs"]),
            cell(PAIRED_METRICS[0], a),
            cell(PAIRED_METRICS[1], t),
            _verdict(a),
        ]
        for (_, a), (_, t) in zip(acc.iterrows(), time.iterrows())
    ]
    return markdown_table(headers, rows, "lrrrl")


def _factor_breakdown_table(report: Report, key: str) -> str:
    frame = report.groups[key]
    headers = [key, "n", "epoch (s)"] + [f"{_short(k)} (s)" for k in report.breakdown]
    rows = [
        [_fmt_value(r[key]), str(r["n"]), _mean_std(None, r["time_per_epoch_s_mean"], r["time_per_epoch_s_std"])]
        + [_mean_std(None, r[f"{k}_mean"], r[f"{k}_std"]) for k in report.breakdown]
        for _, r in frame.iterrows()
    ]
    return markdown_table(headers, rows, "lr" + "r" * (1 + len(report.breakdown)))


def _trial_breakdown_table(report: Report) -> str:
    headers = ["trial", "epoch (s)"] + [f"{_short(k)} (s, share)" for k in report.breakdown]
    rows = []
    for _, r in report.trials.iterrows():
        if r["epochs_done"] == 0:
            continue
        total = r["time_per_epoch_s"]
        cells = []
        for k in report.breakdown:
            share = f" ({100 * r[k] / total:.0f} %)" if total and not math.isnan(r[k]) else ""
            cells.append(_num(r[k]) + share)
        rows.append([f"`{r['trial']}`", _num(total), *cells])
    return markdown_table(headers, rows, "l" + "r" * (1 + len(report.breakdown)))


def _overfit_sentences(report: Report) -> list[str]:
    keys = report.factors + (["seed"] if report.seed_column else [])
    lines = []
    for _, r in report.trials[report.trials["overfitting"]].iterrows():
        o = trial_overfitting(report.epochs[report.epochs["trial"] == r["trial"]].sort_values("epoch"))
        label = _label(r, keys) or r["trial"]
        basis = r["train_basis"]
        lines.append(
            f"- `{r['trial']}` ({label}): test loss bottomed at {o.test_min:.4f} in epoch {o.min_epoch}, "
            f"then rose to {o.test_at_onset:.4f} in epoch {o.onset} "
            f"({100 * (o.test_at_onset / o.test_min - 1):+.1f} %) while {basis} train loss fell from "
            f"{o.train_at_min:.4f} to {o.train_at_onset:.4f}; final {basis} train − test accuracy gap "
            f"{_pct(r['gap'])} pp" + ("." if basis == "eval" else " (running: not like-for-like).")
        )
    return lines


def train_metrics_note(report: Report) -> str:
    """What the train accuracy and loss columns measure: the running means, and the eval ones where logged."""
    if not _has_train_eval(report):
        return f"{RUNNING_NOTE} These logs have no eval train metrics (train_eval_acc): the gap is not like-for-like."
    sizes = {
        t.config.get("train_eval_size")
        for t, basis in zip(report.run.trials, report.trials["train_basis"])
        if basis == "eval"
    }
    size = f" ({_fmt_value(sizes.pop())} here; all of them when the training set is smaller)" if len(sizes) == 1 else ""
    return f"{RUNNING_NOTE} {EVAL_NOTE.format(size=size)}"


def _gap_note(report: Report) -> str:
    if not _has_train_eval(report):
        return "gap = final running train acc − final test acc (percentage points)"
    t = report.trials
    running = ((t["train_basis"] == "running") & (t["epochs_done"] > 0)).any()
    return "gap = final eval train acc − final test acc (percentage points" + (
        "; † the running train acc: the trial logged no eval one)" if running else ")"
    )


def memory_note(report: Report) -> str:
    """What the two peak memory columns measure, worded from the trials' devices."""
    t = report.trials
    missing = ((t["epochs_done"] > 0) & t["peak_mem_total_mb"].isna()).any()
    return (
        f"Peak mem per worker: {report.memory_measure}, the largest over the workers and epochs: what must fit "
        "on one device. Peak mem, total over workers: the sum of every worker's peak (of every GPU's with "
        "strategy=dp), the largest over epochs: what running it occupies (at most: the workers may peak at "
        "different moments)" + ("; — where the logs have no total (peak_mem_total_mb)." if missing else ".")
    )


def _excluded_lines(report: Report) -> list[str]:
    keys = report.factors + (["seed"] if report.seed_column else [])
    lines = []
    for _, r in report.trials[report.trials["status"] != "finished"].iterrows():
        label = _label(r, keys) or r["trial"]
        done, planned = r["epochs_done"], _int(r["epochs_planned"])
        status = r["status"]
        error = _last_line(r["error"])
        if status == "diverged":
            why = f"diverged at epoch {_int(r['diverged_epoch'])} (non-finite loss)"
        elif status == "failed":
            why = f"failed after {done} of {planned} epochs"
        elif status == "oom":
            why = f"ran out of memory after {done} of {planned} epochs"
        elif status == "running":
            why = f"still running: {done} of {planned} epochs so far"
        else:
            why = f"{status}: {done} of {planned} epochs"
        lines.append(f"- `{r['trial']}` ({label}): {why}" + (f" — `{error}`" if error else "") + ".")
    return lines


# ----------------------------------------------------------------------------------------- plots


def _colors(n: int) -> list:
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["viridis"](i / max(n - 1, 1)) for i in range(n)]


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig, path: Path) -> None:
    # No Software/date chunks: the same data give the same bytes.
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})


def _legend(ax, n: int) -> None:
    if n:
        ax.legend(
            fontsize=7 if n > 6 else 8,
            ncol=1 if n <= 12 else 2,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
        )


def _trial_labels(report: Report) -> list[str]:
    keys = report.factors + (["seed"] if report.seed_column else [])
    return [_label(r, keys) or r["trial"] for _, r in report.trials.iterrows()]


def _train_curve_phrase(report: Report) -> str:
    """Which train loss the curves draw (each trial's train_basis), in words."""
    t = report.trials
    bases = set(t.loc[t["epochs_done"] > 0, "train_basis"])
    if bases == {"eval"}:
        return "train loss evaluated like the test set"
    if bases == {"running"}:
        return "running train loss (mean over the epoch)"
    return "train loss evaluated like the test set where logged, else running"


def plot_curves(report: Report, out_dir: Path) -> list[tuple[str, str]]:
    """Loss curves (train dashed, test solid) and test accuracy per epoch, one colour per trial."""
    from matplotlib.ticker import MaxNLocator

    names = report.trials["trial"].tolist()
    labels, colors = _trial_labels(report), _colors(len(names))
    fig = _figure(10, 5)
    ax = fig.subplots()
    positive = []
    for name, label, color in zip(names, labels, colors):
        e = report.epochs[report.epochs["trial"] == name].sort_values("epoch")
        if not len(e):
            continue
        train_loss = e[TRAIN_COLUMNS[train_basis(e)][0]]
        ax.plot(e["epoch"], train_loss, linestyle="--", color=color, marker=".")
        ax.plot(e["epoch"], e["test_loss"], linestyle="-", color=color, marker=".", label=label)
        positive += [x for x in pd.concat([train_loss, e["test_loss"]]).dropna() if x > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    train = _train_curve_phrase(report)
    ax.set(xlabel="epoch", ylabel="loss", title=f"Loss per epoch (dashed: {train}; solid: test loss)")
    _legend(ax, len(ax.get_lines()) // 2)
    _save(fig, out_dir / "curves_loss.png")

    fig = _figure(10, 5)
    ax = fig.subplots()
    for name, label, color in zip(names, labels, colors):
        e = report.epochs[report.epochs["trial"] == name].sort_values("epoch")
        if len(e):
            ax.plot(e["epoch"], 100 * e["test_acc"], color=color, marker=".", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy per epoch")
    _legend(ax, len(ax.get_lines()))
    _save(fig, out_dir / "curves_test_acc.png")
    return [
        ("curves_loss.png", f"Loss per epoch: {train} (dashed), test loss (solid)"),
        ("curves_test_acc.png", "Test accuracy per epoch"),
    ]


AXIS_NAMES = {"category": "categories, unordered", "linear": "linear axis", "log2": "log2 axis", "log10": "log axis"}


def factor_axis(values: Sequence[Any]) -> str:
    """How a factor's values are laid out on an x axis (one of AXIS_NAMES). "category" unless there are two or more
    distinct values and all are numbers (true/false are categories); numbers go on "log2" when all are positive,
    span a factor of 4 or more and each is the smallest times a power of two (batch sizes, workers: 1, 2, 4, 8), on
    "log10" when all are positive and span a factor of 100 or more (learning rates), else on "linear"."""
    numeric = all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) for v in values
    )
    if not numeric or len(set(values)) < 2:
        return "category"
    low, high = min(values), max(values)
    if low <= 0:
        return "linear"
    doublings = [math.log2(v / low) for v in values]
    if high / low >= 4 and all(abs(d - round(d)) < 1e-9 for d in doublings):
        return "log2"
    return "log10" if high / low >= 100 else "linear"


def factor_positions(values: Sequence[Any], axis: str) -> np.ndarray:
    """x of each value: its index for categories, the value itself on a numeric axis."""
    return np.arange(len(values), dtype=float) if axis == "category" else np.asarray(values, dtype=float)


def dodge(x: np.ndarray, axis: str, shift: float) -> np.ndarray:
    """`x` moved by `shift` times the mean gap between neighbouring values as the axis draws it (one category, a
    linear step, a log-scale ratio), so two series side by side do not hide each other's error bars."""
    if axis == "category":
        return x + shift
    if len(x) < 2:
        return x
    if axis == "linear":
        return x + shift * (x.max() - x.min()) / (len(x) - 1)
    return x * (x.max() / x.min()) ** (shift / (len(x) - 1))


def accuracy_series(frame: pd.DataFrame) -> list[tuple[Metric, str]]:
    """The accuracy series of a factor plot as (metric, legend label): final and best test accuracy, or final alone,
    labelled best = final, when their means agree for every value. A trial's best is never below its final, so
    equal means say that every trial's last epoch was its best: a second series would cover the first."""
    final, best = FACTOR_METRICS[0], FACTOR_METRICS[1]
    pooled = "mean ± std (other keys pooled)"
    if np.array_equal(
        frame[f"{final.column}_mean"].to_numpy(dtype=float),
        frame[f"{best.column}_mean"].to_numpy(dtype=float),
        equal_nan=True,
    ):
        return [(final, f"final test acc (%) = best (every trial's last epoch was its best), {pooled}")]
    return [(final, f"{final.label}, {pooled}"), (best, f"{best.label}, {pooled}")]


def plot_factor(report: Report, key: str, out_dir: Path) -> list[tuple[str, str]]:
    """Bars of time/epoch, throughput and peak memory (per worker, total) per value (error bars = std); test accuracy
    vs value as points, joined by a line only on a numeric axis (factor_axis)."""
    from matplotlib.ticker import NullLocator

    frame = report.groups[key]
    values = frame[key].tolist()
    ticks = [_fmt_value(v) for v in values]
    x = np.arange(len(frame))
    costs = FACTOR_METRICS[2:]
    fig = _figure(4 * len(costs), 4)
    axes = fig.subplots(1, len(costs))
    for ax, metric in zip(axes, costs):
        mean = frame[f"{metric.column}_mean"].to_numpy(dtype=float)
        std = np.nan_to_num(frame[f"{metric.column}_std"].to_numpy(dtype=float))
        colors = np.array(["0.6" if b else "tab:blue" for b in frame["is_baseline"]])
        have = np.isfinite(mean)
        ax.bar(x[have], mean[have], yerr=std[have], color=colors[have], capsize=4)
        for i in x[~have]:  # no finished trial, or the metric was not logged
            ax.text(i, 0, "no data", ha="center", va="bottom", fontsize=8, color="0.4")
        if not have.any():
            ax.set_ylim(0, 1)
            ax.set_yticks([])
        ax.set_xlim(-0.6, len(x) - 0.4)
        ax.set_xticks(x, ticks)
        ax.set(xlabel=key, title=metric.label)
    fig.suptitle(
        f"Cost per {key} value (mean ± std over finished trials, other keys pooled; grey = baseline)\n"
        f"peak mem per worker: {report.memory_measure}; total: the sum over the workers",
        fontsize=10,
    )
    _save(fig, out_dir / f"{key}_cost.png")

    fig = _figure(7, 4.5)
    ax = fig.subplots()
    done = report.trials[report.trials["status"] == "finished"]
    axis = factor_axis(values)
    positions = factor_positions(values, axis)
    order = np.argsort(positions, kind="stable")  # a line joins numeric values left to right
    series = accuracy_series(frame)
    for slot, ((metric, label), color) in enumerate(zip(series, ("tab:blue", "tab:orange"))):
        at = dodge(positions, axis, 0.08 * (2 * slot - len(series) + 1))  # ±0.08 of a gap for two series, 0 for one
        mean = 100 * frame[f"{metric.column}_mean"].to_numpy(dtype=float)
        std = 100 * np.nan_to_num(frame[f"{metric.column}_std"].to_numpy(dtype=float))
        ax.errorbar(
            at[order],
            mean[order],
            yerr=std[order],
            fmt="o" if axis == "category" else "o-",
            color=color,
            capsize=4,
            label=label,
        )
        for i, value in enumerate(values):
            points = 100 * _with(done, key, value)[metric.column].dropna()
            ax.scatter(np.full(len(points), at[i]), points, color=color, alpha=0.35, s=14)
    if axis == "log2":
        ax.set_xscale("log", base=2)
    elif axis == "log10":
        ax.set_xscale("log")
    ax.set_xticks(positions, ticks)
    ax.xaxis.set_minor_locator(NullLocator())
    if axis == "category":
        ax.set_xlim(-0.5, len(values) - 0.5)
    ax.set(
        xlabel=f"{key} ({AXIS_NAMES[axis]})",
        ylabel="test accuracy (%)",
        title=f"Test accuracy vs {key} (dots = trials)",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)  # below: never on the data
    _save(fig, out_dir / f"{key}_accuracy.png")
    what = "Final and best test accuracy" if len(series) == 2 else "Final test accuracy (= best in every trial)"
    return [
        (f"{key}_accuracy.png", f"{what} vs {key}"),
        (
            f"{key}_cost.png",
            f"Time per epoch, throughput and peak memory (per worker, total over workers) per {key} value",
        ),
    ]


# -------------------------------------------------------------------------------------- markdown


def render_markdown(report: Report, plots: dict[str, list[tuple[str, str]]]) -> str:
    counts = _status_counts(report.trials)
    excluded = len(report.trials) - counts["finished"]
    lines = _header_md(report)
    lines += ["## Findings", ""] + [f"- {line}" for line in findings(report)]
    scope = (
        f"Aggregates use the {counts['finished']} finished trial(s) only; the {excluded} other trial(s) "
        "are excluded (listed under *Excluded trials*)."
        if excluded
        else "Every trial finished and enters the aggregates."
    )
    lines += ["", scope, ""]

    for key in report.factors:
        base = f"{key}={_fmt_value(report.baseline[key])}"
        best = "highest" if report.objective.better == "max" else "lowest"
        lines += [f"## Effect of `{key}`", ""]
        if len(report.effects[key][PAIRED_METRICS[0].column]):
            lines += [
                f"Paired effect vs the baseline {base}: each finished trial with another {key} value is paired "
                f"with the finished trial that has {base} and the same other keys and seed; the table gives the "
                "mean of the differences (value − baseline) and a Student-t 95 % confidence interval over the "
                "pairs. An interval that excludes 0 is a real effect; its width covers seed noise and any "
                "change of the effect across the other keys' values.",
                "",
                _paired_table(report, key),
                "",
            ]
        lines += [
            "Per-value means, not effects: mean ± sample std (ddof=1; — for a single trial) over finished "
            "trials with each value, all other keys and seeds pooled, so they also carry the other keys' "
            f"effects. Δ = difference of these means vs {base}: accuracy in percentage points, others in "
            f"percent. Bold: the best value per column (for {report.objective.label}, the sweep's metric, the "
            f"{best}). {memory_note(report)}",
            "",
            _factor_table(report, key),
            "",
        ]
        if report.breakdown:
            lines += [
                "Step-time breakdown (seconds per epoch, mean ± std):",
                "",
                _factor_breakdown_table(report, key),
                "",
            ]
        lines += [f"![{caption}]({file})" for file, caption in plots.get(key, [])]
        lines += [""]

    lines += [
        "## Trials",
        "",
        _trial_table(report),
        "",
        f"Accuracies are at the last logged epoch unless marked best; {_gap_note(report)}; time = sum of epoch "
        "times; time/epoch and samples/s are means over logged epochs; eff. batch = batch_size × accum_steps. "
        f"{train_metrics_note(report)} {memory_note(report)}",
        "",
    ]
    if report.breakdown:
        lines += [
            "### Step-time breakdown",
            "",
            "Mean seconds per epoch (share of the epoch time):",
            "",
            _trial_breakdown_table(report),
            "",
        ]

    lines += ["## Overfitting", "", OVERFIT_RULE, "", train_metrics_note(report), ""]
    flagged = _overfit_sentences(report)
    lines += flagged if flagged else ["No trial is flagged."]
    lines += [""]

    excluded_lines = _excluded_lines(report)
    if excluded_lines:
        lines += ["## Excluded trials", "", "Not in the aggregates above:", ""] + excluded_lines + [""]

    lines += ["## Training curves", ""] + [f"![{caption}]({file})" for file, caption in plots.get("", [])] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- exports


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{str(k): _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def export_json(report: Report, out_dir: Path) -> Path:
    info = header_info(report)
    noise_std, noise_configs = report.noise
    data = {
        "sweep": {k: _plain(v) if not isinstance(v, dict) else v for k, v in info.items()},
        "trials": _records(report.trials),
        "configurations": _records(report.configs),
        "factors": {
            key: {
                "baseline": report.baseline[key],
                "rows": _records(frame),
                "paired": {column: _records(effect) for column, effect in report.effects[key].items()},
            }
            for key, frame in report.groups.items()
        },
        "seed_noise": {"final_test_acc_std": _plain(noise_std), "configurations": noise_configs},
        "findings": findings(report),
    }
    path = out_dir / "report.json"
    path.write_text(json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def export_csv(report: Report, out_dir: Path) -> Path:
    path = out_dir / "trials.csv"
    report.trials.to_csv(path, index=False)
    report.configs.to_csv(out_dir / "configurations.csv", index=False)
    for key, frame in report.groups.items():
        frame.to_csv(out_dir / f"factor_{key}.csv", index=False)
        effects = pd.concat(
            [effect.assign(metric=column) for column, effect in report.effects[key].items()], ignore_index=True
        )
        effects[["metric", *effects.columns[:-1]]].to_csv(out_dir / f"effect_{key}.csv", index=False)
    report.epochs.to_csv(out_dir / "epochs.csv", index=False)
    return path


def export_markdown(report: Report, out_dir: Path) -> Path:
    import matplotlib.style

    with matplotlib.style.context("default"):
        plots = {"": plot_curves(report, out_dir)}
        for key in report.factors:
            plots[key] = plot_factor(report, key, out_dir)
    path = out_dir / "README.md"
    path.write_text(render_markdown(report, plots), encoding="utf-8")
    return path


def write_report(
    run_dir: Where, out_dir: str | Path | None = None, baseline: dict | None = None, fmt: str = "md"
) -> Path:
    """Write the report of the run at `run_dir`; returns the main file (README.md, trials.csv or report.json).

    `out_dir` defaults to reports/<sweep name>; `baseline` ({key: grid value}) picks the reference value
    of a factor for the Δ columns (default: its first grid value). Raises ConfigError on bad input.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown report format '{fmt}'; allowed: {', '.join(FORMATS)}")
    report = build_report(run_dir, baseline)
    out = Path(out_dir) if out_dir is not None else Path("reports") / report.name
    out.mkdir(parents=True, exist_ok=True)
    return {"md": export_markdown, "csv": export_csv, "json": export_json}[fmt](report, out)
