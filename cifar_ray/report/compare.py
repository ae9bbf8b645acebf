"""Several runs (folders) in one report: the runs become one more factor, `run`, first of the factors. RUN_MATCH_RULE
says which trials of different runs are paired; load_runs labels the runs, compare_runs finds the run-level keys,
combine_runs makes one run of them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigError
from ..core.record import TrialRecord
from ..core.runlog import RunLog, TrialLog, Where
from ..core.storage import StoragePath
from .format import fmt_value, same_value
from .load import load, sweep_grid, trial_value

# Several runs in one report: the factor that tells them apart, and which of their trials are compared.
RUN_FACTOR = "run"

IGNORED_KEYS = ("data_dir",)  # where a machine keeps the data: never a difference between runs

RUN_MATCH_RULE = (
    "A trial of one run is paired with the trial of the baseline run whose config is equal on every key except "
    "the run-level ones. A run-level key is constant within each run but not the same in all runs (say epochs=1 "
    "in one, epochs=2 in the other): it is part of the run factor, so the run effect includes it with everything "
    "else the runs differ in (code, hardware, software). Every other key must be equal: the swept keys and the seed "
    "(keys constant in every run are equal anyway); data_dir is ignored. Runs with no such pair are refused."
)


@dataclass(frozen=True)
class RunSource:
    """One run of a report: its label (its folder name; with the parent folder where two runs share a name) and its
    logs."""

    label: str
    log: RunLog


@dataclass(frozen=True)
class RunComparison:
    """How the runs of a report with several differ: the run-level keys (RUN_MATCH_RULE) with each run's value, and
    the keys a pair must agree on (those that vary within some run)."""

    run_level: dict[str, dict[str, Any]]  # key -> run label -> its value in that run
    matched: list[str]


def run_labels(paths: Sequence[StoragePath]) -> list[str]:
    """Each run's folder name; where two share a name, the parent folder too (then more of the path, as needed)."""
    parts = [[part for part in path.path.split("/") if part] for path in paths]  # no scheme, no URI options
    depth = [1] * len(paths)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashes = {label for label in labels if labels.count(label) > 1}
        grow = [i for i, label in enumerate(labels) if label in clashes and depth[i] < len(parts[i])]
        if not grow:
            return labels
        for i in grow:
            depth[i] += 1


def load_runs(run_dirs: Where | Sequence[Where]) -> list[RunSource]:
    """The runs' logs with their labels; ConfigError for a folder twice (the same run cannot be compared with
    itself)."""
    many = not isinstance(run_dirs, (str, os.PathLike, StoragePath))
    paths = [StoragePath.of(where) for where in (run_dirs if many else [run_dirs])]
    seen = [str(path) for path in paths]
    twice = sorted({where for where in seen if seen.count(where) > 1})
    if twice:
        raise ConfigError(f"run folder given twice: {', '.join(twice)}; pass each run once")
    return [RunSource(label, load(path)) for label, path in zip(run_labels(paths), paths)]


def compare_runs(sources: Sequence[RunSource]) -> RunComparison:
    """Which config keys are run-level and which a pair must agree on (RUN_MATCH_RULE), over every trial."""
    keys = dict.fromkeys(k for s in sources for t in s.log.trials for k in t.config if k not in IGNORED_KEYS)
    run_level, matched = {}, []
    for key in keys:
        per_run = [[t.config.get(key) for t in s.log.trials] for s in sources]
        if any(len({fmt_value(v) for v in values}) > 1 for values in per_run):
            matched.append(key)
        elif len({fmt_value(values[0]) for values in per_run}) > 1:
            run_level[key] = {s.label: values[0] for s, values in zip(sources, per_run)}
    return RunComparison(run_level, matched)


def paired_config(trial: TrialLog, comparison: RunComparison) -> str:
    """What a trial of one run must share with its pair in another: its values of the matched keys."""
    return ", ".join(f"{k}={fmt_value(trial.config.get(k))}" for k in comparison.matched)


def refuse_unpaired(sources: Sequence[RunSource], comparison: RunComparison, baseline: Any) -> None:
    """ConfigError naming the keys that differ when a run has no trial to pair with one of the baseline run."""
    base = next(s for s in sources if same_value(s.label, baseline))
    base_configs = {paired_config(t, comparison) for t in base.log.trials}
    for source in sources:
        if source is base or base_configs & {paired_config(t, comparison) for t in source.log.trials}:
            continue

        def values(run: RunSource, key: str) -> list[str]:
            return list(dict.fromkeys(fmt_value(t.config.get(key)) for t in run.log.trials))

        differ = [k for k in comparison.matched if set(values(base, k)) != set(values(source, k))]
        what = (
            "; ".join(
                f"{k}: {', '.join(values(base, k))} in {base.label}, {', '.join(values(source, k))} in {source.label}"
                for k in differ
            )
            or f"no combination of {', '.join(comparison.matched)} in common"
        )
        raise ConfigError(
            f"runs {base.label} and {source.label} have no trials to compare: a pair needs equal values of the keys "
            f"that vary within a run, and they differ ({what}); compare runs of one sweep file (other --set values "
            "are fine), or measure against another run with --baseline run=LABEL"
        )


def combine_runs(sources: Sequence[RunSource]) -> RunLog:
    """The runs as one: each trial named <label>/<trial> with its run as the swept `run`; the grid is run (the labels),
    then every run's swept keys with the values of all runs (a run that does not sweep a key adds its trials' values);
    metric and mode are the first run's."""
    grids = [sweep_grid(s.log.sweep) for s in sources]
    if any(RUN_FACTOR in grid for grid in grids):
        raise ConfigError(f"a sweep's grid has a key named '{RUN_FACTOR}': its runs cannot be compared by run")
    grid: dict[str, list] = {RUN_FACTOR: [s.label for s in sources]}
    for key in dict.fromkeys(k for g in grids for k in g):
        values: list = []
        for source, own in zip(sources, grids):
            for value in own[key] if key in own else [trial_value(t, key) for t in source.log.trials]:
                if not any(same_value(value, known) for known in values):
                    values.append(value)
        grid[key] = values
    trials = [
        TrialLog(
            f"{s.label}/{t.name}",
            TrialRecord.from_json(t.name, t.meta | {"swept": {RUN_FACTOR: s.label} | t.swept}),
            t.epochs,
            t.correct,
        )
        for s in sources
        for t in s.log.trials
    ]
    repeats = [s.log.sweep.get("repeats", 1) for s in sources]
    first = sources[0].log.sweep
    sweep = {
        "name": "-vs-".join(s.label.replace("/", "-") for s in sources),
        "metric": first.get("metric", "test_acc"),
        "mode": first.get("mode", "max"),
        "grid": grid,
        "repeats": max(r for r in repeats if isinstance(r, int)) if any(isinstance(r, int) for r in repeats) else 1,
    }
    return RunLog(sources[0].log.path, sweep, trials)
