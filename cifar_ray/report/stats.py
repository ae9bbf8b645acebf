"""The report's statistics, each on the trials frame: per-value means (factor_frame, config_frame; included trials
only, other keys and seeds pooled), the paired effect of each factor with a Student-t 95 % interval that holds the
shared test set's noise (paired_effects, report/testset.py; t_quantile, t_upper: scipy.stats), time and memory effects
as ratios of geometric means (log_values, ratio_effects), seed noise, and the overfitting rule.
The train loss the rule reads is the training subset evaluated like the test set (train_eval_*) where logged, else
the running one (TRAIN_COLUMNS, train_basis)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from ..core.runlog import FINAL_STATUSES, STATUSES, warm_slice
from . import testset
from .format import fmt_value, same_value, value_key
from .metrics import FACTOR_METRICS, INCLUDED, Metric

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


def included(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials the aggregates use: finished with every planned epoch logged."""
    return trials[trials["outcome"] == INCLUDED]


@dataclass(frozen=True)
class Overfit:
    min_epoch: int
    test_min: float
    train_at_min: float
    onset: int
    test_at_onset: float
    train_at_onset: float


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


def sample_stats(values: pd.Series) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); NaN std for fewer than two values."""
    values = values.dropna()
    mean = float(values.mean()) if len(values) else math.nan
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return mean, std


def rows_with(frame: pd.DataFrame, key: str, value: Any) -> pd.DataFrame:
    """Rows whose `key` is `value` (64 matches 64.0; an empty frame keeps its columns)."""
    target = value_key(value)
    return frame.loc[np.array([value_key(x) == target for x in frame[key]], dtype=bool)]


def _metric_columns(breakdown: Sequence[str], metrics: Sequence[Metric]) -> list[str]:
    return [m.column for m in metrics] + list(breakdown)


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
    done = included(trials)
    rows = []
    for value in values:
        chosen = rows_with(done, key, value)
        row: dict[str, Any] = {key: value, "n": len(chosen), "is_baseline": same_value(value, baseline)}
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


def config_members(trials: pd.DataFrame, factors: Sequence[str], values: Mapping[str, Any]) -> pd.DataFrame:
    """The trials of one configuration: those with each factor at its value in `values` (a config row or dict)."""
    for key in factors:
        trials = rows_with(trials, key, values[key])
    return trials


def config_frame(
    trials: pd.DataFrame,
    factors: list[str],
    grid: dict[str, list],
    breakdown: Sequence[str] = (),
    metrics: Sequence[Metric] = FACTOR_METRICS,
) -> pd.DataFrame:
    """One row per combination of factor values (seeds averaged): n (included trials), outcomes (each trial outcome
    -> how many of the configuration's trials had it), mean/std of each metric."""
    rows = []
    for combo in itertools.product(*(grid[key] for key in factors)):
        everyone = config_members(trials, factors, dict(zip(factors, combo)))
        chosen = included(everyone)
        outcomes = {str(outcome): int(n) for outcome, n in everyone["outcome"].value_counts().items()}
        row: dict[str, Any] = dict(zip(factors, combo)) | {"n": len(chosen), "outcomes": outcomes}
        for column in _metric_columns(breakdown, metrics):
            row[f"{column}_mean"], row[f"{column}_std"] = sample_stats(chosen[column])
        rows.append(row)
    return pd.DataFrame(rows)


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t (0.5 <= p < 1, df > 0: fractional where a Satterthwaite df is)."""
    if not 0.5 <= p < 1 or not df > 0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    return float(student_t.ppf(p, df))


def t_upper(t: float, df: float) -> float:
    """P(T > t) for Student's t with df > 0."""
    return float(student_t.sf(t, df))


def _cells(frame: pd.DataFrame, keys: Sequence[str], column: str):
    """`column` grouped by the combination of `keys` values (typed keys: 64 meets 64.0); NaN dropped."""
    labels = _labels(frame, keys)
    index = pd.Index(labels, dtype=object, tupleize_cols=False)
    values = pd.Series(frame[column].to_numpy(dtype=float), index=index, dtype=float)
    return values.dropna().groupby(level=0)


def _labels(frame: pd.DataFrame, keys: Sequence[str]) -> list[tuple]:
    """Each row's values of `keys` as one typed key (format.value_key), what pairs and groups trials."""
    columns = [frame[key].tolist() for key in keys]
    return [tuple(value_key(v) for v in values) for values in zip(*columns)] if keys else [()] * len(frame)


def _lost_pairs(trials: pd.DataFrame, key: str, value: Any, baseline: Any, match: Sequence[str], lost: set) -> str:
    """What removed the planned pairs `lost` (their labels): `key=value diverged in 2; the baseline failed in 1`."""
    counts: dict[str, int] = {}
    for side, side_value in ((f"{key}={fmt_value(value)}", value), ("the baseline", baseline)):
        chosen = rows_with(trials, key, side_value)
        for label, outcome in zip(_labels(chosen, match), chosen["outcome"]):
            if label in lost and outcome != INCLUDED:
                lost.discard(label)  # a pair is counted once, for its first side that did not finish
                what = f"{side} {outcome}"
                counts[what] = counts.get(what, 0) + 1
    if lost:
        counts["no value logged"] = len(lost)
    return "; ".join(f"{what} in {n}" for what, n in counts.items())


UNFINISHED = tuple(s for s in STATUSES if s not in FINAL_STATUSES)  # not ended: --resume trains them


def _open_pairs(trials: pd.DataFrame, key: str, value: Any, baseline: Any, match: Sequence[str], missing: set) -> int:
    """How many of the planned pairs `missing` (their labels) no ended trial removed: a side pending, running or
    interrupted, the other too or included. Not done, and not lost either: a resume trains them."""
    outcomes: dict[str, list[str]] = {}
    for side in (value, baseline):
        chosen = rows_with(trials, key, side)
        for label, outcome in zip(_labels(chosen, match), chosen["outcome"]):
            if label in missing:
                outcomes.setdefault(label, []).append(outcome)
    return sum(
        any(o in UNFINISHED for o in sides) and all(o in UNFINISHED or o == INCLUDED for o in sides)
        for sides in outcomes.values()
    )


@dataclass(frozen=True)
class Pairing:
    """How a sweep's trials pair for a factor's effects: its `factors` and `grid`, each factor's `baseline` value,
    the columns each factor's pairs agree on (`match`; a factor it does not name, or names as None: every other
    factor and the seed), and how many seeds the sweep ran."""

    factors: Sequence[str]
    grid: dict[str, list]
    baseline: dict[str, Any]
    match: Mapping[str, Sequence[str] | None] = field(default_factory=dict)
    seeds: int = 1


def paired_effects(
    trials: pd.DataFrame,
    key: str,
    pairing: Pairing,
    column: str,
    per_image: Mapping[str, testset.ImageScores] | None = None,
) -> pd.DataFrame:
    """Effect of each non-baseline value of `key` on `column`, from matched pairs: an included trial with that
    value and one with the baseline value that differ in nothing else (other factors and seed equal, or the columns
    the pairing's `match` names for `key`; several trials in one cell are averaged). One row per value: n_pairs of
    n_planned (the pairs the sweep planned; `lost` says what removed the others, n_open how many of them have a
    trial not ended yet), mean_diff and std_diff of the differences (value − baseline),
    se, and the Student-t 95 % CI of the mean. For an accuracy, `per_image` (trial name -> its ImageScores, those
    logged) makes the test set's noise part of se: testset_var, the part of the mean's variance that the shared test
    images cause (it does not shrink with more pairs), and testset_noise, how it was found (report/testset.py); then
    se = sqrt(std_diff² / n_pairs + testset_var), else sqrt(std_diff² / n_pairs)."""
    factors, grid, baseline, match = pairing.factors, pairing.grid, pairing.baseline[key], pairing.match.get(key)
    done = included(trials)
    if match is None:
        match = [k for k in factors if k != key] + (["seed"] if "seed" in done.columns else [])
    chosen = rows_with(done, key, baseline)
    base = _cells(chosen, match, column).mean()
    base_scored = _scored(chosen, match, column, per_image) if per_image is not None else {}
    planned_base = set(_labels(rows_with(trials, key, baseline), match))
    rows = []
    for value in grid[key]:
        if same_value(value, baseline):
            continue
        chosen = rows_with(done, key, value)
        diffs = (_cells(chosen, match, column).mean() - base).dropna()
        mean, std = sample_stats(diffs)
        n = len(diffs)
        testset_var, testset_noise = 0.0, ""
        if per_image is not None and n:
            scored = _scored(chosen, match, column, per_image)
            testset_var, testset_noise = testset.testset_var(
                [(scored[label], base_scored[label]) for label in diffs.index]
            )
        se = math.sqrt(std**2 / n + testset_var) if n > 1 else math.nan
        half = t_quantile(0.975, n - 1) * se if n > 1 else math.nan
        planned = planned_base & set(_labels(rows_with(trials, key, value), match))
        missing = planned - set(diffs.index)
        rows.append(
            {
                key: value,
                "n_pairs": n,
                "n_planned": len(planned),
                "n_open": _open_pairs(trials, key, value, baseline, match, missing),
                "lost": _lost_pairs(trials, key, value, baseline, match, set(missing)),
                "mean_diff": mean,
                "std_diff": std,
                "testset_var": testset_var,
                "testset_noise": testset_noise,
                "se": se,
                "ci_low": mean - half,
                "ci_high": mean + half,
            }
        )
    return pd.DataFrame(rows, columns=[key, *EFFECT_COLUMNS])


EFFECT_COLUMNS = (
    "n_pairs",
    "n_planned",
    "n_open",
    "lost",
    "mean_diff",
    "std_diff",
    "testset_var",
    "testset_noise",
    "se",
    "ci_low",
    "ci_high",
)


def _scored(
    frame: pd.DataFrame, keys: Sequence[str], column: str, per_image: Mapping[str, testset.ImageScores]
) -> dict[str, list[testset.Scored]]:
    """The trials of each cell (as _cells groups them, NaN `column` dropped) as the test set scored them."""
    cells: dict[str, list[testset.Scored]] = {}
    for label, scored in zip(_labels(frame, keys), _scored_rows(frame, column, per_image), strict=True):
        if scored is not None:
            cells.setdefault(label, []).append(scored)
    return cells


def scored_trials(
    frame: pd.DataFrame, column: str, per_image: Mapping[str, testset.ImageScores]
) -> list[testset.Scored]:
    """The trials of `frame` with a `column` value, as the test set scored them."""
    return [scored for scored in _scored_rows(frame, column, per_image) if scored is not None]


def _scored_rows(
    frame: pd.DataFrame, column: str, per_image: Mapping[str, testset.ImageScores]
) -> list[testset.Scored | None]:
    """Each row of `frame` as the test set scored it; None where `column` has no value."""
    return [
        None
        if math.isnan(value)
        else testset.Scored(value, None if pd.isna(images) else int(images), per_image.get(name))
        for name, value, images in zip(frame["trial"], frame[column], frame["test_images"], strict=True)
    ]


def pooled_std(trials: pd.DataFrame, factors: Sequence[str], column: str) -> tuple[float, int, int]:
    """The pooled within-configuration std of `column` over included trials, its degrees of freedom, and the
    configurations with >= 2 trials behind it (NaN, 0, 0 without any)."""
    cells = _cells(included(trials), factors, column)
    n, var = cells.count(), cells.var(ddof=1)
    dof = (n - 1)[n >= 2]
    if not len(dof):
        return math.nan, 0, 0
    return math.sqrt(float((dof * var[dof.index]).sum() / dof.sum())), int(dof.sum()), len(dof)


def seed_noise(trials: pd.DataFrame, factors: Sequence[str], column: str) -> tuple[float, int]:
    """Seed-to-seed noise of `column`: the pooled within-configuration std, sqrt(Σ (n_i − 1) s_i² / Σ (n_i − 1)),
    over configurations with >= 2 included trials, and how many such configurations there are."""
    std, _, configs = pooled_std(trials, factors, column)
    return std, configs


WITHIN, BETWEEN = "within-trial epoch noise only", "between pairs"
COMBINED = "epoch noise and seed noise combined (Satterthwaite)"
PAIRS_DISAGREE = "its pairs disagree in direction, more than within-trial epoch noise allows"
RATIO_COLUMNS = (
    "n_pairs",
    "n_planned",
    "n_open",
    "lost",
    "base_geomean",
    "value_geomean",
    "log_ratio",
    "ratio",
    "se",
    "df",
    "basis",
    "ci_low",
    "ci_high",
    "unfair",
    "pair_ratios",
)


def log_values(trials: pd.DataFrame, epochs: pd.DataFrame | None, column: str) -> dict[str, list[float]]:
    """Included trial name -> the logs of its repeated measurements of `column`: with `epochs`, its warm epochs'
    (runlog.warm_slice: the first epoch dropped where there are two or more), else the trial's one value."""
    names = list(included(trials)["trial"])
    if epochs is None:
        value = dict(zip(trials["trial"], trials[column]))
        return {n: [math.log(value[n])] for n in names if value[n] > 0}
    logs = {}
    for name in names:
        e = epochs[epochs["trial"] == name].sort_values("epoch")[column].to_numpy(dtype=float)
        logs[name] = [math.log(t) for t in e[warm_slice(len(e))] if t > 0]
    return {n: v for n, v in logs.items() if v}


def combined_noise(d: Sequence[float], within_var: float, within_df: int) -> tuple[str, float, float]:
    """The basis, se and degrees of freedom of the mean of a few pairs' log ratios `d` (fewer than MIN_PAIRS, over
    seeds) whose trials' epochs give the within-trial part `within_var` of its variance on `within_df` degrees of
    freedom: se² = within_var + the seed part (the pairs' spread beyond what their epochs explain, never below 0),
    its df by Welch-Satterthwaite. Two seeds that agree keep the epochs' many degrees of freedom; two that disagree
    fall towards the pairs' own n − 1."""
    n = len(d)
    seed_var = max(0.0, statistics.variance(d) / n - within_var)
    total = within_var + seed_var
    if total == 0:
        return COMBINED, 0.0, float(within_df)
    df = total**2 / (within_var**2 / within_df + seed_var**2 / (n - 1))
    return COMBINED, math.sqrt(total), df


def ratio_effects(
    trials: pd.DataFrame,
    logs: dict[str, list[float]],
    key: str,
    pairing: Pairing,
    min_pairs: int,
    shared: Sequence[str] = (),
) -> pd.DataFrame:
    factors, grid, baseline, match = pairing.factors, pairing.grid, pairing.baseline[key], pairing.match.get(key)
    seeds = pairing.seeds
    done = included(trials)
    if match is None:
        match = [k for k in factors if k != key] + (["seed"] if "seed" in done.columns else [])
    done = done[done["trial"].isin(list(logs))]

    def cells(value: Any) -> dict[str, str]:
        chosen = rows_with(done, key, value)
        return dict(zip(_labels(chosen, match), chosen["trial"]))  # one trial per cell: the last

    base = cells(baseline)
    planned_base = set(_labels(rows_with(trials, key, baseline), match))
    rows = []
    for value in grid[key]:
        if same_value(value, baseline):
            continue
        side = cells(value)
        pairs = [(base[label], side[label]) for label in side if label in base]
        means = [(statistics.fmean(logs[b]), statistics.fmean(logs[v])) for b, v in pairs]
        d = [v - b for b, v in means]
        n = len(d)
        mean = statistics.fmean(d) if n else math.nan
        names = [name for pair in pairs for name in pair]
        within_df = sum(len(logs[name]) - 1 for name in names)
        ss = sum((x - statistics.fmean(logs[name])) ** 2 for name in names for x in logs[name])
        within = ss / within_df if within_df else math.nan
        # the within-trial part of the mean log ratio's variance: each pair's epoch noise, averaged over n pairs
        within_var = sum(within * (1 / len(logs[b]) + 1 / len(logs[v])) for b, v in pairs) / n**2 if n else math.nan
        if n >= min_pairs or (n >= 2 and seeds >= 2 and not within_df):
            basis, se, df = BETWEEN, statistics.stdev(d) / math.sqrt(n), n - 1
        elif n >= 2 and seeds >= 2:
            basis, se, df = combined_noise(d, within_var, within_df)
        else:
            basis, se, df = (WITHIN, math.sqrt(within_var), within_df) if within_df else ("", math.nan, 0)
        if basis == WITHIN and n >= 2 and min(d) < 0 < max(d):
            # Pairs that disagree in direction vary more than any trial's epochs do: that noise is not measured.
            basis, se, df = PAIRS_DISAGREE, math.nan, 0
        half = t_quantile(0.975, df) * se if df and not math.isnan(se) else math.nan
        planned = planned_base & set(_labels(rows_with(trials, key, value), match))
        missing = planned - {label for label in side if label in base}
        unfair = [f"{b} / {v}" for b, v in pairs if (b in shared) != (v in shared)]
        rows.append(
            {
                key: value,
                "n_pairs": n,
                "n_planned": len(planned),
                "n_open": _open_pairs(trials, key, value, baseline, match, missing),
                "lost": _lost_pairs(trials, key, value, baseline, match, set(missing)),
                "base_geomean": math.exp(statistics.fmean(b for b, _ in means)) if n else math.nan,
                "value_geomean": math.exp(statistics.fmean(v for _, v in means)) if n else math.nan,
                "log_ratio": mean,
                "ratio": math.exp(mean),
                "se": se,
                "df": df,
                "basis": basis,
                "ci_low": math.exp(mean - half),
                "ci_high": math.exp(mean + half),
                "unfair": unfair,
                "pair_ratios": [math.exp(x) for x in d],
            }
        )
    return pd.DataFrame(rows, columns=[key, *RATIO_COLUMNS])
