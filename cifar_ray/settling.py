"""`sweep --until-settled` after its options are checked (api.settle_options): the recorded limits a resume keeps,
a warm pool for the rounds, and the rounds themselves: look at the report's open comparisons (report/settle.py),
record the look, train the seeds it asks for, until a look stops."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .core.errors import UsageError
from .core.run import RunFolder
from .core.runlog import FINAL_STATUSES
from .core.status import SETTLE_KEY, settle_text
from .core.text import rough_duration

if TYPE_CHECKING:
    from .core.config import Overrides
    from .core.sweep import SweepPlan

DEFAULT_MAX_SEEDS = 10  # --until-settled without --max-seeds: at most this many seeds (or the file's, if more)


@dataclass(frozen=True)
class Settle:
    """`sweep --until-settled`'s options, as execute_plan runs its rounds: the sweep (`source`, `overrides`, `name`:
    what each round's plan is built from), the most seeds per configuration, the wall-time budget in seconds."""

    source: str | os.PathLike | Mapping[str, Any]
    overrides: Overrides
    name: str | None
    max_seeds: int | None  # None: a resumed run's own, else default_max_seeds
    budget_s: float | None


def default_max_seeds(plan: SweepPlan) -> int:
    return max(DEFAULT_MAX_SEEDS, plan.repeats)


def settle_resolved(settle: Settle, plan: SweepPlan, run: RunFolder, resume: bool) -> Settle:
    """`settle` with its max_seeds: a resumed run's recorded one (its tests' levels depend on it: another is
    refused, before Ray starts), else the one given or default_max_seeds; and its budget: the one given, else a
    resumed run's recorded one."""
    recorded = (run.sweep().get(SETTLE_KEY) or {}) if resume else {}
    if recorded and settle.max_seeds not in (None, recorded["max_seeds"]):
        raise UsageError(
            f"--max-seeds {settle.max_seeds}: this run settles with --max-seeds {recorded['max_seeds']}, which fixed "
            "its tests' levels; allowed: the same --max-seeds, or none"
        )
    seeds = recorded.get("max_seeds") or settle.max_seeds or default_max_seeds(plan)
    budget_s = settle.budget_s if settle.budget_s is not None else recorded.get("budget_s")  # a resume keeps it
    return dataclasses.replace(settle, max_seeds=seeds, budget_s=budget_s)


def rounds_pool(rounds: bool) -> contextlib.AbstractContextManager:
    """Where a sweep settles in rounds, a warm pool for them (cluster/pool.py): a round of the same single shape
    trains in the slots the round before started rather than starting its own. None where a pool is open already
    (`with cifar_ray.pool()`: the rounds use it) or through Ray Client."""
    from .cluster import pool, session

    if not rounds or pool.active() is not None or session.is_ray_client():
        return contextlib.nullcontext()
    return pool.activate()


def settle_rounds(
    plan: SweepPlan, settle: Settle, run: RunFolder, train: Callable[[SweepPlan], object], print_line: Callable
) -> None:
    """--until-settled after the grid has run: look (report/settle.py), record the look in sweep.json, then `train`
    the round it plans (the plan with the new seeds' trials, resuming the run), until a look stops. Each look
    is recorded before its trials are added, so a run killed at any point resumes the same rounds
    (core.sweep.resumed_plan replays them): a look whose trials are not all final is not taken again, they are
    trained first."""
    from .core.config import override_values
    from .core.sweep import DICT_SOURCE, build_plan, extended_plan, read_sweep_file
    from .report import build_report
    from .report.sequential import grid_comparisons
    from .report.settle import asked, look, settle_record

    recorded = run.sweep().get(SETTLE_KEY)
    if not recorded:
        recorded = settle_record(plan.repeats, settle.max_seeds, settle.budget_s, len(grid_comparisons(plan.grid)))
    recorded["budget_s"] = settle.budget_s
    run.update_sweep(**{SETTLE_KEY: recorded})
    data = dict(settle.source) if isinstance(settle.source, Mapping) else read_sweep_file(settle.source)
    source = DICT_SOURCE if isinstance(settle.source, Mapping) else str(settle.source)
    overrides = override_values(settle.overrides)
    while not (recorded["rounds"] and recorded["rounds"][-1]["stop"]):
        built = build_report(run.path)
        if not built.trials["status"].isin(FINAL_STATUSES).all():  # stopped (a Ray Client's Ctrl-C): resume
            return
        taken = look(built, recorded)
        recorded["rounds"].append(taken.record())
        run.update_sweep(**{SETTLE_KEY: recorded})
        settled = len(taken.verdicts) - len(taken.open)
        print_line(
            f"until settled, look {taken.round}: {settled} of {len(taken.verdicts)} comparisons settled"
            + (f"; open: {', '.join(taken.open)}" if taken.open else "")
        )
        if taken.stop:
            print_line(f"until settled: {settle_text(recorded)}")
            return
        had = len(plan.trials)
        plan = extended_plan(plan, build_plan(data, overrides, source, settle.name, taken.seeds), taken.points)
        added = plan.trials[had:]
        recorded["rounds"][-1]["added"] = [t.name for t in added]  # the next round's trials, in order
        recorded["rounds"][-1]["questions"] = asked(taken, [(t.name, t.swept) for t in added])  # status shows them
        run.update_sweep(**{SETTLE_KEY: recorded})
        estimate = f", ~{rough_duration(taken.estimate_s)} estimated" if taken.estimate_s is not None else ""
        print_line(
            f"until settled, round {taken.round + 1}: {taken.trials} trials, to {taken.seeds} seeds at "
            f"{len(taken.points)} configurations{estimate}"
        )
        train(plan)
