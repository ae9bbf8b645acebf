"""Every verdict of the report, given in one place: evidence in (the effects frames of report/stats.py, the
interaction tests of report/interactions.py, the looks of `sweep --until-settled`, the trials' outcomes), one typed
`Effect` per comparison out (report/effects.py), pooled over the other factors and, where an effect depends on them,
per cell. judge_report is the only writer of a frame's `verdict`.

The rules, in the order they apply to one comparison:
1. FAILED: no pair, and every trial of the value ended without finishing (diverged, out of memory, failed): that is
   the answer ("lr=2.0 diverged in 3 of 3"), not a missing comparison; NO_PAIRS: no pair otherwise.
2. UNFAIR (time): a pair sets a trial that shared a device against one that ran alone.
3. The tests, each metric a Holm family of its own (accuracy: from MIN_PAIRS pairs, a t-test of no difference and two
   one-sided tests against ±margin; time and memory: the same on the log ratio from MIN_PAIRS − 1 degrees of freedom
   against ±log 1.05): DIFFERS, EQUIVALENT, OPEN, else NO_VERDICT. An accuracy comparison of a sweep run with
   --until-settled takes its looks' verdicts, judged at their level (report/sequential.py), never a single-look one.
4. DEPENDS: the comparison's interaction test (any split of the other factors, Holm within its metric) rejects equal
   effects across cells, unless the verdict is DIFFERS and every cell's effect points the same way (then only its
   size depends, and `depends_on` says so). The per-cell effects are judged as one more Holm family per metric.
5. NO_PRACTICAL (time and memory): a DIFFERS whose whole interval (the one the verdict used) lies inside the ±5 %
   band: the data show a change, too small to matter.
Every judged effect carries the interval its verdict used (verdict_intervals): at 1 − α/h, h its Holm multiplier, or
for an equivalence 1 − 2α/h (90 % for h = 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from .effects import (
    DEPENDS,
    DIFFERS,
    EQUIVALENT,
    FAILED,
    LEGACY_VERDICTS,
    NO_PAIRS,
    NO_PRACTICAL,
    NO_VERDICT,
    OPEN,
    UNFAIR,
    Effect,
    Interval,
)
from .format import fmt_value
from .interactions import Interactions, dependencies
from .metrics import COMPARED, Compared
from .sequential import Comparison
from .stats import (
    PAIRS_DISAGREE,
    Pairing,
    rows_with,
    t_quantile,
)
from .verdicts import (
    ALPHA,
    MIN_PAIRS,
    RATIO_MARGIN,
    holm,
    holm_multipliers,
    more_seeds,
    p_differs,
    p_equivalent,
    pairs_needed,
    settles_with_seeds,
    testset_growth_needed,
)


def fmt_dof(dof: float) -> str:
    """Degrees of freedom as the report writes them: whole, or to one decimal (a Satterthwaite df)."""
    return f"{dof:.0f}" if float(dof).is_integer() else f"{dof:.1f}"


def judge_differences(
    effects: Sequence[pd.DataFrame], margin: float, seeds: int, level: float | None = None
) -> list[pd.DataFrame]:
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
            dof = row[df] if df else int(row["n_pairs"]) - 1
            if not dof > 0 or math.isnan(row["se"]):
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
                    one = fmt_dof(dof) == "1"
                    frame.loc[i, "vci_note"] = (
                        f"{fmt_dof(dof)} degree{'' if one else 's'} of freedom {'is' if one else 'are'} too few to "
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
    and p_equivalent of the mean log ratio (against ±log(1 + margin)), Holm-adjusted, and verdict: DIFFERS
    (the ratio below or above 1), EQUIVALENT, OPEN (also where one seed's pairs disagree in direction: PAIRS_DISAGREE),
    NO_VERDICT (fewer than MIN_PAIRS − 1 degrees of freedom),
    NO_PAIRS, or UNFAIR (a pair of a trial that shared a device and one that did not)."""
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
                frame.loc[i, "p_differs"] = p_differs(row["log_ratio"], row["se"], row["df"])
                frame.loc[i, "p_equivalent"] = p_equivalent(row["log_ratio"], row["se"], row["df"], log_margin)
    tested = [
        (f, i) for f, frame in enumerate(frames) for i in frame.index if not math.isnan(frame.loc[i, "p_differs"])
    ]
    for test in ("p_differs", "p_equivalent"):
        for (f, i), p in zip(tested, holm([frames[f].loc[i, test] for f, i in tested])):
            frames[f].loc[i, f"{test}_holm"] = p
    for f, i in tested:
        row = frames[f].loc[i]
        if row["p_differs_holm"] < ALPHA:
            verdict = DIFFERS
        else:
            verdict = EQUIVALENT if row["p_equivalent_holm"] < ALPHA else OPEN
        frames[f].loc[i, "verdict"] = verdict
    return frames


def apply_looks(frames: dict[str, pd.DataFrame], baseline: dict[str, Any], settle: dict) -> None:
    """The verdicts of the looks (sweep.json's settle record) in the accuracy effects, judged at the looks' level: a
    comparison a look settled gets that look's verdict, kept since; one the last look left open is not conclusive (no
    verdict below MIN_PAIRS pairs), whatever pairs came after: only a look settles it. `look` and `look_seeds` say
    which look at how many seeds (0 where no look judged it: another --baseline's), `look_margin` the equivalence
    margin it judged by."""
    verdicts = settle["rounds"][-1]["verdicts"]
    for factor, frame in frames.items():
        frame["look"], frame["look_seeds"], frame["look_margin"] = 0, 0, settle.get("margin", math.nan)
        for i, row in frame.iterrows():
            recorded = verdicts.get(Comparison(factor, row[factor], baseline[factor]).label)
            if recorded is None:
                continue
            frame.loc[i, ["look", "look_seeds"]] = [recorded["round"], recorded["seeds"]]
            verdict = LEGACY_VERDICTS.get(recorded["verdict"], recorded["verdict"])
            if verdict != OPEN:
                frame.loc[i, "verdict"] = verdict
            elif row["verdict"] not in (NO_PAIRS, NO_VERDICT):
                frame.loc[i, "verdict"] = OPEN


FAILURES = ("failed", "diverged", "oom")  # trial outcomes that end a trial without a result


def failed_text(trials: pd.DataFrame, key: str, value: Any) -> str:
    """`diverged in 3 of 3` when every trial with `key`=`value` ended in a failure (FAILURES); "" otherwise."""
    outcomes = rows_with(trials, key, value)["outcome"]
    if not len(outcomes) or not outcomes.isin(FAILURES).all():
        return ""
    counts = ", ".join(f"{outcome} in {n}" for outcome, n in outcomes.value_counts().items())
    return f"{counts} of {len(outcomes)}"


def ci_label(row: pd.Series) -> str:
    """What the interval beside an effect is (verdict_intervals): `95 % CI`, `97.5 % CI, Holm`,
    `90 % CI, equivalence (TOST)`, `99.8 % CI, repeated looks` (sweep --until-settled's level)."""
    digits = 1
    while round(100 * row["vci_level"], digits) == 100 and digits < 6:  # 99.96 % is not 100 %
        digits += 1
    label = f"{round(100 * row['vci_level'], digits):g} % CI"
    extra = (["Holm"] if row["vci_holm"] else []) + (["equivalence (TOST)"] if row["vci_tost"] else [])
    extra += ["repeated looks"] if row.get("vci_looks") else []
    return ", ".join([label, *extra])


def _estimate(metric: Compared, row: pd.Series) -> float:
    return 100 * row["mean_diff"] if metric.unit == "pp" else row["ratio"]


def _interval(metric: Compared, row: pd.Series) -> Interval | None:
    if pd.isna(row.get("vci_level")):
        return None
    scale = 100 if metric.unit == "pp" else 1
    return Interval(scale * row["vci_low"], scale * row["vci_high"], float(row["vci_level"]), ci_label(row))


def _reason(metric: Compared, row: pd.Series, margin: float) -> str:
    """Why the row has its verdict, in a few words (the Markdown says it at length)."""
    verdict, pairs = row["verdict"], f"{int(row['n_pairs'])} pair{'s' * (int(row['n_pairs']) != 1)}"
    band = f"±{fmt_value(round(100 * margin, 6))} pp" if metric.unit == "pp" else f"±{RATIO_MARGIN:.0%}"
    if verdict == FAILED:
        return row["failed"]
    if verdict == NO_PAIRS:
        return row["lost"] or "no trial pair finished yet"
    if verdict == UNFAIR:
        return f"{len(row['unfair'])} of {pairs} set a trial that shared a device against one that ran alone"
    if verdict == DEPENDS:
        return f"its effect differs between cells of {', '.join(row['depends_on'])}"
    if verdict == NO_PRACTICAL:
        return f"its interval excludes no change but lies within {band}"
    if verdict == EQUIVALENT:
        return f"within {band} (two one-sided tests)"
    if verdict == DIFFERS:
        return "its interval excludes no change" + (
            f"; its size depends on {', '.join(row['depends_on'])}" if row.get("depends_on") else ""
        )
    if verdict == NO_VERDICT:
        return row.get("vci_note") or f"{pairs}: too few to judge by"
    return row.get("basis") if row.get("basis") == PAIRS_DISAGREE else f"{pairs}: neither a change nor {band} shown"


def _practical(metric: Compared, frame: pd.DataFrame) -> None:
    """Rule 5 (time and memory): a DIFFERS whose interval lies inside the ±5 % band is NO_PRACTICAL. Accuracy keeps
    DIFFERS: its margin is the user's equivalence margin (--margin), not a band of no interest."""
    if metric.unit == "pp":
        return
    low, high = 1 / (1 + RATIO_MARGIN), 1 + RATIO_MARGIN
    inside = (frame["verdict"] == DIFFERS) & (frame["vci_low"] >= low) & (frame["vci_high"] <= high)
    frame.loc[inside, "verdict"] = NO_PRACTICAL


def _test_family(
    metric: Compared, frames: Sequence[pd.DataFrame], margin: float, seeds: int, level: float | None = None
) -> list[pd.DataFrame]:
    """Rule 3's tests over one Holm family of a metric's effect frames."""
    return judge_differences(frames, margin, seeds, level) if metric.unit == "pp" else judge_ratios(frames)


def _finish_family(metric: Compared, frames: Sequence[pd.DataFrame], margin: float, level: float | None = None) -> None:
    """The interval each verdict used (verdict_intervals, on the metric's scale), then rule 5."""
    if metric.unit == "pp":
        verdict_intervals(frames, "mean_diff", level=level)
    else:
        verdict_intervals(frames, "log_ratio", "df")
        for frame in frames:  # back from the log scale
            frame["vci_low"], frame["vci_high"] = frame["vci_low"].map(math.exp), frame["vci_high"].map(math.exp)
    for frame in frames:
        _practical(metric, frame)


def _records(metric: Compared, key: str, baseline: Any, frame: pd.DataFrame, cell: dict, margin: float) -> list[Effect]:
    return [
        Effect(
            metric=metric.name,
            factor=key,
            value=row[key],
            baseline=baseline,
            cell=cell,
            pairs=int(row["n_pairs"]),
            pairs_lost=int(row["n_planned"] - row["n_pairs"] - row.get("n_open", 0)),
            lost_why=row["lost"],
            estimate=_estimate(metric, row),
            unit=metric.unit,
            interval=_interval(metric, row),
            verdict=row["verdict"],
            reason=_reason(metric, row, margin),
            depends_on=tuple(row["depends_on"]),
        )
        for _, row in frame.iterrows()
    ]


def judge_report(
    evidence: Mapping[str, Mapping[str, pd.DataFrame]],
    trials: pd.DataFrame,
    pairing: Pairing,
    interactions: Interactions,
    margin: float,
    looks: dict | None = None,
) -> tuple[dict[str, dict[str, pd.DataFrame]], tuple[Effect, ...]]:
    """Every verdict (module docstring), from `evidence` (metric name -> factor -> its effects frame, stats.py),
    the trials' outcomes, the pairing (its baselines and seeds), the `interactions` (interactions.find_interactions,
    with their per-cell frames), the accuracy margin (a fraction), and `looks` (sweep.json's settle record, when the
    sweep ran --until-settled). Returns the judged frames (metric name -> factor -> frame: what the Markdown
    details) and the effects, pooled first, then per cell."""
    level = looks["level"] if looks and looks.get("rounds") else None
    baseline, seeds = pairing.baseline, pairing.seeds
    judged: dict[str, dict[str, pd.DataFrame]] = {}
    pooled: list[Effect] = []
    per_cell: list[Effect] = []
    for metric in (metric for metric in COMPARED if metric.name in evidence):
        factors = list(evidence[metric.name])
        looked = level if metric.unit == "pp" else None
        frames = _test_family(metric, [evidence[metric.name][key] for key in factors], margin, seeds, looked)
        judged[metric.name] = dict(zip(factors, frames))
        if looked is not None:
            apply_looks(judged[metric.name], baseline, looks)
        cell_frames = []
        for key, frame in judged[metric.name].items():
            frame["failed"] = [failed_text(trials, key, value) for value in frame[key]]
            if "never_reached" in frame:  # no trial of the value reached the target: that is its answer
                frame["failed"] = [f or never for f, never in zip(frame["failed"], frame["never_reached"])]
            frame.loc[(frame["n_pairs"] == 0) & (frame["failed"] != ""), "verdict"] = FAILED
            frame["depends_on"] = [dependencies(interactions, metric.name, key, value) for value in frame[key]]
            cells = interactions.cells.get((metric.name, key), [])
            for i, row in frame.iterrows():
                if not row["depends_on"] or row["verdict"] in (FAILED, NO_PAIRS, UNFAIR):
                    continue
                estimates = [_estimate(metric, c.loc[i]) - (metric.unit == "ratio") for _, c in cells]
                sides = {math.copysign(1, e) for e in estimates if math.isfinite(e) and e != 0}
                if row["verdict"] != DIFFERS or len(sides) > 1:
                    frame.loc[i, "verdict"] = DEPENDS
            dependent = [bool(d) for d in frame["depends_on"]]
            for cell, cell_frame in cells if any(dependent) else []:
                kept = cell_frame[[bool(d) and n > 0 for d, n in zip(dependent, cell_frame["n_pairs"])]]
                cell_frames.append((key, cell, kept.assign(depends_on=[()] * len(kept))))
        _finish_family(metric, frames, margin, looked)
        for key, frame in judged[metric.name].items():
            pooled.extend(_records(metric, key, baseline[key], frame, {}, margin))
        judged_cells = _test_family(metric, [f for _, _, f in cell_frames], margin, seeds)
        _finish_family(metric, judged_cells, margin)
        for (key, cell, _), frame in zip(cell_frames, judged_cells):
            frame["failed"] = ""
            per_cell.extend(_records(metric, key, baseline[key], frame, cell, margin))
    return judged, tuple(pooled + per_cell)
