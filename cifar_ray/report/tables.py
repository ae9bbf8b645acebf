"""The report's Markdown tables: the trials, each factor's per-value means, its paired effects, and the step-time
breakdown by factor value and by trial."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..core.text import markdown_table
from .build import Report
from .format import (
    fmt_delta,
    fmt_duration,
    fmt_int,
    fmt_loss,
    fmt_mean_std,
    fmt_num,
    fmt_pct,
    fmt_value,
    paired_parts,
    short_key,
    verdict,
)
from .metrics import PAIRED_METRICS, Metric


def has_train_eval(report: Report) -> bool:
    return bool((report.trials["train_basis"] == "eval").any())


def has_flops(report: Report) -> bool:
    """Whether any trial logged its FLOP/s (runs before FLOPs were counted did not)."""
    return bool(report.trials["flops_per_s"].notna().any())


def _always(report: Report) -> bool:
    return True


@dataclass(frozen=True)
class TrialColumn:
    """A column of the trial table: its header, its alignment (l, r or c), its cell for a trial row, and whether a
    report shows it."""

    header: str
    align: str
    cell: Callable[[Report, pd.Series], str]
    shown: Callable[[Report], bool] = _always


def _field(column: str, fmt: Callable[[Any], str]) -> Callable[[Report, pd.Series], str]:
    """The cell that shows a trial row's `column` through `fmt`."""
    return lambda report, r: fmt(r[column])


def _best_cell(report: Report, r: pd.Series) -> str:
    return "—" if math.isnan(r["best_test_acc"]) else f"{fmt_pct(r['best_test_acc'])} ({fmt_int(r['best_epoch'])})"


def _gap_cell(report: Report, r: pd.Series) -> str:
    """The gap, marked † where the report has eval train metrics but this trial's gap reads the running ones."""
    running = has_train_eval(report) and r["train_basis"] == "running" and r["epochs_done"]
    return fmt_pct(r["gap"]) + (" †" if running else "")


def _overfit_cell(report: Report, r: pd.Series) -> str:
    if r["overfitting"]:
        return f"**yes** (from epoch {fmt_int(r['overfit_epoch'])})"
    return "no" if r["epochs_done"] >= 2 else "—"


# The trial table after the trial and its label_keys, in order.
TRIAL_COLUMNS = (
    TrialColumn("workers", "r", _field("workers", fmt_int), lambda report: "workers" not in report.label_keys),
    TrialColumn("GPUs", "r", _field("gpus", fmt_int), lambda report: bool((report.trials["gpus"].fillna(0) > 0).any())),
    TrialColumn("device", "l", _field("device", str), lambda report: report.trials["device"].nunique() > 1),
    TrialColumn("eff. batch", "r", _field("effective_batch", fmt_int)),
    TrialColumn("epochs", "r", lambda report, r: f"{r['epochs_done']}/{fmt_int(r['epochs_planned'])}"),
    TrialColumn("final test acc (%)", "r", _field("final_test_acc", fmt_pct)),
    TrialColumn("best test acc (%) (epoch)", "r", _best_cell),
    TrialColumn("train acc, running (%)", "r", _field("final_train_acc", fmt_pct)),
    TrialColumn("train acc, eval (%)", "r", _field("final_train_eval_acc", fmt_pct), has_train_eval),
    TrialColumn("gap (pp)", "r", _gap_cell),
    TrialColumn("train loss, running", "r", _field("final_train_loss", fmt_loss)),
    TrialColumn("train loss, eval", "r", _field("final_train_eval_loss", fmt_loss), has_train_eval),
    TrialColumn("test loss", "r", _field("final_test_loss", fmt_loss)),
    TrialColumn("time", "r", _field("train_time_s", fmt_duration)),
    TrialColumn("time/epoch (s)", "r", _field("time_per_epoch_s", fmt_num)),
    TrialColumn("samples/s", "r", _field("samples_per_s", fmt_num)),
    TrialColumn("GFLOP/s", "r", lambda report, r: fmt_num(r["flops_per_s"] / 1e9), has_flops),
    TrialColumn("MFU (%)", "r", _field("mfu", fmt_pct), has_flops),
    TrialColumn("peak mem per worker (MB)", "r", _field("peak_mem_mb", fmt_num)),
    TrialColumn("peak mem, total over workers (MB)", "r", _field("peak_mem_total_mb", fmt_num)),
    TrialColumn("status", "l", _field("status", str)),
    TrialColumn("overfitting", "l", _overfit_cell),
)


def trial_table(report: Report) -> str:
    columns = [TrialColumn("trial", "l", _field("trial", lambda name: f"`{name}`"))]
    columns += [TrialColumn(key, "l", _field(key, fmt_value)) for key in report.label_keys]
    columns += [column for column in TRIAL_COLUMNS if column.shown(report)]
    rows = [[column.cell(report, r) for column in columns] for _, r in report.trials.iterrows()]
    return markdown_table([c.header for c in columns], rows, "".join(c.align for c in columns))


def factor_table(report: Report, key: str) -> str:
    frame = report.groups[key]
    headers = [key, "n"]
    for metric in report.metrics:
        headers += [metric.label, "Δ"]
    best = {}
    for metric in report.metrics:
        means = frame.loc[frame["n"] > 0, f"{metric.column}_mean"].dropna()
        best[metric.column] = (means.max() if metric.better == "max" else means.min()) if len(means) else None
    rows = []
    for _, r in frame.iterrows():
        row = [fmt_value(r[key]) + (" (baseline)" if r["is_baseline"] else ""), str(r["n"])]
        for metric in report.metrics:
            mean = r[f"{metric.column}_mean"]
            text = fmt_mean_std(metric, mean, r[f"{metric.column}_std"])
            if best[metric.column] is not None and mean == best[metric.column]:
                text = f"**{text}**"
            row += [text, fmt_delta(metric, r)]
        rows.append(row)
    return markdown_table(headers, rows, "lr" + "r" * 2 * len(report.metrics))


def paired_table(report: Report, key: str) -> str:
    acc, time = (report.effects[key][m.column] for m in PAIRED_METRICS)
    headers = ["value", "pairs", "Δ final test acc (pp) [95 % CI]", "Δ time/epoch (s) [95 % CI]", "accuracy effect"]

    def cell(metric: Metric, row: pd.Series) -> str:
        mean, low, high = paired_parts(metric, row)
        return "—" if row["n_pairs"] == 0 else f"{mean} [{low}, {high}]" if row["n_pairs"] > 1 else mean

    rows = [
        [
            f"{key}={fmt_value(a[key])}",
            str(a["n_pairs"]),
            cell(PAIRED_METRICS[0], a),
            cell(PAIRED_METRICS[1], t),
            verdict(a),
        ]
        for (_, a), (_, t) in zip(acc.iterrows(), time.iterrows())
    ]
    return markdown_table(headers, rows, "lrrrl")


def factor_breakdown_table(report: Report, key: str) -> str:
    frame = report.groups[key]
    headers = [key, "n", "epoch (s)"] + [f"{short_key(k)} (s)" for k in report.breakdown]
    rows = [
        [fmt_value(r[key]), str(r["n"]), fmt_mean_std(None, r["time_per_epoch_s_mean"], r["time_per_epoch_s_std"])]
        + [fmt_mean_std(None, r[f"{k}_mean"], r[f"{k}_std"]) for k in report.breakdown]
        for _, r in frame.iterrows()
    ]
    return markdown_table(headers, rows, "lr" + "r" * (1 + len(report.breakdown)))


def trial_breakdown_table(report: Report) -> str:
    headers = ["trial", "epoch (s)"] + [f"{short_key(k)} (s, share)" for k in report.breakdown]
    rows = []
    for _, r in report.trials.iterrows():
        if r["epochs_done"] == 0:
            continue
        total = r["time_per_epoch_s"]
        cells = []
        for k in report.breakdown:
            share = f" ({100 * r[k] / total:.0f} %)" if total and not math.isnan(r[k]) else ""
            cells.append(fmt_num(r[k]) + share)
        rows.append([f"`{r['trial']}`", fmt_num(total), *cells])
    return markdown_table(headers, rows, "l" + "r" * (1 + len(report.breakdown)))
