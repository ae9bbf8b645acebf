"""What the report measures: the metrics of its tables (FACTOR_METRICS), the two its paired effects read
(PAIRED_METRICS), and what "best" means: the sweep file's metric and mode (OBJECTIVES, resolve_objective)."""

from __future__ import annotations

from dataclasses import dataclass, replace

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
