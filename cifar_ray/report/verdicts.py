"""The statistics behind the report's verdicts (report/judge.py gives the verdicts): the t-tests of a difference and
of an equivalence (p_differs, p_equivalent), Holm's step-down (holm, holm_multipliers), how many pairs or seeds would
resolve an open comparison, and which configurations lead beyond the noise.

A comparison left open says how many pairs would resolve it at its observed effect and spread (pairs_needed), where a
mean over k pairs has the variance s² / k + T: s² the spread of one pair's difference over seeds, T the shared test
set's part (the effects frame's testset_var), which more seeds do not shrink; when T alone keeps it open, no number of
seeds settles it (settles_with_seeds). The seeds to add allow for the pairs lost so far and count the unfinished ones
as still to run, neither done nor lost (more_seeds). A ranking ("Fastest", "Most accurate", "Least memory") names a
winner only where it beats the seed noise (leaders)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from .format import fmt_value
from .stats import t_quantile, t_upper

MIN_PAIRS = 3
ALPHA = 0.05  # family-wise, over the report's accuracy comparisons (Holm)
DEFAULT_MARGIN_PP = 1.0  # equivalence margin of accuracy effects, percentage points (cifar-ray report --margin)
# Equivalence margin of time and memory effects: a ratio within 1/1.05 .. 1.05 is "no difference" (on the log scale
# the margin is ±log 1.05, symmetric: 5 % slower and 1/1.05 faster weigh alike).
RATIO_MARGIN = 0.05
RATIO_BAND = f"±{fmt_value(round(100 * RATIO_MARGIN, 6))} %"  # that band, as the report writes it
MAX_PAIRS = 1000  # pairs_needed looks no further
MAX_TEST_GROWTH = 10_000  # testset_growth_needed looks no further


def p_differs(mean: float, se: float, df: float) -> float:
    """Two-sided p of the t-test of mean = 0."""
    if se == 0:
        return 0.0 if mean else 1.0
    return min(1.0, 2 * t_upper(abs(mean) / se, df))


def p_equivalent(mean: float, se: float, df: float, margin: float) -> float:
    """p of two one-sided t-tests (TOST) that the mean lies within ±margin: the larger of the two."""
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    return max(t_upper((mean + margin) / se, df), t_upper((margin - mean) / se, df))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the given order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def _resolved(mean: float, var_pair: float, pairs: int, margin: float, alpha: float, testset_var: float = 0.0) -> bool:
    se = math.sqrt(var_pair / pairs + testset_var)
    return p_differs(mean, se, pairs - 1) < alpha or p_equivalent(mean, se, pairs - 1, margin) < alpha


def settles_with_seeds(mean: float, testset_var: float, margin: float, alpha: float) -> bool:
    """Whether seeds alone could resolve an effect `mean` at level `alpha`: with the seed spread averaged away
    (MAX_PAIRS pairs of none), the test set's part `testset_var` of its variance still lets it resolve."""
    return _resolved(mean, 0.0, MAX_PAIRS, margin, alpha, testset_var)


def pairs_needed(mean: float, var_pair: float, margin: float, alpha: float, testset_var: float = 0.0) -> int | None:
    """The fewest pairs (at least MIN_PAIRS) at which an effect `mean` with per-pair variance `var_pair` over seeds
    and the test set's unshrinking part `testset_var` would be resolved, either way, at level `alpha`; None beyond
    MAX_PAIRS."""
    if math.isnan(mean) or math.isnan(var_pair):
        return None
    if not _resolved(mean, var_pair, MAX_PAIRS, margin, alpha, testset_var):
        return None
    low, high = MIN_PAIRS, MAX_PAIRS  # resolved at high; more pairs never resolve less
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if _resolved(mean, var_pair, mid, margin, alpha, testset_var) else (mid + 1, high)
    return low


def testset_growth_needed(mean: float, testset_var: float, margin: float, alpha: float) -> float | None:
    """By how many times the test set must grow (its variance goes as 1 / its images) before seeds could resolve an
    effect `mean` whose test-set variance is `testset_var`: at least 1; None beyond MAX_TEST_GROWTH."""
    if not settles_with_seeds(mean, testset_var / MAX_TEST_GROWTH, margin, alpha):
        return None
    low, high = 1.0, float(MAX_TEST_GROWTH)
    for _ in range(60):
        mid = math.sqrt(low * high)
        low, high = (low, mid) if settles_with_seeds(mean, testset_var / mid, margin, alpha) else (mid, high)
    return high


def more_seeds(needed: int, row: pd.Series, seeds: int) -> tuple[int, float]:
    """Seeds to add to every grid point for `needed` pairs of the effect `row` (n_pairs, n_planned, n_open), and the
    survival they assume: the share of this comparison's ended pairs that were included (3 of 6 diverged: 1/2, twice
    the seeds). Each seed adds n_planned / `seeds` pairs; the n_open unfinished ones run too, and both lose pairs at
    that rate."""
    n, planned, unfinished = int(row["n_pairs"]), int(row["n_planned"]), int(row["n_open"])
    survival = n / (planned - unfinished)
    per_seed = max(planned / seeds, 1)
    return max(0, math.ceil(((needed - n) / survival - unfinished) / per_seed)), survival


def leaders(
    means: pd.Series,
    counts: pd.Series,
    better: str,
    std: float,
    dof: int,
    pair_var: Callable[[Any, Any], float] | None = None,
) -> list | None:
    """The index of the best of `means` and of every other one its lead does not clear: a difference beats the noise
    when it exceeds the t 95 % half-width of sqrt(std²/n_a + std²/n_b (+ pair_var(a, b))), `std` the pooled seed
    noise with `dof` degrees of freedom, `pair_var` a part of the difference's variance that seeds do not average
    away (an accuracy's shared test set: testset.testset_var). None when the seed noise is unknown (dof 0)."""
    means = means.dropna()
    if not len(means):
        return []
    if not dof:
        return None
    best = means.idxmax() if better == "max" else means.idxmin()
    quantile = t_quantile(0.975, dof)
    within = []
    for i, mean in means.items():
        shared = pair_var(i, best) if pair_var is not None and i != best else 0.0
        noise = math.sqrt(std**2 / counts[i] + std**2 / counts[best] + shared)
        if i == best or abs(mean - means[best]) <= quantile * noise:
            within.append(i)
    return within


def holm_multipliers(pvalues: Sequence[float]) -> list[int]:
    """Holm's multiplier of each p-value, in the given order: the count of p-values from its own rank up (the
    smallest is tested at alpha / m, the next at alpha / (m − 1), ...)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    multipliers = [0] * len(pvalues)
    for rank, i in enumerate(order):
        multipliers[i] = len(pvalues) - rank
    return multipliers
