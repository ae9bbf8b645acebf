"""Interactions: whether a factor's paired effect differs across the values of the other factors, on every compared
metric (metrics.COMPARED), instead of being averaged over them (adam +2 pp at batch 64 and −2 pp at batch 512 is no
effect on average, and not "equivalent"; a second worker 1.4x slower at batch 32 and 1.7x faster at batch 512 is not
"1.1x faster").

For each metric, each factor A and each of its non-baseline values v, the pairs of A=v vs A's baseline (the metric's
evidence: stats.paired_effects or stats.ratio_effects, run on the trials of one stratum) are split into strata: by the
values of each other factor B, and, where A has two or more other factors, by every combination of their values (the
cells: a pattern in one cell of batch_size x amp is not averaged away by two one-factor splits). The test is an
F-type test of equal stratum means: F = Σ w_s (m_s − m̄)² / (k − 1) with w_s = 1 / (s_p² / n_s + t_s), m̄ the
w-weighted mean, s_p² the pair differences' variance pooled within the strata (Σ (n_s − 1) degrees of freedom), t_s
the test set's part of the stratum mean's variance (accuracy only), against F(k − 1, Σ (n_s − 1)): with t_s = 0
one-way ANOVA, with two strata the pooled two-sample t-test. TESTABLE_RULE says which strata enter;
the p-values of every tested interaction of one metric are Holm-adjusted together (verdicts.holm). The judge
(report/judge.py) reads a significant one as "depends" and judges the effect per cell (`cells`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from scipy.stats import f as snedecor_f

from .format import fmt_value, same_value
from .stats import rows_with
from .verdicts import ALPHA, holm

MIN_STRATUM_PAIRS = 2
TESTABLE_RULE = (
    f"A value of the other factors (a stratum) enters the test with {MIN_STRATUM_PAIRS} or more pairs, so that every "
    "tested stratum shows its own spread; an interaction is tested when at least two strata enter. With one seed "
    "per configuration each cell holds one pair (no replication): a pattern across cells cannot be told from the "
    "trial-to-trial noise, so it cannot be tested (a trial's epoch noise knows nothing of another seed)."
)

DEPENDS, NO_EVIDENCE, UNTESTABLE = "depends", "no evidence", "cannot be tested"

TEST_COLUMNS = (
    "metric",
    "factor",
    "value",
    "baseline",
    "by",
    "strata",
    "tested",
    "df1",
    "df2",
    "F",
    "p",
    "p_holm",
    "result",
)
STRATUM_COLUMNS = ("metric", "factor", "value", "by", "stratum", "n_pairs", "estimate", "ci_low", "ci_high", "tested")

# (one stratum's trials, a factor) -> that factor's effect rows on one metric (stats.paired_effects, ratio_effects)
Evidence = Callable[[pd.DataFrame, str], pd.DataFrame]


@dataclass(frozen=True)
class Interactions:
    tests: pd.DataFrame  # one row per (metric, factor, value, by): TEST_COLUMNS; `by` a tuple of factors
    strata: pd.DataFrame  # one row per stratum with a pair: STRATUM_COLUMNS; `stratum` a dict {factor: value}
    # (metric, factor) -> each cell of the other factors (a dict) with the factor's effect rows in it: what the judge
    # judges per cell where an effect depends on the others
    cells: dict[tuple[str, str], list[tuple[dict, pd.DataFrame]]] = field(default_factory=dict)


def f_upper(f: float, df1: float, df2: float) -> float:
    """P(F > f) for Snedecor's F with df1, df2 degrees of freedom."""
    return float(snedecor_f.sf(f, df1, df2))


def stratum_evidence(row: pd.Series, unit: str) -> dict:
    """One effect row (stats.paired_effects' for unit "pp", ratio_effects' for "ratio") as strata_test reads it: the
    mean pair difference on the tested scale (a fraction, or a log ratio), its spread, the test set's part;
    `estimate`, `ci_low`, `ci_high` on the scale of effects.Effect (pp, or ratio)."""
    if unit == "pp":
        return {
            "n_pairs": int(row["n_pairs"]),
            "mean_diff": row["mean_diff"],
            "std_diff": row["std_diff"],
            "testset_var": row["testset_var"],
            "estimate": 100 * row["mean_diff"],
            "ci_low": 100 * row["ci_low"],
            "ci_high": 100 * row["ci_high"],
        }
    logs = [math.log(r) for r in row["pair_ratios"]]
    return {
        "n_pairs": int(row["n_pairs"]),
        "mean_diff": row["log_ratio"],
        "std_diff": statistics.stdev(logs) if len(logs) > 1 else math.nan,
        "testset_var": 0.0,
        "estimate": row["ratio"],
        "ci_low": row["ci_low"],
        "ci_high": row["ci_high"],
    }


def strata_test(strata: pd.DataFrame) -> tuple[int, int, float, float, pd.Series]:
    """The F-type test of equal means over stratum rows (n_pairs, mean_diff, std_diff, testset_var) that
    TESTABLE_RULE admits: (df1, df2, F, p, which rows entered); NaN F and p when fewer than two strata enter."""
    entered = strata["n_pairs"] >= MIN_STRATUM_PAIRS
    rows = strata[entered]
    k = len(rows)
    if k < 2:
        return 0, 0, math.nan, math.nan, entered
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
    return k - 1, df2, f, f_upper(f, k - 1, df2), entered


def _strata(grid: dict[str, list], by: Sequence[str]) -> list[dict]:
    """Every combination of the values of the factors `by`, as {factor: value}."""
    combos: list[dict] = [{}]
    for factor in by:
        combos = [combo | {factor: value} for combo in combos for value in grid[factor]]
    return combos


def _in_stratum(trials: pd.DataFrame, stratum: Mapping[str, Any]) -> pd.DataFrame:
    for factor, value in stratum.items():
        trials = rows_with(trials, factor, value)
    return trials


def find_interactions(
    trials: pd.DataFrame,
    factors: Sequence[str],
    grid: dict[str, list],
    baseline: dict[str, Any],
    evidence: Mapping[str, tuple[str, Evidence]],
) -> Interactions:
    """Every interaction of each factor with the others (module docstring), on each metric of `evidence`
    (metric name -> (its unit, its Evidence)): tested, and Holm-adjusted together per metric."""
    tests, strata, cells = [], [], {}
    for metric, (unit, effects_of) in evidence.items():
        first = len(tests)
        for key in factors:
            others = [f for f in factors if f != key]
            splits = [(by,) for by in others] + ([tuple(others)] if len(others) >= 2 else [])
            values = [v for v in grid[key] if not same_value(v, baseline[key])]
            for by in splits:
                per_stratum = [(s, effects_of(_in_stratum(trials, s), key)) for s in _strata(grid, by)]
                if by == tuple(others):
                    cells[(metric, key)] = per_stratum
                for i, value in enumerate(values):
                    rows = pd.DataFrame([stratum_evidence(frame.iloc[i], unit) for _, frame in per_stratum]).assign(
                        stratum=[s for s, _ in per_stratum]
                    )
                    df1, df2, f, p, entered = strata_test(rows)
                    tests.append(
                        {
                            "metric": metric,
                            "factor": key,
                            "value": value,
                            "baseline": baseline[key],
                            "by": by,
                            "strata": int((rows["n_pairs"] > 0).sum()),
                            "tested": int(entered.sum()),
                            "df1": df1,
                            "df2": df2,
                            "F": f,
                            "p": p,
                        }
                    )
                    for (_, row), enters in zip(rows.iterrows(), entered):
                        if row["n_pairs"] > 0:
                            strata.append(
                                {"metric": metric, "factor": key, "value": value, "by": by}
                                | {c: row[c] for c in ("stratum", "n_pairs", "estimate", "ci_low", "ci_high")}
                                | {"tested": bool(enters)}
                            )
        done = [i for i in range(first, len(tests)) if not math.isnan(tests[i]["p"])]
        for i, p in zip(done, holm([tests[i]["p"] for i in done])):
            tests[i]["p_holm"] = p
    frame = pd.DataFrame(tests, columns=list(TEST_COLUMNS[:-1]))
    frame["result"] = [
        UNTESTABLE if math.isnan(p) else DEPENDS if p_holm < ALPHA else NO_EVIDENCE
        for p, p_holm in zip(frame["p"], frame["p_holm"])
    ]
    return Interactions(frame, pd.DataFrame(strata, columns=STRATUM_COLUMNS), cells)


def dependencies(interactions: Interactions, metric: str, key: str, value: Any) -> tuple[str, ...]:
    """The factors on which the effect of `key`=`value` on `metric` significantly depends: those whose own split
    shows it; where only the split by every other factor at once does, all of them (a pattern of their cells)."""
    tests = interactions.tests
    chosen = tests[(tests["metric"] == metric) & (tests["factor"] == key) & (tests["result"] == DEPENDS)]
    found = [row["by"] for _, row in chosen.iterrows() if same_value(row["value"], value)]
    singles = tuple(by[0] for by in found if len(by) == 1)
    return singles or (found[0] if found else ())


def stratum_label(stratum: Mapping[str, Any]) -> str:
    """`batch_size=64, amp=off`."""
    return ", ".join(f"{factor}={fmt_value(value)}" for factor, value in stratum.items())


def by_label(by: Sequence[str]) -> str:
    """`batch_size`, or `batch_size x amp` for a split by several factors' cells."""
    return " x ".join(by)
