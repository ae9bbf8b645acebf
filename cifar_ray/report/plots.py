"""The report's PNG plots: training curves, and per factor its cost and its test accuracy on an axis laid out by the
kind of values (factor_axis). Each plot has a data function (curves_data, factor_plot_data: what it shows, what the
tests check) and a drawing function (draw_*: matplotlib, imported only there)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .build import Report
from .format import fmt_value
from .metrics import FACTOR_METRICS, Metric
from .stats import TRAIN_COLUMNS, included, rows_with


def _colors(n: int) -> list:
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["viridis"](i / max(n - 1, 1)) for i in range(n)]


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig, path: Path) -> None:
    # No Software/date chunks: the same data give the same bytes.
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})


MAX_LEGEND = 24  # more entries than this push the axes out of the figure: no legend (the trial table names them)


def _legend(ax, n: int) -> None:
    if 0 < n <= MAX_LEGEND:
        ax.legend(
            fontsize=7 if n > 6 else 8,
            ncol=1 if n <= 12 else 2,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
        )


def _train_curve_phrase(report: Report) -> str:
    """Which train loss the curves draw (each trial's train_basis), in words."""
    t = report.trials
    bases = set(t.loc[t["epochs_done"] > 0, "train_basis"])
    if bases == {"eval"}:
        return "train loss evaluated like the test set"
    if bases == {"running"}:
        return "running train loss (mean over the epoch)"
    return "train loss evaluated like the test set where logged, else running"


@dataclass(frozen=True)
class TrialCurve:
    """One trial's values per epoch, and its place in the trial table (which picks its colour)."""

    index: int
    label: str
    epoch: pd.Series
    train_loss: pd.Series  # the loss of the trial's train_basis
    test_loss: pd.Series
    test_acc_pct: pd.Series


@dataclass(frozen=True)
class CurvesData:
    """What the two curve plots show."""

    n_trials: int  # every trial of the report, the ones without epochs included: the colour scale
    curves: list[TrialCurve]  # the trials with at least one logged epoch, in trial table order
    log_loss: bool  # the positive losses span more than a factor of 100: loss on a log axis
    train_phrase: str  # which train loss is drawn, in words


def curves_data(report: Report) -> CurvesData:
    curves, positive = [], []
    for index, (_, r) in enumerate(report.trials.iterrows()):
        e = report.epochs[report.epochs["trial"] == r["trial"]].sort_values("epoch")
        if not len(e):
            continue
        train_loss = e[TRAIN_COLUMNS[r["train_basis"]][0]]
        curves.append(
            TrialCurve(index, report.trial_label(r), e["epoch"], train_loss, e["test_loss"], 100 * e["test_acc"])
        )
        positive += [x for x in pd.concat([train_loss, e["test_loss"]]).dropna() if x > 0]
    log_loss = bool(positive) and max(positive) / min(positive) > 100
    return CurvesData(len(report.trials), curves, log_loss, _train_curve_phrase(report))


def draw_curves(data: CurvesData, out_dir: Path) -> list[tuple[str, str]]:
    """Loss curves (train dashed, test solid) and test accuracy per epoch, one colour per trial."""
    from matplotlib.ticker import MaxNLocator

    colors = _colors(data.n_trials)
    fig = _figure(10, 5)
    ax = fig.subplots()
    for curve in data.curves:
        color = colors[curve.index]
        ax.plot(curve.epoch, curve.train_loss, linestyle="--", color=color, marker=".")
        ax.plot(curve.epoch, curve.test_loss, linestyle="-", color=color, marker=".", label=curve.label)
    if data.log_loss:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    train = data.train_phrase
    ax.set(xlabel="epoch", ylabel="loss", title=f"Loss per epoch (dashed: {train}; solid: test loss)")
    _legend(ax, len(ax.get_lines()) // 2)
    _save(fig, out_dir / "curves_loss.png")

    fig = _figure(10, 5)
    ax = fig.subplots()
    for curve in data.curves:
        ax.plot(curve.epoch, curve.test_acc_pct, color=colors[curve.index], marker=".", label=curve.label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy per epoch")
    _legend(ax, len(ax.get_lines()))
    _save(fig, out_dir / "curves_test_acc.png")
    return [
        ("curves_loss.png", f"Loss per epoch: {train} (dashed), test loss (solid)"),
        ("curves_test_acc.png", "Test accuracy per epoch"),
    ]


def plot_curves(report: Report, out_dir: Path) -> list[tuple[str, str]]:
    return draw_curves(curves_data(report), out_dir)


AXIS_NAMES = {"category": "categories, unordered", "linear": "linear axis", "log2": "log2 axis", "log10": "log axis"}


def factor_axis(values: Sequence[Any]) -> str:
    """How a factor's values are laid out on an x axis (one of AXIS_NAMES). "category" unless there are two or more
    distinct values and all are numbers (true/false are categories); numbers go on "log2" when all are positive,
    span a factor of 4 or more and each is the smallest times a power of two (batch sizes, workers: 1, 2, 4, 8), on
    "log10" when all are positive and span a factor of 100 or more (learning rates), else on "linear"."""
    numeric = all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) for v in values
    )
    if not numeric or len(set(values)) < 2:
        return "category"
    low, high = min(values), max(values)
    if low <= 0:
        return "linear"
    doublings = [math.log2(v / low) for v in values]
    if high / low >= 4 and all(abs(d - round(d)) < 1e-9 for d in doublings):
        return "log2"
    return "log10" if high / low >= 100 else "linear"


def factor_positions(values: Sequence[Any], axis: str) -> np.ndarray:
    """x of each value: its index for categories, the value itself on a numeric axis."""
    return np.arange(len(values), dtype=float) if axis == "category" else np.asarray(values, dtype=float)


def dodge(x: np.ndarray, axis: str, shift: float) -> np.ndarray:
    """`x` moved by `shift` times the mean gap between neighbouring values as the axis draws it (one category, a
    linear step, a log-scale ratio), so two series side by side do not hide each other's error bars."""
    if axis == "category":
        return x + shift
    if len(x) < 2:
        return x
    if axis == "linear":
        return x + shift * (x.max() - x.min()) / (len(x) - 1)
    return x * (x.max() / x.min()) ** (shift / (len(x) - 1))


def accuracy_series(frame: pd.DataFrame) -> list[tuple[Metric, str]]:
    """The accuracy series of a factor plot as (metric, legend label): final and best test accuracy, or final alone,
    labelled best = final, when their means agree for every value. A trial's best is never below its final, so
    equal means say that every trial's last epoch was its best: a second series would cover the first."""
    final, best = FACTOR_METRICS[0], FACTOR_METRICS[1]
    pooled = "mean ± std (other keys pooled)"
    if np.array_equal(
        frame[f"{final.column}_mean"].to_numpy(dtype=float),
        frame[f"{best.column}_mean"].to_numpy(dtype=float),
        equal_nan=True,
    ):
        return [(final, f"final test acc (%) = best (every trial's last epoch was its best), {pooled}")]
    return [(final, f"{final.label}, {pooled}"), (best, f"{best.label}, {pooled}")]


@dataclass(frozen=True)
class CostBars:
    """One panel of a factor's cost plot: per value, the mean over finished trials (NaN: no data) and the std
    (0 where there is none)."""

    metric: Metric
    mean: np.ndarray
    std: np.ndarray


@dataclass(frozen=True)
class AccuracyPoints:
    """One accuracy series of a factor plot (accuracy_series), in percent, per value: x (dodged), mean, std (0 where
    there is none) and the finished trials' own values."""

    label: str
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    trials: list[pd.Series]


@dataclass(frozen=True)
class FactorPlotData:
    """What a factor's two plots show, one entry per grid value in grid order."""

    key: str
    ticks: list[str]  # the values as a user writes them
    baseline: np.ndarray  # True at the baseline value
    costs: list[CostBars]  # time/epoch, throughput, peak memory per worker and in total
    memory_measure: str
    axis: str  # factor_axis() of the values
    positions: np.ndarray  # factor_positions() on that axis
    order: np.ndarray  # the values left to right: a line joins numeric values in this order
    series: list[AccuracyPoints]


def factor_plot_data(report: Report, key: str) -> FactorPlotData:
    frame = report.groups[key]
    values = frame[key].tolist()
    costs = [
        CostBars(
            metric,
            frame[f"{metric.column}_mean"].to_numpy(dtype=float),
            np.nan_to_num(frame[f"{metric.column}_std"].to_numpy(dtype=float)),
        )
        for metric in FACTOR_METRICS[2:]
    ]
    done = included(report.trials)
    axis = factor_axis(values)
    positions = factor_positions(values, axis)
    pairs = accuracy_series(frame)
    series = [
        AccuracyPoints(
            label,
            dodge(positions, axis, 0.08 * (2 * slot - len(pairs) + 1)),  # ±0.08 of a gap for two series, 0 for one
            100 * frame[f"{metric.column}_mean"].to_numpy(dtype=float),
            100 * np.nan_to_num(frame[f"{metric.column}_std"].to_numpy(dtype=float)),
            [100 * rows_with(done, key, value)[metric.column].dropna() for value in values],
        )
        for slot, (metric, label) in enumerate(pairs)
    ]
    return FactorPlotData(
        key,
        [fmt_value(v) for v in values],
        frame["is_baseline"].to_numpy(dtype=bool),
        costs,
        report.memory_measure,
        axis,
        positions,
        np.argsort(positions, kind="stable"),
        series,
    )


def draw_factor(data: FactorPlotData, out_dir: Path) -> list[tuple[str, str]]:
    """Bars of time/epoch, throughput and peak memory (per worker, total) per value (error bars = std); test accuracy
    vs value as points, joined by a line only on a numeric axis (factor_axis)."""
    from matplotlib.ticker import NullLocator

    key, ticks = data.key, data.ticks
    x = np.arange(len(ticks))
    fig = _figure(4 * len(data.costs), 4)
    axes = fig.subplots(1, len(data.costs))
    colors = np.array(["0.6" if b else "tab:blue" for b in data.baseline])
    for ax, bars in zip(axes, data.costs):
        have = np.isfinite(bars.mean)
        ax.bar(x[have], bars.mean[have], yerr=bars.std[have], color=colors[have], capsize=4)
        for i in x[~have]:  # no finished trial, or the metric was not logged
            ax.text(i, 0, "no data", ha="center", va="bottom", fontsize=8, color="0.4")
        if not have.any():
            ax.set_ylim(0, 1)
            ax.set_yticks([])
        ax.set_xlim(-0.6, len(x) - 0.4)
        ax.set_xticks(x, ticks)
        ax.set(xlabel=key, title=bars.metric.label)
    fig.suptitle(
        f"Cost per {key} value (mean ± std over finished trials, other keys pooled; grey = baseline)\n"
        f"peak mem per worker: {data.memory_measure}; total: the sum over the workers",
        fontsize=10,
    )
    _save(fig, out_dir / f"{key}_cost.png")

    fig = _figure(7, 4.5)
    ax = fig.subplots()
    axis, order = data.axis, data.order
    for series, color in zip(data.series, ("tab:blue", "tab:orange")):
        ax.errorbar(
            series.x[order],
            series.mean[order],
            yerr=series.std[order],
            fmt="o" if axis == "category" else "o-",
            color=color,
            capsize=4,
            label=series.label,
        )
        for at, points in zip(series.x, series.trials):
            ax.scatter(np.full(len(points), at), points, color=color, alpha=0.35, s=14)
    if axis == "log2":
        ax.set_xscale("log", base=2)
    elif axis == "log10":
        ax.set_xscale("log")
    ax.set_xticks(data.positions, ticks)
    ax.xaxis.set_minor_locator(NullLocator())
    if axis == "category":
        ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.set(
        xlabel=f"{key} ({AXIS_NAMES[axis]})",
        ylabel="test accuracy (%)",
        title=f"Test accuracy vs {key} (dots = trials)",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)  # below: never on the data
    _save(fig, out_dir / f"{key}_accuracy.png")
    what = "Final and best test accuracy" if len(data.series) == 2 else "Final test accuracy (= best in every trial)"
    return [
        (f"{key}_accuracy.png", f"{what} vs {key}"),
        (
            f"{key}_cost.png",
            f"Time per epoch, throughput and peak memory (per worker, total over workers) per {key} value",
        ),
    ]


def plot_factor(report: Report, key: str, out_dir: Path) -> list[tuple[str, str]]:
    return draw_factor(factor_plot_data(report, key), out_dir)
