"""The rankings of the configurations the findings name leaders of (the sweep's metric where it is not final test
accuracy, the fastest, the most accurate, the least memory): each configuration's mean against the noise a leader
must beat, from build_report's frames; report/judge.py gives the verdicts of the comparisons.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from .format import best_phrase, same_value
from .metrics import FACTOR_METRICS, Metric
from .stats import PAIRS_DISAGREE, WITHIN, config_members, included, pooled_std, scored_trials
from .testset import testset_var
from .verdicts import leaders

# Report.leaders' keys: the rankings of the configurations the findings name a leader of
BEST, FASTEST, MOST_ACCURATE, LEAST_MEMORY = "best", "fastest", "most accurate", "least memory"


@dataclass(frozen=True)
class Ranked:
    """What the rankings read, from build_report: the configurations (stats.config_frame) and trials frames, the
    factors, the trials' per-image scores, their warm epochs' log times, the time effects (factor -> frame, for their
    basis), the sweep's objective and the trial column memory is ranked by."""

    configs: pd.DataFrame
    trials: pd.DataFrame
    factors: Sequence[str]
    per_image: Mapping
    time_logs: Mapping[str, list[float]]
    time_effects: Mapping[str, pd.DataFrame]
    objective: Metric
    memory_column: str


@dataclass(frozen=True)
class Leaders:
    """A ranking of the configurations (rows of Report.configs with a finished trial) by one measure: `ranked` best
    first, `within` those whose distance from the best does not clear the noise (the best alone: a leader; None: the
    noise is unknown, no configuration ran twice), what it ranks by (`basis`) and the `noise` a leader must beat."""

    ranked: tuple
    within: tuple | None
    basis: str = ""
    noise: str = "the seed noise"


def _rank_by(report: Ranked, configs: pd.DataFrame, metric: Metric, basis: str = "") -> Leaders:
    """A trial column (`metric`) against the seed noise, the pooled within-configuration std, plus for an accuracy
    the shared test set's part of each difference (testset.testset_var), which seeds do not shrink."""
    column = metric.column
    means = configs[f"{column}_mean"]
    std, dof, _ = pooled_std(report.trials, report.factors, column)
    pair_var, noise = None, "the seed noise"
    if metric.kind == "acc":
        finished = included(report.trials)
        cells = {
            i: scored_trials(config_members(finished, report.factors, configs.loc[i]), column, report.per_image)
            for i in configs.index
        }
        pair_var = lambda a, b: testset_var([(cells[a], cells[b])])[0] if cells[a] and cells[b] else 0.0  # noqa: E731
        noise = "the seed and test-set noise"
    within = leaders(means, configs["n"], metric.better, std, dof, pair_var)
    ranked = tuple(means.dropna().sort_values(ascending=metric.better == "min").index)
    return Leaders(ranked, None if within is None else tuple(within), basis, noise)


def _rank_fastest(report: Ranked, configs: pd.DataFrame) -> Leaders | None:
    """Ranked by the mean log time per epoch over a configuration's warm epochs (stats.log_values), against the seed
    noise of that mean where a configuration ran twice or more, else against the trials' own epoch-to-epoch noise
    (stats.WITHIN): a one-seed sweep still names one where its epochs separate it. There, a configuration that
    differs from the fastest only in factors whose time pairs disagree in direction is not separated from it: those
    pairs show trials differing beyond their epochs' noise."""
    finished = included(report.trials)
    per_trial = {
        i: [
            report.time_logs[name]
            for name in config_members(finished, report.factors, configs.loc[i])["trial"]
            if name in report.time_logs
        ]
        for i in configs.index
    }
    means = pd.Series({i: statistics.fmean(statistics.fmean(t) for t in ts) for i, ts in per_trial.items() if ts})
    if not len(means):
        return None
    repeated = [[statistics.fmean(t) for t in ts] for ts in per_trial.values() if len(ts) >= 2]
    if repeated:
        dof = sum(len(r) - 1 for r in repeated)
        ss = sum((x - statistics.fmean(r)) ** 2 for r in repeated for x in r)
        counts = pd.Series({i: len(per_trial[i]) for i in means.index})
        basis, noise = "seed noise of the log time per epoch", "the seed noise"
    else:
        epochs = [t for ts in per_trial.values() for t in ts]
        dof = sum(len(t) - 1 for t in epochs)
        ss = sum((x - statistics.fmean(t)) ** 2 for t in epochs for x in t)
        counts = pd.Series({i: sum(len(t) for t in per_trial[i]) for i in means.index})
        basis, noise = WITHIN, "the epoch-to-epoch noise"
    within = leaders(means, counts, "min", math.sqrt(ss / dof) if dof else math.nan, dof)
    if basis == WITHIN and within:
        unsettled = [k for k in report.factors if (report.time_effects[k]["basis"] == PAIRS_DISAGREE).any()]
        best = means.idxmin()
        for i in means.index:
            differs = [k for k in report.factors if not same_value(configs.loc[i, k], configs.loc[best, k])]
            if i not in within and differs and set(differs) <= set(unsettled):
                within.append(i)
        if unsettled:
            noise += f" (and the trial-to-trial noise {', '.join(unsettled)}'s disagreeing pairs show)"
    ranked = tuple(means.sort_values().index)
    return Leaders(
        ranked,
        None if within is None else tuple(within),
        f"by the geometric mean of warm epochs; noise: {basis}",
        noise,
    )


def rank_configs(report: Ranked) -> dict[str, Leaders]:
    """Every ranking the findings name leaders of (BEST where the sweep's metric is not final test accuracy,
    FASTEST, MOST_ACCURATE, LEAST_MEMORY), over the configurations with a finished trial; {} with fewer than two."""
    configs = report.configs[report.configs["n"] > 0]
    if len(configs) < 2:
        return {}
    ranked = {}
    best = report.objective
    if best != FACTOR_METRICS[0]:
        ranked[BEST] = _rank_by(report, configs, best, f"by the sweep's metric: {best_phrase(best)}")
    if (fastest := _rank_fastest(report, configs)) is not None:
        ranked[FASTEST] = fastest
    ranked[MOST_ACCURATE] = _rank_by(report, configs, FACTOR_METRICS[0])
    # by the total (what running the configuration costs) where every configuration logged one
    by_total = report.memory_column == FACTOR_METRICS[5].column
    ranked[LEAST_MEMORY] = _rank_by(
        report,
        configs,
        FACTOR_METRICS[5] if by_total else FACTOR_METRICS[4],
        "by the peak total over workers"
        if by_total
        else "by the peak per worker: not every configuration logged a total",
    )
    return ranked
