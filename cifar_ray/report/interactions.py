"""Interactions between factors: whether a factor's paired effect on final test accuracy differs across the values of
another factor, instead of being averaged over them (adam +2 pp at batch 64 and −2 pp at batch 512 is no effect on
average, and not "equivalent").

For each factor A, each of its non-baseline values v and each other factor B, the pairs of A=v vs A's baseline
(stats.paired_effects, run on the trials with B=b) are split by B's value b: a stratum per value. The test is an
F-type test of equal stratum means: F = Σ w_b (m_b − m̄)² / (k − 1) with w_b = 1 / (s_p² / n_b + t_b), m̄ the
w-weighted mean, s_p² the pair differences' variance pooled within the strata (Σ (n_b − 1) degrees of freedom: the
spread over seeds and the other factors' values), t_b the test set's part of the stratum mean's variance (what
paired_effects' se holds beyond the spread), against F(k − 1, Σ (n_b − 1)); with t_b = 0 this is one-way ANOVA, with
two strata the pooled two-sample t-test. TESTABLE_RULE says which strata enter; the p-values of every tested
interaction are Holm-adjusted together (verdicts.holm). A significant one names the factor's dependence, and its
pooled verdict never reads "equivalent" (mark_dependent)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .format import fmt_value, same_value
from .stats import Pairing, paired_effects, rows_with
from .testset import ImageScores
from .verdicts import ALPHA, EQUIVALENT, holm

MIN_STRATUM_PAIRS = 2
TESTABLE_RULE = (
    f"A value of the other factor (a stratum) enters the test with {MIN_STRATUM_PAIRS} or more pairs, so that every "
    "tested stratum shows its own spread; an interaction is tested when at least two strata enter. With one seed "
    "per configuration and two factors each stratum holds one pair (no replication): it cannot be tested."
)

DEPENDS, NO_EVIDENCE, UNTESTABLE = "depends", "no evidence", "cannot be tested"
DEPENDS_VERDICT = "depends on"  # the pooled verdict of an effect with a significant interaction, instead of EQUIVALENT

TEST_COLUMNS = ("factor", "value", "baseline", "by", "strata", "tested", "df1", "df2", "F", "p", "p_holm", "result")
STRATUM_COLUMNS = ("factor", "value", "by", "stratum", "n_pairs", "mean_diff", "ci_low", "ci_high", "tested")


@dataclass(frozen=True)
class Interactions:
    tests: pd.DataFrame  # one row per (factor, value, by): TEST_COLUMNS
    strata: pd.DataFrame  # one row per stratum with a pair: STRATUM_COLUMNS


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for numerator in (even, odd):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):  # where the fraction converges fast; else by symmetry
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def f_upper(f: float, df1: int, df2: int) -> float:
    """P(F > f) for Snedecor's F with df1, df2 degrees of freedom: I_{df2 / (df2 + df1 f)}(df2 / 2, df1 / 2)."""
    if f <= 0:
        return 1.0
    if math.isinf(f):
        return 0.0
    return incomplete_beta(df2 / 2, df1 / 2, df2 / (df2 + df1 * f))


def strata_test(strata: pd.DataFrame) -> tuple[int, int, float, float]:
    """The F-type test of equal means over stratum rows (n_pairs, mean_diff, std_diff, testset_var: paired_effects)
    that TESTABLE_RULE admits: (df1, df2, F, p); NaN F and p when fewer than two strata enter."""
    rows = strata[strata["n_pairs"] >= MIN_STRATUM_PAIRS]
    k = len(rows)
    if k < 2:
        return 0, 0, math.nan, math.nan
    n = rows["n_pairs"].astype(float)
    df2 = int((n - 1).sum())
    pooled = float(((n - 1) * rows["std_diff"] ** 2).sum() / df2)
    variance = pooled / n + rows["testset_var"]
    means = rows["mean_diff"].astype(float)
    if (variance == 0).any():  # no spread and no test-set noise: any difference is exact
        f = 0.0 if means.nunique() == 1 else math.inf
    else:
        weights = 1 / variance
        centre = float((weights * means).sum() / weights.sum())
        f = float((weights * (means - centre) ** 2).sum() / (k - 1))
    return k - 1, df2, f, f_upper(f, k - 1, df2)


def find_interactions(
    trials: pd.DataFrame, pairing: Pairing, column: str, per_image: Mapping[str, ImageScores] | None
) -> Interactions:
    """Every interaction of two of the pairing's factors on `column` (module docstring): the paired effect of each
    factor's values per value of each other factor (`per_image`: the trials' per-image scores, as paired_effects
    takes them), tested and Holm-adjusted together."""
    factors, grid, baseline = pairing.factors, pairing.grid, pairing.baseline
    tests, strata = [], []
    for key in factors:
        for by in factors:
            if by == key:
                continue
            per_stratum = {
                b: paired_effects(rows_with(trials, by, b), key, pairing, column, per_image) for b in grid[by]
            }
            for i, value in enumerate(v for v in grid[key] if not same_value(v, baseline[key])):
                rows = pd.DataFrame([per_stratum[b].iloc[i] for b in grid[by]]).assign(stratum=list(grid[by]))
                df1, df2, f, p = strata_test(rows)
                tested = (rows["n_pairs"] >= MIN_STRATUM_PAIRS) & (df1 > 0)
                tests.append(
                    {
                        "factor": key,
                        "value": value,
                        "baseline": baseline[key],
                        "by": by,
                        "strata": int((rows["n_pairs"] > 0).sum()),
                        "tested": int(tested.sum()),
                        "df1": df1,
                        "df2": df2,
                        "F": f,
                        "p": p,
                    }
                )
                for (_, row), enters in zip(rows.iterrows(), tested):
                    if row["n_pairs"] > 0:
                        strata.append(
                            {"factor": key, "value": value, "by": by, "stratum": row["stratum"], "tested": bool(enters)}
                            | {c: row[c] for c in ("n_pairs", "mean_diff", "ci_low", "ci_high")}
                        )
    frame = pd.DataFrame(tests, columns=[c for c in TEST_COLUMNS if c not in ("p_holm", "result")])
    done = frame["p"].notna()
    frame["p_holm"] = math.nan
    frame.loc[done, "p_holm"] = holm(frame.loc[done, "p"].tolist())
    frame["result"] = [
        UNTESTABLE if not ok else DEPENDS if p < ALPHA else NO_EVIDENCE for ok, p in zip(done, frame["p_holm"])
    ]
    return Interactions(frame, pd.DataFrame(strata, columns=STRATUM_COLUMNS))


def dependencies(interactions: Interactions, key: str, value: Any) -> list[str]:
    """The factors on which the effect of `key`=`value` significantly depends."""
    tests = interactions.tests
    chosen = tests[(tests["factor"] == key) & (tests["result"] == DEPENDS)]
    return [row["by"] for _, row in chosen.iterrows() if same_value(row["value"], value)]


def mark_dependent(effects: pd.DataFrame, key: str, interactions: Interactions) -> pd.DataFrame:
    """`key`'s judged accuracy effects with `depends_on` (the factors its effect depends on, comma-separated; "" for
    none), and DEPENDS_VERDICT instead of EQUIVALENT where it depends on any: equal on average is not equal."""
    frame = effects.copy()
    frame["depends_on"] = [", ".join(dependencies(interactions, key, v)) for v in frame[key]]
    frame.loc[(frame["verdict"] == EQUIVALENT) & (frame["depends_on"] != ""), "verdict"] = DEPENDS_VERDICT
    return frame


def stratum_label(by: str, stratum: Any) -> str:
    return f"{by}={fmt_value(stratum)}"
