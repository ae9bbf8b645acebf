"""The plots people look for first, one line per configuration (mean over its finished seeds): test accuracy against
wall-clock time (progress_data, with the target accuracy where set), the speed-up against workers beside the ideal
linear one (speedup_data, per cell of the other factors where the time effect of workers depends on them), and train
and test accuracy per epoch (fit_data: the overfitting question). Readable at any number of configurations: the
HIGHLIGHT best by the sweep's metric are coloured and named, the rest drawn faint and unnamed. Each plot has a data
function (what the tests check) and a drawing function (matplotlib, imported only there)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .build import Report
from .effects import DEPENDS
from .format import fmt_value, value_key, values_label
from .interactions import stratum_label
from .screen import shown_configs
from .stats import TRAIN_COLUMNS, config_members, included, train_basis

HIGHLIGHT = 6  # configurations named and coloured in a plot; the rest faint
WORKERS = "workers"


@dataclass(frozen=True)
class ConfigCurve:
    """One configuration's mean over its finished seeds per epoch: `x` (wall-clock seconds since its first epoch
    began, or the epoch), `y` and its spread over seeds (`low`, `high`: the least and the most), in percent."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    highlighted: bool
    dashed_y: tuple[float, ...] = ()  # a second curve on the same x (train accuracy beside test accuracy)


def _highlighted(report: Report) -> list[tuple]:
    """The typed keys of the HIGHLIGHT best configurations by the sweep's metric."""
    configs, _ = shown_configs(report)
    best = configs[configs["n"] > 0].head(HIGHLIGHT)
    return [tuple(value_key(row[key]) for key in report.factors) for _, row in best.iterrows()]


def _config_epochs(report: Report, config: pd.Series) -> list[pd.DataFrame]:
    """The epochs of each finished trial of a configuration, in epoch order."""
    trials = included(config_members(report.trials, report.factors, config))
    epochs = report.epochs
    return [epochs[epochs["trial"] == name].sort_values("epoch") for name in trials["trial"]]


def _curves(report: Report, x_of, y_column, dashed_column=None) -> list[ConfigCurve]:
    """A ConfigCurve per configuration with a finished trial, over the epochs every one of its seeds logged."""
    top = _highlighted(report)
    curves = []
    for _, config in report.configs.iterrows():
        runs = _config_epochs(report, config)
        if not runs:
            continue
        n = min(len(e) for e in runs)
        xs = [x_of(e).to_numpy()[:n] for e in runs]
        ys = [100 * e[y_column(e)].to_numpy()[:n] for e in runs]
        dashed = [100 * e[dashed_column(e)].to_numpy()[:n] for e in runs] if dashed_column else []
        key = tuple(value_key(config[k]) for k in report.factors)
        curves.append(
            ConfigCurve(
                values_label(config, report.factors) or report.name,
                tuple(statistics.fmean(v) for v in zip(*xs)),
                tuple(statistics.fmean(v) for v in zip(*ys)),
                tuple(min(v) for v in zip(*ys)),
                tuple(max(v) for v in zip(*ys)),
                key in top,
                tuple(statistics.fmean(v) for v in zip(*dashed)),
            )
        )
    return curves


@dataclass(frozen=True)
class ProgressData:
    curves: list[ConfigCurve]  # x: mean wall-clock seconds at each epoch's end, training and evaluation
    target_pct: float | None


def progress_data(report: Report) -> ProgressData:
    curves = _curves(report, lambda e: e["epoch_time_s"].cumsum(), lambda e: "test_acc")
    return ProgressData(curves, None if report.target is None else 100 * report.target)


def fit_data(report: Report) -> list[ConfigCurve]:
    """Test accuracy (y) and train accuracy (dashed_y: evaluated like the test set where logged, else the running
    one) per epoch (x), per configuration."""
    return _curves(
        report, lambda e: e["epoch"].astype(float), lambda e: "test_acc", lambda e: TRAIN_COLUMNS[train_basis(e)][1]
    )


@dataclass(frozen=True)
class SpeedupLine:
    label: str  # the cell of the other factors, or "" pooled over them
    workers: tuple[int, ...]
    speedup: tuple[float, ...]  # time per epoch at the fewest workers / at these (mean over seeds)


@dataclass(frozen=True)
class SpeedupData:
    lines: list[SpeedupLine]
    per_cell: bool  # the time effect of workers depends on the other factors: one line per cell


def speedup_data(report: Report) -> SpeedupData | None:
    """The speed-up per number of workers against the fewest, from the configurations' mean time per epoch: per
    cell of the other factors where workers' time effect depends on them, else their geometric mean over cells;
    None when `workers` is not a factor with two values or more."""
    if WORKERS not in report.factors or len(report.grid[WORKERS]) < 2:
        return None
    others = [key for key in report.factors if key != WORKERS]
    per_cell = any(
        e.verdict == DEPENDS and e.metric == "time_per_epoch" and e.factor == WORKERS and not e.cell
        for e in report.records
    )
    workers = sorted(report.grid[WORKERS])
    cells: dict[tuple, dict[int, float]] = {}
    labels: dict[tuple, str] = {}
    for _, config in report.configs.iterrows():
        key = tuple(value_key(config[k]) for k in others)
        labels[key] = stratum_label({k: config[k] for k in others})
        time = config["time_per_epoch_s_mean"]
        if not math.isnan(time):
            cells.setdefault(key, {})[int(config[WORKERS])] = time
    ratios = {
        key: {w: times[workers[0]] / times[w] for w in workers if w in times}
        for key, times in cells.items()
        if workers[0] in times
    }
    if per_cell:
        lines = [SpeedupLine(labels[key], tuple(r), tuple(r.values())) for key, r in ratios.items() if len(r) >= 2]
    else:
        pooled = {w: [r[w] for r in ratios.values() if w in r] for w in workers}
        shown = [w for w in workers if pooled[w]]
        lines = [
            SpeedupLine("", tuple(shown), tuple(math.exp(statistics.fmean(map(math.log, pooled[w]))) for w in shown))
        ]
    return SpeedupData([line for line in lines if len(line.workers) >= 2], per_cell)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig, path: Path) -> None:
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})  # no date chunk: same data, same bytes


def _draw_curves(ax, curves: list[ConfigCurve], band: bool) -> None:
    import matplotlib

    colors = [matplotlib.colormaps["tab10"](i) for i in range(HIGHLIGHT)]
    for curve in (c for c in curves if not c.highlighted):  # faint first, under the named ones
        ax.plot(curve.x, curve.y, color="0.75", linewidth=0.8, zorder=1)
    for color, curve in zip(colors, (c for c in curves if c.highlighted)):
        ax.plot(curve.x, curve.y, color=color, marker=".", label=curve.label, zorder=3)
        if curve.dashed_y:
            ax.plot(curve.x, curve.dashed_y, color=color, linestyle="--", zorder=3)
        if band and len(curve.x) and curve.low != curve.high:
            ax.fill_between(curve.x, curve.low, curve.high, color=color, alpha=0.15, linewidth=0, zorder=2)
    if any(c.highlighted for c in curves):
        ax.legend(fontsize=7, loc="lower right", frameon=False)


def draw_overview(report: Report, out_dir: Path) -> list[tuple[str, str]]:
    """The overview's PNGs and their alt text."""
    from matplotlib.ticker import MaxNLocator

    named = (
        f"the {HIGHLIGHT} best by the sweep's metric named, the rest grey" if len(report.configs) > HIGHLIGHT else ""
    )
    figures = []
    progress = progress_data(report)
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    _draw_curves(ax, progress.curves, band=True)
    if progress.target_pct is not None:
        ax.axhline(progress.target_pct, color="black", linestyle=":", linewidth=1)
    ax.set(xlabel="wall-clock time since the first epoch began (s)", ylabel="test accuracy (%)")
    ax.set_title("Test accuracy against wall-clock time")
    _save(fig, out_dir / "accuracy_vs_time.png")
    target = f"; dotted: the target, {fmt_value(progress.target_pct)} %" if progress.target_pct is not None else ""
    figures.append(
        (
            "accuracy_vs_time.png",
            "Test accuracy against wall-clock time, one line per configuration (mean over seeds, band: least to "
            f"most){'; ' + named if named else ''}{target}",
        )
    )
    speedup = speedup_data(report)
    if speedup and speedup.lines:
        fig = _figure(6, 4.5)
        ax = fig.subplots()
        workers = sorted({w for line in speedup.lines for w in line.workers})
        ax.plot(workers, [w / workers[0] for w in workers], color="black", linestyle=":", label="ideal (linear)")
        for line in speedup.lines[:HIGHLIGHT]:
            ax.plot(line.workers, line.speedup, marker="o", label=line.label or "measured")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="workers", ylabel=f"speed-up per epoch over {workers[0]} worker(s)")
        ax.set_title("Speed-up against workers")
        ax.legend(fontsize=7, loc="upper left", frameon=False)
        _save(fig, out_dir / "speedup.png")
        how = "per cell of the other factors (it depends on them)" if speedup.per_cell else "over the other factors"
        figures.append(
            (
                "speedup.png",
                f"Speed-up of time per epoch against workers, {how}, beside the ideal linear speed-up (dotted)",
            )
        )
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    _draw_curves(ax, fit_data(report), band=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="accuracy (%)")
    ax.set_title("Train (dashed) and test (solid) accuracy per epoch")
    _save(fig, out_dir / "train_test_accuracy.png")
    figures.append(
        (
            "train_test_accuracy.png",
            "Train accuracy (dashed) and test accuracy (solid) per epoch, one colour per configuration (mean over "
            f"seeds){'; ' + named if named else ''}: a widening gap is overfitting",
        )
    )
    return figures
