"""How close the trials run to what the device can do, and what holds them back: the answer, in numbers, to "why does
time per epoch stop falling as the batch grows". Its data function (`roofline_data`: what the tests check), its plot
(`draw_roofline`: MFU per factor value; matplotlib only there) and the report's blocks (`roofline_blocks`).

- MFU: each trial's mean over its epochs of model FLOP/s over the devices' peak (training/flops.py measures both).
- The bound: the phase of the step-time breakdown that takes the largest share of training (evaluation aside):
  compute (at the trial's MFU), or data, the optimizer step or communication (the all-reduce wait).
- What a larger batch can still gain: the optimizer step and the all-reduce cost the same per step whatever the
  batch, so a larger batch spreads them over more images; at most 1 / (1 - their share) images/s more at the same
  MFU. Data and compute grow with the images, so beyond that only a higher MFU makes an epoch faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.runlog import ALLREDUCE_ESTIMATE_KEY
from .build import Report
from .document import Block, Figure, Heading, Paragraph, Table
from .format import fmt_num, fmt_value
from .stats import rows_with

# The training phases of the step-time breakdown (runlog.BREAKDOWN_KEYS less evaluation) by the bound each names.
PHASES = {
    "time_compute_s": "compute",
    "time_data_s": "data",
    "time_optimizer_s": "optimizer",
    "time_allreduce_s": "communication",
    ALLREDUCE_ESTIMATE_KEY: "communication",  # DDP on CUDA: estimated, in place of time_allreduce_s
}
PER_STEP = ("optimizer", "communication")  # the phases that cost the same per step whatever the batch
PLOT_FILE = "roofline_mfu.png"


@dataclass(frozen=True)
class Bound:
    """Where one trial's (or one group's mean) training time goes."""

    phase: str  # the largest share: compute, data, optimizer or communication
    shares: dict[str, float]  # PHASES' names -> share of the training time (0-1)
    mfu: float
    batch_gain: float  # the most a larger batch can speed up images/s at this MFU: 1 / (1 - per-step share)


def bound(times: pd.Series | dict, mfu: float) -> Bound | None:
    """The bound of one breakdown (a trial row's mean seconds per phase); None when it logged no training time."""
    seconds: dict[str, float] = {}
    for key, name in PHASES.items():
        value = float(times.get(key, math.nan))
        if not math.isnan(value):  # a trial logs the all-reduce measured or estimated, never both
            seconds[name] = seconds.get(name, 0.0) + value
    total = sum(seconds.values())
    if not total > 0:
        return None
    shares = {name: value / total for name, value in seconds.items()}
    per_step = sum(shares.get(name, 0.0) for name in PER_STEP)
    return Bound(max(shares, key=shares.get), shares, mfu, 1 / (1 - per_step) if per_step < 1 else math.inf)


@dataclass(frozen=True)
class FactorPoint:
    """One value of a swept factor: its finished trials' mean MFU and FLOP/s and the bound of their mean breakdown."""

    value: Any
    n: int
    mfu: float
    flops_per_s: float
    bound: Bound | None


@dataclass(frozen=True)
class RooflineData:
    trials: pd.DataFrame  # the finished trials that logged MFU, with a `bound` column (Bound or None)
    factors: dict[str, list[FactorPoint]]  # factor -> one point per grid value, in grid order
    peak_sources: list[str]  # how the trials' peaks were found, each once
    largest_batch: pd.Series | None  # the trial row behind the batch-gain sentence: largest batch, then highest MFU


def _measured(report: Report) -> pd.DataFrame:
    t = report.trials
    if "mfu" not in t:
        return t.iloc[0:0]
    return t[(t["status"] == "finished") & t["mfu"].notna()]


def roofline_data(report: Report) -> RooflineData:
    measured = _measured(report).copy()
    breakdown = [key for key in PHASES if key in measured]
    measured["bound"] = [bound(row, row["mfu"]) for _, row in measured.iterrows()] if len(measured) else []
    factors = {}
    for key in report.factors:
        points = []
        for value in report.grid[key]:
            rows = rows_with(measured, key, value)
            mean_bound = bound(rows[breakdown].mean(), float(rows["mfu"].mean())) if len(rows) else None
            points.append(
                FactorPoint(value, len(rows), float(rows["mfu"].mean()), float(rows["flops_per_s"].mean()), mean_bound)
            )
        factors[key] = points
    largest = None
    if len(measured):
        ordered = measured.sort_values(["effective_batch", "mfu"], ascending=False, kind="stable")
        largest = ordered.iloc[0]
    sources = list(dict.fromkeys(s for s in measured.get("peak_source", []) if isinstance(s, str)))
    return RooflineData(measured, factors, sources, largest)


def _pct(fraction: float) -> str:
    return "—" if math.isnan(fraction) else f"{100 * fraction:.0f} %"


def finding(data: RooflineData, report: Report) -> str:
    """The Q&A's answer in one paragraph: what bounds the trials, at what share of the peak, and what a larger batch
    can still gain; "" when no finished trial logged its MFU."""
    t = data.trials
    if not len(t):
        return ""
    phases = [b.phase for b in t["bound"] if b is not None]
    counts = {phase: phases.count(phase) for phase in dict.fromkeys(phases)}
    compute = t[[b is not None and b.phase == "compute" for b in t["bound"]]]
    parts = []
    if len(compute):
        low, high = compute["mfu"].min(), compute["mfu"].max()
        at = _pct(low) if math.isclose(low, high, rel_tol=0.005) else f"{_pct(low)}–{_pct(high)}"
        parts.append(f"**Compute-bound** in {len(compute)} of {len(t)} finished trials, at {at} of the peak")
    others = [f"{phase} in {n}" for phase, n in counts.items() if phase != "compute"]
    if others:
        parts.append(("bound by " if parts else "**Bound by** ") + ", ".join(others) + " (largest share of step time)")
    sources = "; ".join(data.peak_sources) or "not recorded"
    text = "; ".join(parts) + f" (peak of a device: {sources}; a trial's is the sum over its devices)."
    row = data.largest_batch
    b = row["bound"] if row is not None else None
    if b is not None:
        per_step = sum(b.shares.get(name, 0.0) for name in PER_STEP)
        name = report.trial_label(row)
        text += (
            f" At the largest effective batch ({fmt_value(row['effective_batch'])}, `{name}`) the per-step costs "
            f"(optimizer step, all-reduce) take {_pct(per_step)} of the step: a still larger batch gains at most "
            f"{b.batch_gain:.2f}× images/s from them; beyond that only a higher MFU ({_pct(b.mfu)} now) makes "
            "an epoch faster."
        )
    batch = data.factors.get("batch_size")
    measured = [p for p in batch or [] if p.n]
    if len(measured) > 1:
        first, last = measured[0], measured[-1]
        text += (
            f" Over batch_size {fmt_value(first.value)} → {fmt_value(last.value)}, MFU went "
            f"{_pct(first.mfu)} → {_pct(last.mfu)}."
        )
    return text


def factor_rows(points: list[FactorPoint]) -> tuple[tuple[str, ...], ...]:
    return tuple(
        (
            fmt_value(p.value),
            str(p.n),
            fmt_num(p.flops_per_s / 1e9) if p.n else "—",
            _pct(p.mfu),
            p.bound.phase if p.bound else "—",
            f"{p.bound.batch_gain:.2f}×" if p.bound else "—",
        )
        for p in points
    )


def draw_roofline(data: RooflineData, path: Path) -> None:
    """MFU (%) per value of each factor, one panel per factor, each bar labelled with its bound."""
    from .plots import _figure, _save

    fig = _figure(3.2 * max(1, len(data.factors)), 3.0)
    axes = fig.subplots(1, max(1, len(data.factors)), squeeze=False)[0]
    for ax, (key, points) in zip(axes, data.factors.items()):
        labels = [fmt_value(p.value) for p in points]
        heights = [0.0 if math.isnan(p.mfu) else 100 * p.mfu for p in points]
        bars = ax.bar(range(len(points)), heights, color="tab:blue")
        ax.bar_label(bars, [p.bound.phase if p.bound else "" for p in points], fontsize=7)
        ax.set_xticks(range(len(points)), labels, fontsize=8, rotation=30 if len(points) > 4 else 0)
        ax.set_xlabel(key)
        ax.set_ylabel("MFU (% of peak)")
        ax.set_ylim(0, max(heights + [1.0]) * 1.2)
    _save(fig, path)


def shows_plot(data: RooflineData, report: Report) -> bool:
    """Whether roofline_blocks shows the plot (PLOT_FILE): a finding and factors to plot."""
    return bool(data.factors and finding(data, report))


def roofline_blocks(report: Report) -> list[Block]:
    """The report's section: the finding, MFU per factor value (a table per factor) and its plot, PLOT_FILE beside the
    report (drawn where shows_plot: draw_roofline(roofline_data(report), folder / PLOT_FILE)). Nothing for runs
    without MFU."""
    data = roofline_data(report)
    text = finding(data, report)
    if not text:
        return []
    blocks: list[Block] = [Heading("Where the time goes: MFU and what bounds it"), Paragraph(text)]
    headers = ("n", "GFLOP/s", "MFU", "bound", "larger batch: at most")
    for key, points in data.factors.items():
        blocks.append(Table((key, *headers), factor_rows(points), "lrrrlr", name=f"roofline-{key}"))
    if shows_plot(data, report):
        blocks.append(Figure(PLOT_FILE, "MFU (% of the devices' peak) per factor value, labelled with the bound"))
    return blocks
