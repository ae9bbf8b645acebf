"""A run's logs as pandas frames, and the statistics every output of the report shares.

load_run() -> frames: epochs (one row per trial and epoch), trials (one row per trial), per-factor groups,
configurations; then the paired effects of each factor, seed noise and overfitting. Only the logs are read.

Aggregates (factor tables, configurations, findings) use finished trials only; failed, diverged,
out-of-memory and unfinished trials appear in the trial table and are listed with their reason.
A factor's effect is measured on matched pairs (trials that differ only in that factor, seed included)
with a Student-t 95 % interval; per-value means pool the other factors and are shown as means only.
"Best" follows the sweep file's metric and mode.
Several runs (folders) make one report: the runs become one more factor, `run`, first of the factors (RUN_MATCH_RULE
says which trials of different runs are paired; load_runs, combine_runs).
Peak memory comes twice: per worker (the largest peak of one worker process, or one GPU: what must fit on one device)
and total over workers (the sum of every worker's peak: what a configuration occupies); "least memory" uses the total.
The train/test gap, overfitting and the train loss curve read the training subset evaluated like the test set
(train_eval_*) where logged, else the running train metrics (means over the epoch, augmentation and dropout on).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import ConfigError
from ..core.runlog import (
    BREAKDOWN_KEYS,
    EPOCH_METRICS,
    MODES,
    SWEEP_FILE,
    TRIAL_FILE,
    RunLog,
    TrialLog,
    Where,
    load_run,
    sweep_objective,
)
from ..core.storage import StoragePath

# The epochs frame's columns after `epoch`: runlog.EPOCH_METRICS in its order, less the epoch itself, the step-time
# breakdown (its columns follow, those logged) and what the report does not read (_UNREAD).
_UNREAD = ("epoch", "train_time_s", "train_samples", "end_unix", "diverged", *BREAKDOWN_KEYS)
assert set(_UNREAD) <= set(EPOCH_METRICS)
EPOCH_KEYS = tuple(key for key in EPOCH_METRICS if key not in _UNREAD)
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
# The sweep file's `metric` (runlog.OBJECTIVES) -> the trial column that ranks trials by it: epoch metrics at the
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


# Several runs in one report: the factor that tells them apart, and which of their trials are compared.
RUN_FACTOR = "run"
IGNORED_KEYS = ("data_dir",)  # where a machine keeps the data: never a difference between runs
RUN_MATCH_RULE = (
    "A trial of one run is paired with the trial of the baseline run whose config is equal on every key except "
    "the run-level ones. A run-level key is constant within each run but not the same in all runs (say epochs=1 "
    "in one, epochs=2 in the other): it is part of the run factor, so the run effect includes it with everything "
    "else the runs differ in (code, hardware, software). Every other key must be equal: the swept keys and the seed "
    "(keys constant in every run are equal anyway); data_dir is ignored. Runs with no such pair are refused."
)


@dataclass(frozen=True)
class RunSource:
    """One run of a report: its label (its folder name; with the parent folder where two runs share a name) and its
    logs."""

    label: str
    log: RunLog


@dataclass(frozen=True)
class RunComparison:
    """How the runs of a report with several differ: the run-level keys (RUN_MATCH_RULE) with each run's value, and
    the keys a pair must agree on (those that vary within some run)."""

    run_level: dict[str, dict[str, Any]]  # key -> run label -> its value in that run
    matched: list[str]


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
    label_keys: list[str]  # what tells trials apart: the factors, then seed where trials differ by it
    breakdown: list[str]  # step-time keys present in the epochs
    epochs: pd.DataFrame  # one row per (trial, epoch)
    trials: pd.DataFrame  # one row per trial
    overfits: dict[str, Overfit]  # trial name -> what OVERFIT_RULE found, for the flagged trials only
    groups: dict[str, pd.DataFrame]  # factor -> one row per grid value
    configs: pd.DataFrame  # one row per combination of factor values
    objective: Metric  # what "best" means: the sweep's metric and mode on its trial column
    objective_note: str  # why the sweep's metric was not usable ("" when it is)
    metrics: tuple[Metric, ...]  # the factor tables' metrics: FACTOR_METRICS with the objective
    effects: dict[str, dict[str, pd.DataFrame]]  # factor -> PAIRED_METRICS column -> paired_effects()
    noise: tuple[float, int]  # seed_noise() of final test accuracy: (pooled std, configurations behind it)
    memory_measure: str  # what peak memory per worker measures on these trials' devices
    sources: list[RunSource] = field(default_factory=list)  # the runs, in the order given
    comparison: RunComparison | None = None  # None for one run

    def trial_label(self, row: pd.Series) -> str:
        """A trial row named by its label_keys' values, or by the trial's name when there are none."""
        return values_label(row, self.label_keys) or row["trial"]


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


def run_labels(paths: Sequence[StoragePath]) -> list[str]:
    """Each run's folder name; where two share a name, the parent folder too (then more of the path, as needed)."""
    parts = [[part for part in path.path.split("/") if part] for path in paths]  # no scheme, no URI options
    depth = [1] * len(paths)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashes = {label for label in labels if labels.count(label) > 1}
        grow = [i for i, label in enumerate(labels) if label in clashes and depth[i] < len(parts[i])]
        if not grow:
            return labels
        for i in grow:
            depth[i] += 1


def load_runs(run_dirs: Where | Sequence[Where]) -> list[RunSource]:
    """The runs' logs with their labels; ConfigError for a folder twice (the same run cannot be compared with
    itself)."""
    many = not isinstance(run_dirs, (str, os.PathLike, StoragePath))
    paths = [StoragePath.of(where) for where in (run_dirs if many else [run_dirs])]
    seen = [str(path) for path in paths]
    twice = sorted({where for where in seen if seen.count(where) > 1})
    if twice:
        raise ConfigError(f"run folder given twice: {', '.join(twice)}; pass each run once")
    return [RunSource(label, load(path)) for label, path in zip(run_labels(paths), paths)]


def fmt_value(value: Any) -> str:
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
    return a == b or fmt_value(a) == fmt_value(b)


def values_label(row: pd.Series | dict, keys: Sequence[str]) -> str:
    """`k=v, k=v` for `keys`, each value as a user writes it."""
    return ", ".join(f"{k}={fmt_value(row[k])}" for k in keys)


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
        match = [v for v in grid[key] if _same(v, value)]
        if not match:
            allowed = ", ".join(fmt_value(v) for v in grid[key])
            raise ConfigError(f"--baseline {key}={fmt_value(value)}: value not in the grid; allowed: {allowed}")
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


def trial_value(trial: TrialLog, key: str) -> Any:
    """A trial's value of `key`: its swept value (a grid label such as "adam (lr=0.002)"), else its config's."""
    return trial.swept.get(key, trial.config.get(key))


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
    row["overfitting"] = over is not None
    row["overfit_epoch"] = over.onset if over else None
    row["error"] = trial.meta.get("error")
    row["diverged_epoch"] = trial.meta.get("diverged_epoch")
    system = trial.meta.get("system") or {}
    row["device"] = _device(system)
    row["gpus"] = system.get("num_gpus") if system.get("device_type") == "cuda" else 0
    return row


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
    ):
        numbers = pd.to_numeric(frame[column], errors="coerce")
        try:
            frame[column] = numbers.astype("Int64")
        except (TypeError, ValueError):  # not whole numbers: keep them as floats
            frame[column] = numbers
    return frame, overfits


def sample_stats(values: pd.Series) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); NaN std for fewer than two values."""
    values = values.dropna()
    mean = float(values.mean()) if len(values) else math.nan
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return mean, std


def rows_with(frame: pd.DataFrame, key: str, value: Any) -> pd.DataFrame:
    """Rows whose `key` is `value` (64 matches 64.0; an empty frame keeps its columns)."""
    return frame.loc[frame[key].map(lambda x: _same(x, value)).astype(bool)]


def _metric_columns(breakdown: Sequence[str], metrics: Sequence[Metric]) -> list[str]:
    return [m.column for m in metrics] + list(breakdown)


def resolve_objective(sweep: dict, trials: pd.DataFrame) -> tuple[Metric, str]:
    """What "best" means: the sweep's metric and mode on its trial column, and "" as the note; else final test
    accuracy (max) and a note saying why the sweep's choice could not be used."""
    name, mode = sweep_objective(sweep)
    metric = OBJECTIVES.get(name)
    if metric is None or mode not in MODES:
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
        chosen = rows_with(done, key, value)
        row: dict[str, Any] = {key: value, "n": len(chosen), "is_baseline": _same(value, baseline)}
        for column in _metric_columns(breakdown, metrics):
            row[f"{column}_mean"], row[f"{column}_std"] = sample_stats(chosen[column])
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
            chosen = rows_with(chosen, key, value)
        row: dict[str, Any] = dict(zip(factors, combo)) | {"n": len(chosen)}
        for column in _metric_columns(breakdown, metrics):
            row[f"{column}_mean"], row[f"{column}_std"] = sample_stats(chosen[column])
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
    labels = [values_label(row, keys) for _, row in frame.iterrows()]
    values = pd.Series(frame[column].to_numpy(dtype=float), index=pd.Index(labels, dtype=object), dtype=float)
    return values.dropna().groupby(level=0)


def paired_effects(
    trials: pd.DataFrame,
    key: str,
    factors: Sequence[str],
    grid: dict[str, list],
    baseline: Any,
    column: str,
    match: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Effect of each non-baseline value of `key` on `column`, from matched pairs: a finished trial with that
    value and one with the baseline value that differ in nothing else (other factors and seed equal, or the columns
    `match` names; several trials in one cell are averaged). One row per value: n_pairs, mean_diff and std_diff of
    the differences (value − baseline), the Student-t 95 % CI of their mean, and conclusive (the CI excludes 0)."""
    done = trials[trials["status"] == "finished"]
    if match is None:
        match = [k for k in factors if k != key] + (["seed"] if "seed" in done.columns else [])
    base = _cells(rows_with(done, key, baseline), match, column).mean()
    rows = []
    for value in grid[key]:
        if _same(value, baseline):
            continue
        diffs = (_cells(rows_with(done, key, value), match, column).mean() - base).dropna()
        mean, std = sample_stats(diffs)
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


def sweep_grid(sweep: dict) -> dict[str, list]:
    """The sweep's grid: key -> its values (a single value as a list of one)."""
    raw = sweep.get("grid") or {}
    return {key: list(values) if isinstance(values, list) else [values] for key, values in raw.items()}


def compare_runs(sources: Sequence[RunSource]) -> RunComparison:
    """Which config keys are run-level and which a pair must agree on (RUN_MATCH_RULE), over every trial."""
    keys = dict.fromkeys(k for s in sources for t in s.log.trials for k in t.config if k not in IGNORED_KEYS)
    run_level, matched = {}, []
    for key in keys:
        per_run = [[t.config.get(key) for t in s.log.trials] for s in sources]
        if any(len({fmt_value(v) for v in values}) > 1 for values in per_run):
            matched.append(key)
        elif len({fmt_value(values[0]) for values in per_run}) > 1:
            run_level[key] = {s.label: values[0] for s, values in zip(sources, per_run)}
    return RunComparison(run_level, matched)


def paired_config(trial: TrialLog, comparison: RunComparison) -> str:
    """What a trial of one run must share with its pair in another: its values of the matched keys."""
    return ", ".join(f"{k}={fmt_value(trial.config.get(k))}" for k in comparison.matched)


def refuse_unpaired(sources: Sequence[RunSource], comparison: RunComparison, baseline: Any) -> None:
    """ConfigError naming the keys that differ when a run has no trial to pair with one of the baseline run."""
    base = next(s for s in sources if _same(s.label, baseline))
    base_configs = {paired_config(t, comparison) for t in base.log.trials}
    for source in sources:
        if source is base or base_configs & {paired_config(t, comparison) for t in source.log.trials}:
            continue

        def values(run: RunSource, key: str) -> list[str]:
            return list(dict.fromkeys(fmt_value(t.config.get(key)) for t in run.log.trials))

        differ = [k for k in comparison.matched if set(values(base, k)) != set(values(source, k))]
        what = (
            "; ".join(
                f"{k}: {', '.join(values(base, k))} in {base.label}, {', '.join(values(source, k))} in {source.label}"
                for k in differ
            )
            or f"no combination of {', '.join(comparison.matched)} in common"
        )
        raise ConfigError(
            f"runs {base.label} and {source.label} have no trials to compare: a pair needs equal values of the keys "
            f"that vary within a run, and they differ ({what}); compare runs of one sweep file (other --set values "
            "are fine), or measure against another run with --baseline run=LABEL"
        )


def combine_runs(sources: Sequence[RunSource]) -> RunLog:
    """The runs as one: each trial named <label>/<trial> with its run as the swept `run`; the grid is run (the labels),
    then every run's swept keys with the values of all runs (a run that does not sweep a key adds its trials' values);
    metric and mode are the first run's."""
    grids = [sweep_grid(s.log.sweep) for s in sources]
    if any(RUN_FACTOR in grid for grid in grids):
        raise ConfigError(f"a sweep's grid has a key named '{RUN_FACTOR}': its runs cannot be compared by run")
    grid: dict[str, list] = {RUN_FACTOR: [s.label for s in sources]}
    for key in dict.fromkeys(k for g in grids for k in g):
        values: list = []
        for source, own in zip(sources, grids):
            for value in own[key] if key in own else [trial_value(t, key) for t in source.log.trials]:
                if not any(_same(value, known) for known in values):
                    values.append(value)
        grid[key] = values
    trials = [
        TrialLog(f"{s.label}/{t.name}", t.meta | {"swept": {RUN_FACTOR: s.label} | t.swept}, t.epochs)
        for s in sources
        for t in s.log.trials
    ]
    repeats = [s.log.sweep.get("repeats", 1) for s in sources]
    first = sources[0].log.sweep
    sweep = {
        "name": "-vs-".join(s.label.replace("/", "-") for s in sources),
        "metric": first.get("metric", "test_acc"),
        "mode": first.get("mode", "max"),
        "grid": grid,
        "repeats": max(r for r in repeats if isinstance(r, int)) if any(isinstance(r, int) for r in repeats) else 1,
    }
    return RunLog(sources[0].log.path, sweep, trials)


def build_report(run_dirs: Where | Sequence[Where], baseline: dict | None = None) -> Report:
    """Everything the Markdown, CSV and JSON outputs need, computed once from the logs of one run or several
    (ConfigError for runs with nothing to pair: RUN_MATCH_RULE)."""
    sources = load_runs(run_dirs)
    comparison = compare_runs(sources) if len(sources) > 1 else None
    run = combine_runs(sources) if comparison else sources[0].log
    sweep = run.sweep
    grid = sweep_grid(sweep)
    factors = [key for key in grid if key != "seed" and grid[key]]
    chosen = resolve_baseline(sweep, factors, grid, baseline)
    if comparison:
        refuse_unpaired(sources, comparison, chosen[RUN_FACTOR])
    seed_column = "seed" in grid or any("seed" in t.swept for t in run.trials)
    breakdown = _breakdown_keys(run)
    epochs = epochs_frame(run, breakdown)
    label_keys = factors + (["seed"] if seed_column else [])
    trials, overfits = trial_frame(run, epochs, label_keys, breakdown)
    if comparison:
        epochs.insert(1, RUN_FACTOR, epochs["trial"].map(dict(zip(trials["trial"], trials[RUN_FACTOR]))))
    objective, note = resolve_objective(sweep, trials)
    metrics = table_metrics(objective)
    groups = {key: factor_frame(trials, key, grid[key], chosen[key], breakdown, metrics) for key in factors}
    configs = config_frame(trials, factors, grid, breakdown, metrics)
    # Runs pair on their configs (RUN_MATCH_RULE), not on grid labels: one run's label may be another's config value.
    paired = trials.assign(paired_config=[paired_config(t, comparison) for t in run.trials]) if comparison else trials
    effects = {
        key: {
            m.column: paired_effects(
                paired,
                key,
                factors,
                grid,
                chosen[key],
                m.column,
                ["paired_config"] if comparison and key == RUN_FACTOR else None,
            )
            for m in PAIRED_METRICS
        }
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
        label_keys,
        breakdown,
        epochs,
        trials,
        overfits,
        groups,
        configs,
        objective,
        note,
        metrics,
        effects,
        noise,
        memory_measure(run),
        sources,
        comparison,
    )


# ------------------------------------------------------------------------------------ formatting
