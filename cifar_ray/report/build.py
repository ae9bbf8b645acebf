"""Everything a report shows, computed once from the logs: `build_report(run_dirs) -> Report`, which the Markdown,
CSV and JSON outputs read whole.

Aggregates (factor tables, configurations, findings) use included trials only (finished with every planned epoch
logged); failed, diverged, out-of-memory, incomplete and unfinished trials appear in the trial table and are listed
with their reason. A factor's effect is measured on
matched pairs (trials that differ only in that factor, seed included); per-value means pool the other factors and
are shown as means only. "Best" follows the sweep file's metric and mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..core.errors import ConfigError
from ..core.runlog import RunLog, Where
from ..core.status import SETTLE_KEY, trial_times
from ..core.sweep import target_refusal
from .compare import (
    RUN_FACTOR,
    RunComparison,
    RunSource,
    combine_runs,
    compare_runs,
    load_runs,
    paired_config,
    refuse_unpaired,
)
from .effects import Effect
from .format import fmt_value, values_label
from .interactions import Evidence, Interactions, find_interactions
from .judge import judge_report
from .load import (
    breakdown_keys,
    epochs_frame,
    image_scores,
    memory_measure,
    resolve_baseline,
    sweep_grid,
    target_times,
    trial_frame,
)
from .metrics import COMPARED, TIME_TO_TARGET, Compared, Metric, resolve_objective, table_metrics
from .rankings import Leaders, Ranked, rank_configs
from .sharing import shared_trials
from .stats import (
    UNFINISHED,
    Overfit,
    Pairing,
    config_frame,
    config_members,
    factor_frame,
    included,
    log_values,
    paired_effects,
    ratio_effects,
    rows_with,
    seed_noise,
)
from .testset import ImageScores
from .verdicts import DEFAULT_MARGIN_PP, MIN_PAIRS


@dataclass
class Report:
    run: RunLog
    name: str
    factors: list[str]  # grid keys other than seed, in grid order
    grid: dict[str, list]  # factor -> its values, in grid order
    baseline: dict[str, Any]  # factor -> baseline value (a grid value)
    label_keys: list[str]  # what tells trials apart: the factors, then seed where trials differ by it
    breakdown: list[str]  # step-time keys present in the epochs
    epochs: pd.DataFrame  # one row per (trial, epoch)
    trials: pd.DataFrame  # one row per trial
    overfits: dict[str, Overfit]  # trial name -> what OVERFIT_RULE found, for the flagged trials only
    groups: dict[str, pd.DataFrame]  # factor -> one row per grid value
    configs: pd.DataFrame  # one row per combination of factor values
    objective: Metric  # what "best" means: the sweep's metric and mode on its trial column
    objective_note: str  # why the sweep's metric was not usable ("" when it is)
    metrics: tuple[Metric, ...]  # the factor tables' metrics: FACTOR_METRICS with the objective
    # factor -> column -> its judged effects frame (report/judge.py): the evidence and verdict each record is made of,
    # per metric of COMPARED on its column (final_test_acc, time_per_epoch_s, memory_column)
    effects: dict[str, dict[str, pd.DataFrame]]
    records: tuple[Effect, ...]  # every comparison's verdict (report/judge.py): pooled, then per cell
    interactions: Interactions  # whether a factor's effect differs across the other factors' values, per metric
    margin: float  # the equivalence margin of accuracy effects, a fraction (0.01: ±1 pp)
    comparisons: int  # accuracy comparisons judged as one family (Holm): those with >= MIN_PAIRS pairs
    seeds: int  # distinct seeds among the trials (1 without a seed key)
    test_images: int | None  # the test images accuracies are measured on (median over trials), from the configs
    noise: tuple[float, int]  # seed_noise() of final test accuracy: (pooled std, configurations behind it)
    memory_measure: str  # what peak memory per worker measures on these trials' devices
    target: float | None  # the test accuracy whose time to reach is compared (report --target, or the sweep file's)
    shared: dict[str, str]  # included trial -> why it shared a device with another trial (sharing.shared_trials)
    time_logs: dict[str, list[float]]  # included trial -> log seconds of its warm epochs (stats.log_values)
    memory_column: str  # the trial column memory is compared on: the total over workers where every trial has one
    missing: dict[str, str]  # trial -> why it is not in the run: NO_FOLDER, or its folder damaged (RunLog.damaged)
    per_image: dict[str, ImageScores]  # trial -> which test images its final evaluation got right, where logged
    # core/status.trial_times: a finished trial's mean wall time and the most that ran at once (None: none recorded)
    trial_times: tuple[float, int] | None
    unfinished: int  # the run's trials of an UNFINISHED outcome, which a resume runs again
    sources: list[RunSource] = field(default_factory=list)  # the runs, in the order given
    comparison: RunComparison | None = None  # None for one run
    leaders: dict[str, Leaders] = field(default_factory=dict)  # rankings.rank_configs: who leads, beyond the noise

    def trial_label(self, row: pd.Series) -> str:
        """A trial row named by its label_keys' values, or by the trial's name when there are none."""
        return values_label(row, self.label_keys) or row["trial"]


NO_FOLDER = "no folder in the run"


def missing_trials(run: RunLog) -> dict[str, str]:
    """Each trial sweep.json plans that is not in `run`, and each damaged trial folder, with why (NO_FOLDER, or
    what load_run found damaged)."""
    loaded = {t.name for t in run.trials}
    planned = {name: run.damaged.get(name, NO_FOLDER) for name in run.sweep.get("trials", []) if name not in loaded}
    return planned | {name: why for name, why in run.damaged.items() if name not in planned}


def censored(trials: pd.DataFrame, key: str, value: Any, baseline: Any, target: float) -> tuple[str, str]:
    """The trials of `key`=`value` and of its baseline that never reached `target` (censored: counted, never
    dropped): `batch_size=512 did not reach 85 % in 2 of 3; the baseline in 0 of 3`, and that text again where no
    trial of the value reached it (its answer), else ""."""
    counts = []
    for side in (value, baseline):
        done = included(rows_with(trials, key, side))
        counts.append((int((~done["reached_target"].astype(bool)).sum()), len(done)))
    (missed, n), (base_missed, base_n) = counts
    if not missed and not base_missed:
        return "", ""
    text = (
        f"{key}={fmt_value(value)} did not reach {fmt_value(round(100 * target, 6))} % in {missed} of {n}; "
        f"the baseline in {base_missed} of {base_n}"
    )
    return text, text if n and missed == n else ""


def build_report(
    run_dirs: Where | Sequence[Where],
    baseline: dict | None = None,
    margin_pp: float = DEFAULT_MARGIN_PP,
    target: float | None = None,
) -> Report:
    """Everything the Markdown, CSV and JSON outputs need, computed once from the logs of one run or several
    (ConfigError for runs with nothing to pair: RUN_MATCH_RULE, a margin outside 0-100 pp, or a target that is not
    an accuracy). `target`: the test accuracy whose time to reach is compared (None: the sweep file's, if any)."""
    if not 0 < margin_pp < 100:
        raise ConfigError(
            f"--margin {fmt_value(margin_pp)}: the equivalence margin is percentage points above 0, below 100"
        )
    sources = load_runs(run_dirs)
    comparison = compare_runs(sources) if len(sources) > 1 else None
    run = combine_runs(sources) if comparison else sources[0].log
    sweep = run.sweep
    grid = sweep_grid(sweep)
    factors = [key for key in grid if key != "seed" and grid[key]]
    chosen = resolve_baseline(sweep, factors, grid, baseline)
    if comparison:
        refuse_unpaired(sources, comparison, chosen[RUN_FACTOR])
    seed_column = "seed" in grid or any("seed" in t.swept for t in run.trials)
    breakdown = breakdown_keys(run)
    epochs = epochs_frame(run, breakdown)
    label_keys = factors + (["seed"] if seed_column else [])
    trials, overfits = trial_frame(run, epochs, label_keys, breakdown)
    if comparison:
        epochs.insert(1, RUN_FACTOR, epochs["trial"].map(dict(zip(trials["trial"], trials[RUN_FACTOR]))))
    target = sweep.get("target") if target is None else target
    if target is not None and (refusal := target_refusal(target)):
        raise ConfigError(f"--target: {refusal}")
    if target is not None:
        trials = target_times(trials, epochs, target)
    objective, note = resolve_objective(sweep, trials)
    metrics = table_metrics(objective) + ((TIME_TO_TARGET,) if target is not None else ())
    groups = {key: factor_frame(trials, key, grid[key], chosen[key], breakdown, metrics) for key in factors}
    configs = config_frame(trials, factors, grid, breakdown, metrics)
    if target is not None:  # how many of each configuration's finished trials reached it
        configs["target_reached"] = [
            int(included(config_members(trials, factors, row))["reached_target"].sum()) for _, row in configs.iterrows()
        ]
    # Runs pair on their configs (RUN_MATCH_RULE), not on grid labels: one run's label may be another's config value.
    per_image = image_scores(run)
    paired = trials.assign(paired_config=[paired_config(t, comparison) for t in run.trials]) if comparison else trials
    # Run factor pairs: on RUN_MATCH_RULE's config; other factors: on the other factors and the seed.
    match = {key: ["paired_config"] if comparison and key == RUN_FACTOR else None for key in factors}
    seeds = int(trials["seed"].nunique()) if "seed" in trials.columns else 1
    pairing = Pairing(factors, grid, chosen, match, seeds)
    finished = included(trials)
    shared = {name: why for name, why in shared_trials(run.trials).items() if name in set(finished["trial"])}
    compared = tuple(metric for metric in COMPARED if target is not None or not metric.needs_target)
    columns = {metric.name: metric.column(finished) for metric in compared}
    logs = {
        metric.name: log_values(trials, epochs if metric.epoch_column else None, metric.epoch_column or column)
        for metric in compared
        if metric.unit == "ratio"
        for column in [columns[metric.name]]
    }

    def effects_of(metric: Compared) -> Evidence:
        if metric.unit == "pp":
            return lambda subset, key: paired_effects(subset, key, pairing, columns[metric.name], per_image=per_image)
        contended = list(shared) if metric.contended else []
        if not metric.needs_target:
            return lambda subset, key: ratio_effects(subset, logs[metric.name], key, pairing, MIN_PAIRS, contended)

        def reaching(subset: pd.DataFrame, key: str) -> pd.DataFrame:
            frame = ratio_effects(subset, logs[metric.name], key, pairing, MIN_PAIRS, contended)
            texts = [censored(subset, key, value, chosen[key], target) for value in frame[key]]
            lost = [text or row for (text, _), row in zip(texts, frame["lost"])]
            return frame.assign(lost=lost, never_reached=[never for _, never in texts])

        return reaching

    evidence = {metric.name: (metric.unit, effects_of(metric)) for metric in compared}
    # what pairing reads, no more: the interactions split these rows hundreds of times at 1,000 trials
    read = [*factors, "seed", "paired_config", "trial", "outcome", "test_images", "reached_target", *columns.values()]
    paired = paired[[column for column in dict.fromkeys(read) if column in paired]]
    interactions = find_interactions(paired, factors, grid, chosen, evidence)
    # sweep --until-settled: its looks' verdicts, every test at their level (report/settle.py), one run only
    looks = None if comparison else sweep.get(SETTLE_KEY)
    judged, records = judge_report(
        {name: {key: effects(paired, key) for key in factors} for name, (_, effects) in evidence.items()},
        trials,
        pairing,
        interactions,
        margin_pp / 100,
        looks,
    )
    effects = {key: {columns[metric.name]: judged[metric.name][key] for metric in compared} for key in factors}
    accuracy = columns[COMPARED[0].name]
    comparisons = sum(int((effects[key][accuracy]["n_pairs"] >= MIN_PAIRS).sum()) for key in factors)
    noise = seed_noise(trials, factors, accuracy)
    report = Report(
        run=run,
        name=str(sweep.get("name") or run.path.name),
        factors=factors,
        grid=grid,
        baseline=chosen,
        label_keys=label_keys,
        breakdown=breakdown,
        epochs=epochs,
        trials=trials,
        overfits=overfits,
        groups=groups,
        configs=configs,
        objective=objective,
        objective_note=note,
        metrics=metrics,
        effects=effects,
        records=records,
        interactions=interactions,
        margin=margin_pp / 100,
        comparisons=comparisons,
        seeds=seeds,
        test_images=int(counts.median()) if len(counts := trials["test_images"].dropna()) else None,
        noise=noise,
        memory_measure=memory_measure(run),
        shared=shared,
        target=target,
        time_logs=logs[COMPARED[1].name],
        memory_column=columns[COMPARED[2].name],
        missing=missing_trials(run),
        per_image=per_image,
        trial_times=trial_times(run),
        unfinished=int(trials["outcome"].isin(UNFINISHED).sum()),
        sources=sources,
        comparison=comparison,
    )
    time_column = columns[COMPARED[1].name]
    report.leaders = rank_configs(
        Ranked(
            configs,
            trials,
            factors,
            per_image,
            report.time_logs,
            {key: effects[key][time_column] for key in factors},
            objective,
            report.memory_column,
        )
    )
    return report
