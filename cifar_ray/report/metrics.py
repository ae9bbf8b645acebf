"""What the report measures: the metrics of its tables (FACTOR_METRICS), the metrics its effects compare
(COMPARED: one entry each; the report's every per-metric loop iterates it), and what "best" means: the sweep file's
metric and mode (OBJECTIVES, resolve_objective)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import pandas as pd

from ..core.runlog import MODES, sweep_objective

# A trial enters the aggregates when it finished with every planned epoch logged (the trial frame's "outcome").
INCLUDED = "finished"
INCOMPLETE = "incomplete"  # marked finished, but fewer epochs logged than planned


@dataclass(frozen=True)
class Metric:
    column: str
    label: str
    better: str  # "max" or "min"
    kind: str  # "acc": fraction shown as %, deltas in percentage points; "cost", "loss": deltas in %


FACTOR_METRICS = (
    Metric("final_test_acc", "final test acc (%)", "max", "acc"),
    Metric("best_test_acc", "best test acc (%)", "max", "acc"),
    Metric("time_per_epoch_s", "time/epoch (s)", "min", "cost"),
    Metric("samples_per_s", "throughput (samples/s)", "max", "cost"),
    Metric("peak_mem_mb", "peak mem per worker (MB)", "min", "cost"),
    Metric("peak_mem_total_mb", "peak mem, total over workers (MB)", "min", "cost"),
)

PAIRED_METRICS = (FACTOR_METRICS[0],)  # effects as differences: final test acc (Δ in pp)
# Effects as ratios (value / baseline, on the log scale): time per epoch (per-epoch times), peak memory per worker and
# total over workers (one number per trial).
COST_METRICS = (FACTOR_METRICS[2], FACTOR_METRICS[4], FACTOR_METRICS[5])


@dataclass(frozen=True)
class Compared:
    """A metric the report compares between a factor's values, on matched pairs (report/effects.Effect.metric is its
    `name`), `label` in words. `columns`: the trial columns it reads, the first that every included trial logged
    (peak memory: the total over workers, else per worker); `unit`: "pp" (a difference of accuracies,
    stats.paired_effects) or "ratio" (value / baseline on the log scale, stats.ratio_effects); `epoch_column`: the
    per-epoch log whose warm epochs give a trial's own noise (none: one number per trial); `contended`: a device
    shared with another trial changes it, so such pairs are not judged; `words`: a ratio below and above 1 in words,
    `short` what they are about ("1.30x faster per epoch"); `needs_target`: measured only where a target accuracy is
    set."""

    name: str
    label: str
    columns: tuple[str, ...]
    unit: Literal["pp", "ratio"]
    epoch_column: str | None = None
    contended: bool = False
    words: tuple[str, str] = ("lower", "higher")
    short: str = ""  # what a ratio's words are about, in an answer line: "per epoch", "memory"
    needs_target: bool = False  # compared only where the report has a target accuracy

    def column(self, included: pd.DataFrame) -> str:
        """The trial column compared, given the included trials: the first of `columns` every one of them logged."""
        for column in self.columns[:-1]:
            if len(included) and included[column].notna().all():
                return column
        return self.columns[-1]


TIME_TO_TARGET = Metric("time_to_target_s", "time to target (s)", "min", "cost")
COMPARED = (
    Compared("accuracy", "final test accuracy", (FACTOR_METRICS[0].column,), "pp", short="accuracy"),
    Compared(
        "time_per_epoch",
        "time per epoch",
        (FACTOR_METRICS[2].column,),
        "ratio",
        "epoch_time_s",
        contended=True,
        words=("faster", "slower"),
        short="per epoch",
    ),
    Compared(
        "peak_memory",
        "peak memory",
        (FACTOR_METRICS[5].column, FACTOR_METRICS[4].column),
        "ratio",
        words=("less", "more"),
        short="memory",
    ),
    # one number per trial: the wall time until its test accuracy first reached the target (load.target_times)
    Compared(
        "time_to_target",
        "time to the target accuracy",
        (TIME_TO_TARGET.column,),
        "ratio",
        contended=True,
        words=("sooner", "later"),
        short="to the target",
        needs_target=True,
    ),
)
COMPARED_NAMES = tuple(m.name for m in COMPARED)

# The sweep file's `metric` (runlog.OBJECTIVES) -> the trial column that ranks trials by it: epoch metrics at the
# last epoch (final_<metric>), costs aggregated over epochs as in the factor tables.
OBJECTIVES = {
    "test_acc": FACTOR_METRICS[0],
    "train_acc": Metric("final_train_acc", "final running train acc (%)", "max", "acc"),
    "test_loss": Metric("final_test_loss", "final test loss", "min", "loss"),
    "train_loss": Metric("final_train_loss", "final running train loss", "min", "loss"),
    "epoch_time_s": FACTOR_METRICS[2],
    "samples_per_s": FACTOR_METRICS[3],
    "peak_mem_mb": FACTOR_METRICS[4],
}


def resolve_objective(sweep: dict, trials: pd.DataFrame) -> tuple[Metric, str]:
    """What "best" means: the sweep's metric and mode on its trial column, and "" as the note; else final test
    accuracy (max) and a note saying why the sweep's choice could not be used."""
    name, mode = sweep_objective(sweep)
    metric = OBJECTIVES.get(name)
    if metric is None or mode not in MODES:
        return FACTOR_METRICS[0], f"fallback: sweep metric={name}, mode={mode} has no trial column"
    done = trials.loc[trials["outcome"] == INCLUDED, metric.column]
    if len(done) and done.isna().all():
        return FACTOR_METRICS[0], f"fallback: no finished trial logged sweep metric={name}"
    return replace(metric, better=mode), ""


def table_metrics(objective: Metric) -> tuple[Metric, ...]:
    """FACTOR_METRICS with the objective in place of the metric on its column (so the sweep's mode picks that
    column's best), or appended when no factor metric has its column."""
    metrics = tuple(objective if m.column == objective.column else m for m in FACTOR_METRICS)
    return metrics if objective in metrics else metrics + (objective,)
