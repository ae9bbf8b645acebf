"""The rounds of `sweep --until-settled`, from a run's report: which accuracy comparisons are settled at this look
(sequential.py's levels; a verdict once reached is kept, never judged again), whether to stop, and else the next
round: the seeds to reach and the configurations (grid points) that get them, those in the most open comparisons
first. Pure: a Report and sweep.json's `settle` record in, a Look out; the driver (api.py) runs the round and
records the Look.

A comparison is a factor's value against its baseline (the report's paired effect on final test accuracy, pooled
over the other factors): its configurations are the grid points with either value. Every configuration of an open
comparison is at the same seed count (each round brings them all to the round's target), so a comparison is judged
at most once per seed count: max_looks() bounds its looks. The next target adds the fewest seeds that the report's
more_seeds (verdicts.py) expects to settle one of the open comparisons at this look's level, allowing for the pairs
that failed trials lost, at least one, at most --max-seeds. A comparison that the shared test set's noise keeps
open whatever the seeds (verdicts.settles_with_seeds, judged from MIN_PAIRS pairs on) gets none.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.status import BUDGET, MAX_SEEDS, SETTLED, TESTSET
from .effects import NO_VERDICT, OPEN
from .format import same_value
from .metrics import PAIRED_METRICS
from .sequential import Comparison, comparisons, describe, look_level, look_verdict
from .verdicts import DEFAULT_MARGIN_PP, MIN_PAIRS, more_seeds, pairs_needed, settles_with_seeds

if TYPE_CHECKING:
    from .build import Report


def grid_points(grid: dict[str, list], comparison: Comparison) -> list[dict[str, Any]]:
    """The configurations (factor -> label) a comparison pairs: its factor at either value, the others at any; in
    grid order."""
    factors = [key for key in grid if key != "seed"]
    sides = [
        v for v in grid[comparison.factor] if same_value(v, comparison.value) or same_value(v, comparison.baseline)
    ]
    choices = [sides if key == comparison.factor else grid[key] for key in factors]
    return [dict(zip(factors, values)) for values in itertools.product(*choices)]


def point_key(point: dict[str, Any]) -> tuple:
    """A grid point as core.sweep compares them: (factor, repr(label)) pairs, seed left out."""
    return tuple((key, repr(value)) for key, value in point.items() if key != "seed")


@dataclass
class Look:
    """One look at the run: each comparison's verdict (kept from an earlier look where it settled there), what is
    open, and either why the rounds stop or the next round: `seeds` per configuration at `points`, and for each
    point the open comparisons it informs (`informs`, as many as the point's place in the order asks)."""

    round: int
    verdicts: dict[str, dict]  # comparison label -> {verdict, mean_diff, n_pairs, seeds, round}
    open: list[str]
    stop: str | None = None
    seeds: int | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    informs: list[list[str]] = field(default_factory=list)  # per point: the labels of its open comparisons
    trials: int = 0  # the next round's new trials
    estimate_s: float | None = None  # its wall time, from this run's trial times (None: unknown)

    def record(self) -> dict:
        """As sweep.json's settle.rounds keeps it: every field, in this order."""
        return asdict(self)


def settle_record(
    first_seeds: int,
    max_seeds: int,
    budget_s: float | None,
    comparisons_count: int,
    margin: float = DEFAULT_MARGIN_PP / 100,
) -> dict:
    """sweep.json's `settle` as the first round starts: the fixed design the levels come from, the equivalence
    margin its looks judge by (a fraction; whatever margin a later report is asked for), no rounds yet."""
    looks = max_seeds - first_seeds + 1
    return {
        "margin": margin,
        "first_seeds": first_seeds,
        "max_seeds": max_seeds,
        "budget_s": budget_s,
        "comparisons": comparisons_count,
        "looks": looks,
        "level": look_level(comparisons_count, looks),
        "procedure": describe(comparisons_count, looks),
        "rounds": [],
    }


def _planned(trials: list[dict]) -> dict[tuple, int]:
    """The trials planned at each configuration (point_key), from their swept values; a failed one counts: a seed
    spent."""
    counts: dict[tuple, int] = {}
    for swept in trials:
        counts[point_key(swept)] = counts.get(point_key(swept), 0) + 1
    return counts


def _seeds_at(points: list[dict], planned: dict[tuple, int]) -> int:
    """The seeds of the configuration of `points` that has the fewest."""
    return min((planned.get(point_key(point), 0) for point in points), default=0)


def _row(report: Report, comparison: Comparison):
    frame = report.effects[comparison.factor][PAIRED_METRICS[0].column]
    return frame.loc[[same_value(v, comparison.value) for v in frame[comparison.factor]]].iloc[0]


def _step(row, seeds: int, level: float, margin: float) -> int:
    """Seeds to add so that this comparison is expected to settle at `level` (verdicts.more_seeds), at least one."""
    if row["n_pairs"] == 0 or row["n_planned"] - row["n_open"] == 0:
        return 1
    needed = (
        MIN_PAIRS
        if math.isnan(row["std_diff"])
        else pairs_needed(row["mean_diff"], row["std_diff"] ** 2, margin, level, row["testset_var"])
    )
    if needed is None:
        return 1
    return max(1, more_seeds(needed, row, seeds)[0])


def look(report: Report, settle: dict) -> Look:
    """The next look at `report`'s run, given sweep.json's `settle` record (settle_record, its rounds so far)."""
    grid = {key: report.grid[key] for key in report.factors}
    level, margin, max_seeds = settle["level"], settle.get("margin", report.margin), settle["max_seeds"]
    kept = {label: v for past in settle["rounds"] for label, v in past["verdicts"].items() if v["verdict"] != OPEN}
    planned = _planned([t.swept for t in report.run.trials])
    number = len(settle["rounds"]) + 1
    verdicts, growable, steps = {}, [], []
    for comparison in comparisons(grid, report.baseline):
        if comparison.label in kept:
            verdicts[comparison.label] = kept[comparison.label]
            continue
        row = _row(report, comparison)
        seeds = _seeds_at(grid_points(grid, comparison), planned)
        verdict = look_verdict(row["mean_diff"], row["se"], int(row["n_pairs"]), margin, level)
        settled = verdict not in (OPEN, NO_VERDICT)
        verdicts[comparison.label] = {
            "verdict": verdict if settled else OPEN,
            "mean_diff": None if math.isnan(row["mean_diff"]) else float(row["mean_diff"]),
            "n_pairs": int(row["n_pairs"]),
            "seeds": seeds,
            "round": number,
        }
        if settled or seeds >= max_seeds:
            continue
        if row["n_pairs"] >= MIN_PAIRS and not settles_with_seeds(row["mean_diff"], row["testset_var"], margin, level):
            verdicts[comparison.label]["testset_limited"] = True
            continue
        growable.append(comparison)
        steps.append(_step(row, seeds, level, margin))
    still_open = [label for label, v in verdicts.items() if v["verdict"] == OPEN]
    result = Look(number, verdicts, still_open)
    if not still_open:
        result.stop = SETTLED
        return result
    if not growable:
        limited = all(verdicts[label].get("testset_limited") for label in still_open)
        result.stop = TESTSET if limited else MAX_SEEDS
        return result
    seeds = max(_seeds_at(grid_points(grid, comparison), planned) for comparison in growable)
    result.seeds = min(max_seeds, seeds + min(steps))
    ordered = answer_first(grid, growable)
    result.points, result.informs = [point for point, _ in ordered], [labels for _, labels in ordered]
    result.trials = sum(max(0, result.seeds - planned.get(point_key(p), 0)) for p in result.points)
    if report.trial_times is not None:
        wall, at_once = report.trial_times
        result.estimate_s = result.trials * wall / at_once
    budget = settle.get("budget_s")
    spent = report.run.sweep.get("wall_time_s") or 0.0
    if budget is not None and result.estimate_s is not None and spent + result.estimate_s > budget:
        # the round it would have run, not run
        result.stop, result.seeds, result.points, result.informs = BUDGET, None, [], []
    return result


def answer_first(grid: dict[str, list], open_comparisons: list[Comparison]) -> list[tuple[dict[str, Any], list[str]]]:
    """The configurations of the open comparisons, each with the labels of those it informs, those in the most of
    them first (grid order among equals)."""
    points: dict[tuple, tuple[dict, list[str]]] = {}
    for comparison in open_comparisons:
        for point in grid_points(grid, comparison):
            points.setdefault(point_key(point), (point, []))[1].append(comparison.label)
    ordered = sorted(enumerate(points.values()), key=lambda item: (-len(item[1][1]), item[0]))
    return [entry for _, entry in ordered]


def asked(taken: Look, added: list[tuple[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """Which open comparison each of a round's new trials (name, swept values) is for: label -> trial names, in
    the round's order; what status shows as the round runs."""
    informs = {point_key(point): labels for point, labels in zip(taken.points, taken.informs)}
    questions: dict[str, list[str]] = {}
    for name, swept in added:
        for label in informs[point_key(swept)]:
            questions.setdefault(label, []).append(name)
    return questions
