"""What the report may conclude from its accuracy effects and its rankings, and no more.

An accuracy effect (stats.paired_effects, its interval widened by the shared test set's noise: report/testset.py) gets a
verdict only from MIN_PAIRS pairs: "CI excludes 0" (a two-sided t-test), "equivalent within ±m" (two one-sided tests
against the margin m), else "not conclusive"; both tests are Holm-corrected across the report's accuracy comparisons. A
comparison left open says how many pairs would resolve it at its observed effect and spread (pairs_needed), where a mean
over k pairs has the variance s² / k + T: s² the spread of one pair's difference over seeds, T the shared test set's
part (the effects frame's testset_var), which more seeds do not shrink; when T alone keeps it open, no number of seeds
settles it (settles_with_seeds). The seeds to add allow for the pairs lost so far and count the unfinished ones as still
to run, neither done nor lost (more_seeds). A ranking ("Fastest", "Most accurate", "Least memory") names a winner only
where it beats the seed noise (leaders).

A time or memory effect (stats.ratio_effects: a ratio of geometric means, on the log scale) is judged the same way in
a family of its own (judge_ratios): from MIN_PAIRS − 1 degrees of freedom, "faster"/"slower" (less/more memory), "no
difference within ±5 %" (TOST against ±log 1.05), else "not conclusive"; a comparison with a pair of one trial that
shared a device and one that did not is "unfair" and not judged. Every judged effect carries the interval its
verdict used (verdict_intervals): at 1 − α/h, h its Holm multiplier, or for an equivalence 1 − 2α/h (90 % for h = 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from .stats import PAIRS_DISAGREE, t_quantile, t_upper

MIN_PAIRS = 3
ALPHA = 0.05  # family-wise, over the report's accuracy comparisons (Holm)
DEFAULT_MARGIN_PP = 1.0  # equivalence margin of accuracy effects, percentage points (cifar-ray report --margin)
# Equivalence margin of time and memory effects: a ratio within 1/1.05 .. 1.05 is "no difference" (on the log scale
# the margin is ±log 1.05, symmetric: 5 % slower and 1/1.05 faster weigh alike).
RATIO_MARGIN = 0.05
MAX_PAIRS = 1000  # pairs_needed looks no further
MAX_TEST_GROWTH = 10_000  # testset_growth_needed looks no further

NO_PAIRS, NO_VERDICT, DIFFERS, EQUIVALENT, OPEN = (
    "no matched pairs",
    "no verdict",
    "CI excludes 0",
    "equivalent",
    "not conclusive",
)
LOWER, HIGHER, UNFAIR = "lower", "higher", "unfair"  # a ratio effect that differs: below or above 1


def p_differs(mean: float, se: float, df: int) -> float:
    """Two-sided p of the t-test of mean = 0."""
    if se == 0:
        return 0.0 if mean else 1.0
    return min(1.0, 2 * t_upper(abs(mean) / se, df))


def p_equivalent(mean: float, se: float, df: int, margin: float) -> float:
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


def judge(effects: Sequence[pd.DataFrame], margin: float, seeds: int, level: float | None = None) -> list[pd.DataFrame]:
    """The accuracy effects of every factor with their verdicts, judged as one family: p_differs, p_equivalent,
    both Holm-adjusted (_holm), verdict, and for an open comparison: testset_limited (no number of seeds settles
    it) and testset_growth (how many times larger a test set would let seeds settle it), else pairs_needed, more_seeds
    and the survival they allow for (more_seeds()), at the strictest Holm level, ALPHA / the comparisons with any
    pair. `level` (sweep --until-settled: report/sequential.py's look_level): every test at that level instead,
    already spent over the comparisons and looks, so no Holm: the _holm columns are then p x ALPHA / level."""
    frames = [frame.copy() for frame in effects]
    tested = [(f, i) for f, frame in enumerate(frames) for i in frame.index if frame.loc[i, "n_pairs"] >= MIN_PAIRS]
    family = max(sum(int((frame["n_pairs"] > 0).sum()) for frame in frames), 1)  # once each has enough pairs
    for frame in frames:
        for column in ("p_differs", "p_equivalent", "p_differs_holm", "p_equivalent_holm", "pairs_needed"):
            frame[column] = math.nan
        frame["more_seeds"] = math.nan
        frame["survival"] = math.nan
        frame["testset_limited"] = False
        frame["testset_growth"] = math.nan
        frame["verdict"] = ""
    for f, i in tested:
        row = frames[f].loc[i]
        df = int(row["n_pairs"]) - 1
        frames[f].loc[i, "p_differs"] = p_differs(row["mean_diff"], row["se"], df)
        frames[f].loc[i, "p_equivalent"] = p_equivalent(row["mean_diff"], row["se"], df, margin)
    for test in ("p_differs", "p_equivalent"):
        pvalues = [frames[f].loc[i, test] for f, i in tested]
        adjusted = holm(pvalues) if level is None else [min(1.0, p * ALPHA / level) for p in pvalues]
        for (f, i), p in zip(tested, adjusted):
            frames[f].loc[i, f"{test}_holm"] = p
    for frame in frames:
        for i, row in frame.iterrows():
            n = row["n_pairs"]
            if n == 0:
                frame.loc[i, "verdict"] = NO_PAIRS
                continue
            if n < MIN_PAIRS:
                frame.loc[i, "verdict"] = NO_VERDICT
            elif row["p_differs_holm"] < ALPHA:
                frame.loc[i, "verdict"] = DIFFERS
                continue
            elif row["p_equivalent_holm"] < ALPHA:
                frame.loc[i, "verdict"] = EQUIVALENT
                continue
            else:
                frame.loc[i, "verdict"] = OPEN
            if n < 2:
                continue
            strictest = ALPHA / family if level is None else level
            if not settles_with_seeds(row["mean_diff"], row["testset_var"], margin, strictest):
                frame.loc[i, "testset_limited"] = True
                frame.loc[i, "testset_growth"] = testset_growth_needed(
                    row["mean_diff"], row["testset_var"], margin, strictest
                )
                continue
            needed = pairs_needed(row["mean_diff"], row["std_diff"] ** 2, margin, strictest, row["testset_var"])
            if needed is not None:
                frame.loc[i, "pairs_needed"] = needed
                frame.loc[i, ["more_seeds", "survival"]] = more_seeds(needed, row, seeds)
    return frames


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


def verdict_intervals(
    frames: Sequence[pd.DataFrame], mean: str, df: str | None = None, level: float | None = None
) -> None:
    """Add to each judged frame the interval its verdict used, on the scale of `mean` (`df`: the column of degrees
    of freedom; n_pairs − 1 without): vci_level (0.95, 0.975, ...), vci_tost (the 1 − 2α/h interval of an
    equivalence), vci_holm (the Holm multiplier h > 1 widened it), vci_low, vci_high. Outside the family (no
    verdict) the plain 95 % interval. vci_note says why an interval that excludes 0 stands beside no verdict (too
    few pairs or epochs) or "not conclusive" (Holm's step-down stopped at a smaller p). `level` (judge's): every
    judged effect's interval at 1 − level (1 − 2 level for an equivalence), no Holm, and a vci_looks column."""
    tested = [
        (f, i) for f, frame in enumerate(frames) for i in frame.index if not math.isnan(frame.loc[i, "p_differs"])
    ]
    h_differs = dict(zip(tested, holm_multipliers([frames[f].loc[i, "p_differs"] for f, i in tested])))
    h_equivalent = dict(zip(tested, holm_multipliers([frames[f].loc[i, "p_equivalent"] for f, i in tested])))
    for f, frame in enumerate(frames):
        for column in ("vci_level", "vci_low", "vci_high"):
            frame[column] = math.nan
        frame["vci_tost"], frame["vci_holm"], frame["vci_note"] = False, False, ""
        if level is not None:
            frame["vci_looks"] = False
        for i, row in frame.iterrows():
            dof = int(row[df]) if df else int(row["n_pairs"]) - 1
            if dof < 1 or math.isnan(row["se"]):
                continue
            tost = row["verdict"] == EQUIVALENT
            h = (h_equivalent if tost else h_differs).get((f, i), 1)
            looks = level is not None and (f, i) in h_differs
            coverage = 1 - (2 if tost else 1) * (level if looks else ALPHA / h)
            half = t_quantile((1 + coverage) / 2, dof) * row["se"]
            frame.loc[i, ["vci_level", "vci_low", "vci_high"]] = [coverage, row[mean] - half, row[mean] + half]
            frame.loc[i, "vci_tost"], frame.loc[i, "vci_holm"] = tost, h > 1 and not looks
            if looks:
                frame.loc[i, "vci_looks"] = True
            if abs(row[mean]) > half and row["verdict"] in (OPEN, NO_VERDICT):
                if row["verdict"] == NO_VERDICT:
                    frame.loc[i, "vci_note"] = (
                        f"{dof} degree{'s' if dof != 1 else ''} of freedom {'are' if dof != 1 else 'is'} too few to "
                        "judge by"
                    )
                else:  # with looks: the look was taken before the pairs its interval now has
                    frame.loc[i, "vci_note"] = (
                        "its last look came before some of these pairs: the next look judges them"
                        if looks
                        else "Holm's step-down stopped at a smaller p before this one"
                    )


def judge_ratios(effects: Sequence[pd.DataFrame], margin: float = RATIO_MARGIN) -> list[pd.DataFrame]:
    """The ratio effects (stats.ratio_effects) of one cost over every factor, judged as one family (Holm): p_differs
    and p_equivalent of the mean log ratio (against ±log(1 + margin)), Holm-adjusted, and verdict: LOWER / HIGHER
    (the ratio below / above 1), EQUIVALENT, OPEN (also where one seed's pairs disagree in direction: PAIRS_DISAGREE),
    NO_VERDICT (fewer than MIN_PAIRS − 1 degrees of freedom),
    NO_PAIRS, or UNFAIR (a pair of a trial that shared a device and one that did not); then verdict_intervals."""
    frames = [frame.copy() for frame in effects]
    log_margin = math.log1p(margin)
    for frame in frames:
        for column in ("p_differs", "p_equivalent", "p_differs_holm", "p_equivalent_holm"):
            frame[column] = math.nan
        frame["verdict"] = ""
        for i, row in frame.iterrows():
            if row["n_pairs"] == 0:
                frame.loc[i, "verdict"] = NO_PAIRS
            elif row["unfair"]:
                frame.loc[i, "verdict"] = UNFAIR
            elif row["basis"] == PAIRS_DISAGREE:
                frame.loc[i, "verdict"] = OPEN
            elif row["df"] < MIN_PAIRS - 1 or math.isnan(row["se"]):
                frame.loc[i, "verdict"] = NO_VERDICT
            else:
                frame.loc[i, "p_differs"] = p_differs(row["log_ratio"], row["se"], int(row["df"]))
                frame.loc[i, "p_equivalent"] = p_equivalent(row["log_ratio"], row["se"], int(row["df"]), log_margin)
    tested = [
        (f, i) for f, frame in enumerate(frames) for i in frame.index if not math.isnan(frame.loc[i, "p_differs"])
    ]
    for test in ("p_differs", "p_equivalent"):
        for (f, i), p in zip(tested, holm([frames[f].loc[i, test] for f, i in tested])):
            frames[f].loc[i, f"{test}_holm"] = p
    for f, i in tested:
        row = frames[f].loc[i]
        if row["p_differs_holm"] < ALPHA:
            verdict = LOWER if row["log_ratio"] < 0 else HIGHER
        else:
            verdict = EQUIVALENT if row["p_equivalent_holm"] < ALPHA else OPEN
        frames[f].loc[i, "verdict"] = verdict
    verdict_intervals(frames, "log_ratio", "df")
    for frame in frames:  # back from the log scale
        frame["vci_low"], frame["vci_high"] = frame["vci_low"].map(math.exp), frame["vci_high"].map(math.exp)
    return frames
