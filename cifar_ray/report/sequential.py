"""Repeated looks at a sweep's comparisons that stay valid however the looks end (`sweep --until-settled`).

Looking at the data after every round of seeds and stopping once a test passes inflates the false positives: at a
fixed level α per look, a comparison with no effect passes at one of K looks far more often than α. The procedure
here is a Bonferroni alpha-spending: the sweep fixes, before it starts, at most K looks (one per seed count a
comparison can be judged at: from the file's seeds to --max-seeds, K = max − first + 1) and m accuracy
comparisons, and tests each comparison at each look at the level α / (m·K), both its tests: "real effect" (t-test of
no difference) and "equivalent" (TOST against the margin). A comparison is judged at most once per seed count, so
over the whole sweep the chance of any false "real effect" (or of any false "equivalent") is at most
m·K · α / (m·K) = α, whatever the data decide about when to stop; tests/test_settle.py simulates it. The price is
its conservatism (Pocock's and O'Brien-Fleming's boundaries, tuned to the correlation between looks, are less
strict, but need that correlation modelled).

Pure functions; the statistics are verdicts.py's (p_differs, p_equivalent, pairs_needed). Also the comparisons
the looks judge (Comparison); report/judge.py gives a report of such a run the looks' verdicts (apply_looks), never a
single-look one beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .effects import DIFFERS, EQUIVALENT, NO_VERDICT, OPEN
from .format import fmt_value, same_value
from .verdicts import ALPHA, MIN_PAIRS, p_differs, p_equivalent

if TYPE_CHECKING:
    import pandas as pd

PROCEDURE = "Bonferroni alpha-spending over looks and comparisons"


def max_looks(first_seeds: int, max_seeds: int) -> int:
    """The most looks a comparison can get: one per seed count from `first_seeds` to `max_seeds`, each round adding
    at least one seed to every configuration of a comparison still open."""
    return max_seeds - first_seeds + 1


def look_level(comparisons: int, looks: int, alpha: float = ALPHA) -> float:
    """The level of each test at each look: α spent evenly over `comparisons` x `looks`."""
    return alpha / (max(comparisons, 1) * max(looks, 1))


def look_verdict(mean: float, se: float, n_pairs: int, margin: float, level: float) -> str:
    """A comparison at one look: DIFFERS (the t-test of no difference below `level`), EQUIVALENT (TOST within
    ±`margin` below `level`), OPEN, or NO_VERDICT below MIN_PAIRS pairs (or without a spread)."""
    if n_pairs < MIN_PAIRS or math.isnan(se) or math.isnan(mean):
        return NO_VERDICT
    if p_differs(mean, se, n_pairs - 1) < level:
        return DIFFERS
    if p_equivalent(mean, se, n_pairs - 1, margin) < level:
        return EQUIVALENT
    return OPEN


def describe(comparisons: int, looks: int, alpha: float = ALPHA) -> str:
    """The procedure and its guarantee in one sentence, for the report and the docs."""
    level = look_level(comparisons, looks, alpha)
    return (
        f"{PROCEDURE}: at most {looks} look{'s' * (looks != 1)} at {comparisons} "
        f"comparison{'s' * (comparisons != 1)}, each test at α = {alpha:g} / {comparisons * looks} = {level:.3g}, so "
        f"the chance of any false real effect (or any false equivalence) in the sweep stays at most {alpha:g}"
    )


@dataclass(frozen=True)
class Comparison:
    factor: str
    value: Any  # a grid label
    baseline: Any

    @property
    def label(self) -> str:
        return f"{self.factor}={fmt_value(self.value)} vs {fmt_value(self.baseline)}"


def comparisons(grid: dict[str, list], baseline: dict[str, Any]) -> list[Comparison]:
    """Every accuracy comparison of a grid: each factor's other values against its baseline, in grid order."""
    return [
        Comparison(key, value, baseline[key])
        for key, values in grid.items()
        if key != "seed"
        for value in values
        if not same_value(value, baseline[key])
    ]


def grid_comparisons(grid: dict[str, list]) -> list[Comparison]:
    """The comparisons of a sweep's grid against its default baseline (each factor's first value), as its report
    makes them: what --until-settled's levels are spent over."""
    return comparisons(grid, {key: values[0] for key, values in grid.items() if key != "seed"})


def look_text(row: pd.Series) -> str:
    """Which look gave an accuracy effect's verdict (apply_looks): ` at 3 seeds (look 1 of --until-settled)`, or
    ` (look 2 of --until-settled)` for one it left open; "" where no look judged it."""
    if not row.get("look"):
        return ""
    at = f" at {int(row['look_seeds'])} seeds" if row["verdict"] not in (OPEN, NO_VERDICT) else ""
    return f"{at} (look {int(row['look'])} of --until-settled)"
