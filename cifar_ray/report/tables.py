"""The report's tables as document blocks: the trials (at most MAX_TRIAL_COLUMNS columns), each factor's compact
per-value means, its paired effects, and the step-time breakdown by factor value and by trial."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .build import Report
from .document import Table
from .effects import DEPENDS, DIFFERS, EQUIVALENT, NO_PRACTICAL, UNFAIR
from .findings import effect_text, fmt_p, verdict_text
from .format import (
    fmt_int,
    fmt_loss,
    fmt_mean_std,
    fmt_num,
    fmt_pct,
    fmt_value,
    is_missing,
    paired_parts,
    short_key,
)
from .interactions import by_label, stratum_label
from .judge import ci_label, fmt_dof
from .metrics import COMPARED, COST_METRICS, FACTOR_METRICS, PAIRED_METRICS, Metric
from .stats import WITHIN
from .verdicts import RATIO_BAND


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


def _outcome_cell(report: Report, r: pd.Series) -> str:
    return f"{r['outcome']} ({r['epochs_done']}/{fmt_int(r['epochs_planned'])})"


def _best_differs(report: Report) -> bool:
    t = report.trials
    return bool((t["best_test_acc"].notna() & (t["best_test_acc"] != t["final_test_acc"])).any())


def _several_workers(report: Report) -> bool:
    return bool((report.trials["workers"].fillna(1) > 1).any())


# The trial table after the trial and its label_keys, by priority: the first that a report shows, up to
# MAX_TRIAL_COLUMNS in all (every column stays in trials.csv and report.json).
MAX_TRIAL_COLUMNS = 10
TRIAL_COLUMNS = (
    TrialColumn("outcome (epochs)", "l", _outcome_cell),
    TrialColumn("final test acc (%)", "r", _field("final_test_acc", fmt_pct)),
    TrialColumn("best test acc (%) (epoch)", "r", _best_cell, _best_differs),
    TrialColumn("time/epoch (s)", "r", _field("time_per_epoch_s", fmt_num)),
    TrialColumn("MFU (%)", "r", _field("mfu", fmt_pct), has_flops),
    TrialColumn("GFLOP/s", "r", lambda report, r: fmt_num(r["flops_per_s"] / 1e9), has_flops),
    TrialColumn("peak mem per worker (MB)", "r", _field("peak_mem_mb", fmt_num)),
    TrialColumn("overfitting", "l", _overfit_cell, lambda report: bool(report.trials["overfitting"].any())),
    TrialColumn("peak mem, total over workers (MB)", "r", _field("peak_mem_total_mb", fmt_num), _several_workers),
    TrialColumn("gap (pp)", "r", _gap_cell),
    TrialColumn("workers", "r", _field("workers", fmt_int), lambda report: "workers" not in report.label_keys),
    TrialColumn("GPUs", "r", _field("gpus", fmt_int), lambda report: bool((report.trials["gpus"].fillna(0) > 0).any())),
    TrialColumn("device", "l", _field("device", str), lambda report: report.trials["device"].nunique() > 1),
    TrialColumn(
        "eff. batch", "r", _field("effective_batch", fmt_int), lambda r: r.trials["effective_batch"].nunique() > 1
    ),
    TrialColumn("test loss", "r", _field("final_test_loss", fmt_loss)),
)


def trial_table(report: Report) -> Table:
    columns = [TrialColumn("trial", "l", _field("trial", lambda name: f"`{name}`"))]
    columns += [TrialColumn(key, "l", _field(key, fmt_value)) for key in report.label_keys]
    columns += [column for column in TRIAL_COLUMNS if column.shown(report)]
    columns = columns[:MAX_TRIAL_COLUMNS]
    rows = tuple(tuple(column.cell(report, r) for column in columns) for _, r in report.trials.iterrows())
    return Table(tuple(c.header for c in columns), rows, "".join(c.align for c in columns), "trials")


def mean_metrics(report: Report) -> list[Metric]:
    """The per-value means' metrics: final test accuracy, the sweep's metric, best test accuracy where it differs
    from the final, time per epoch and peak memory (the total where some trial ran several workers)."""
    chosen = [FACTOR_METRICS[0], report.objective] + ([FACTOR_METRICS[1]] if _best_differs(report) else [])
    chosen += [FACTOR_METRICS[2], FACTOR_METRICS[4]] + ([FACTOR_METRICS[5]] if _several_workers(report) else [])
    unique: dict[str, Metric] = {}
    for metric in chosen:
        unique.setdefault(metric.column, metric)
    return list(unique.values())


def factor_table(report: Report, key: str) -> Table:
    """Per-value means, compact: n and mean ± std of mean_metrics()."""
    frame = report.groups[key]
    metrics = mean_metrics(report)
    rows = tuple(
        (
            fmt_value(r[key]) + (" (baseline)" if r["is_baseline"] else ""),
            str(r["n"]),
            *(fmt_mean_std(m, r[f"{m.column}_mean"], r[f"{m.column}_std"]) for m in metrics),
        )
        for _, r in frame.iterrows()
    )
    return Table((key, "n", *(m.label for m in metrics)), rows, "lr" + "r" * len(metrics), f"means-{key}")


def _ci_suffix(row: pd.Series) -> str:
    """The interval's label where it is not the plain 95 % one (findings.ci_label)."""
    if is_missing(row["vci_level"]):
        return ""
    label = ci_label(row)
    return "" if label == "95 % CI" else f" ({label})"


def _ratio_cell(row: pd.Series) -> str:
    """`0.65x [0.62, 0.68] (within-trial)`: value / baseline, the interval its verdict used, the noise it reads."""
    if row["n_pairs"] == 0:
        return "—"
    cell = f"{row['ratio']:.2f}x"
    if not is_missing(row["vci_level"]):
        cell += f" [{row['vci_low']:.2f}, {row['vci_high']:.2f}]{_ci_suffix(row)}"
    return cell + (" (within-trial)" if row["basis"] == WITHIN else "")


def _ratio_verdict(row: pd.Series, words: tuple[str, str]) -> str:
    verdict, band = row["verdict"], RATIO_BAND
    if verdict == DIFFERS:
        return words[0] if row["ratio"] < 1 else words[1]
    if verdict == EQUIVALENT:
        return f"within {band}"
    if verdict == NO_PRACTICAL:
        return f"no practical difference (within {band})"
    if verdict == DEPENDS:
        return f"depends on {', '.join(row['depends_on'])}"
    if verdict == UNFAIR:
        return "unfair: shared vs alone"
    return verdict


def paired_table(report: Report, key: str) -> Table:
    """A factor's paired effects: accuracy (a difference), time per epoch and peak memory (ratios, value / baseline),
    each with the interval its verdict used and the verdict."""
    acc = report.effects[key][PAIRED_METRICS[0].column]
    time, memory = report.effects[key][COST_METRICS[0].column], report.effects[key][report.memory_column]
    figure = "total" if report.memory_column == COST_METRICS[2].column else "per worker"
    headers = (
        "value",
        "pairs",
        "Δ final test acc (pp) [95 % CI unless marked]",
        "accuracy verdict",
        "time/epoch ratio [CI]",
        "time verdict",
        f"peak mem ({figure}) ratio [CI]",
        "memory verdict",
    )

    def acc_cell(row: pd.Series) -> str:
        if row["n_pairs"] == 0:
            return "—"
        mean, low, high = paired_parts(PAIRED_METRICS[0], row, ("vci_low", "vci_high"))
        return f"{mean} [{low}, {high}]{_ci_suffix(row)}" if row["n_pairs"] > 1 else mean

    rows = tuple(
        (
            f"{key}={fmt_value(a[key])}",
            f"{a['n_pairs']} of {a['n_planned']}",
            acc_cell(a),
            verdict_text(report, a),
            _ratio_cell(t),
            _ratio_verdict(t, COMPARED[1].words),
            _ratio_cell(m),
            _ratio_verdict(m, COMPARED[2].words),
        )
        for (_, a), (_, t), (_, m) in zip(acc.iterrows(), time.iterrows(), memory.iterrows())
    )
    return Table(headers, rows, "lrrlrlrl", f"effects-{key}")


def factor_breakdown_table(report: Report, key: str) -> Table:
    frame = report.groups[key]
    headers = (key, "n", "epoch (s)", *(f"{short_key(k)} (s)" for k in report.breakdown))
    rows = tuple(
        (
            fmt_value(r[key]),
            str(r["n"]),
            fmt_mean_std(None, r["time_per_epoch_s_mean"], r["time_per_epoch_s_std"]),
            *(fmt_mean_std(None, r[f"{k}_mean"], r[f"{k}_std"]) for k in report.breakdown),
        )
        for _, r in frame.iterrows()
    )
    return Table(headers, rows, "lr" + "r" * (1 + len(report.breakdown)), f"breakdown-{key}")


def trial_breakdown_table(report: Report) -> Table:
    headers = ("trial", "epoch (s)", *(f"{short_key(k)} (s, share)" for k in report.breakdown))
    rows = []
    for _, r in report.trials.iterrows():
        if r["epochs_done"] == 0:
            continue
        total = r["time_per_epoch_s"]
        cells = []
        for k in report.breakdown:
            share = f" ({100 * r[k] / total:.0f} %)" if total and not math.isnan(r[k]) else ""
            cells.append(fmt_num(r[k]) + share)
        rows.append((f"`{r['trial']}`", fmt_num(total), *cells))
    return Table(headers, tuple(rows), "l" + "r" * (1 + len(report.breakdown)), "breakdown-trials")


def _effect_label(row: pd.Series) -> str:
    return f"{row['factor']}={fmt_value(row['value'])} vs {fmt_value(row['baseline'])}"


def interaction_table(report: Report) -> Table:
    """One row per interaction tested or untestable: the metric, the effect, the factors across whose values (or
    cells) it is compared, the strata with pairs and those tested, the F statistic and its Holm-adjusted p, the
    result."""
    labels = {metric.name: metric.label for metric in COMPARED}
    rows = tuple(
        (
            labels[t["metric"]],
            _effect_label(t),
            by_label(t["by"]),
            f"{t['tested']} of {t['strata']}",
            "—" if t["df1"] == 0 else f"F({fmt_dof(t['df1'])}, {fmt_dof(t['df2'])}) = {fmt_num(t['F'])}",
            "—" if t["df1"] == 0 else f"p {fmt_p(t['p_holm'])}",
            t["result"],
        )
        for _, t in report.interactions.tests.iterrows()
    )
    headers = ("metric", "effect", "across", "strata tested", "test", "p (Holm)", "result")
    return Table(headers, rows, "lllrrrl", "interactions")


def cell_table(report: Report) -> Table:
    """The effects judged per cell of the other factors (judge.py), where an effect depends on them: the metric,
    the effect, the cell, its pairs, the estimate with the interval its verdict used, and the verdict."""
    labels = {metric.name: metric for metric in COMPARED}
    rows = []
    for effect in report.records:
        if not effect.cell:
            continue
        metric = labels[effect.metric]
        shown = effect_text(metric, effect.estimate)
        if effect.interval:
            low, high = effect.interval.low, effect.interval.high
            bounds = f"{low:+.2f}, {high:+.2f}" if metric.unit == "pp" else f"{low:.2f}, {high:.2f}"
            shown += f" [{bounds}] ({effect.interval.label})"
        verdict = (
            (metric.words[0] if effect.estimate < 1 else metric.words[1])
            if effect.verdict == DIFFERS and metric.unit == "ratio"
            else effect.verdict
        )
        rows.append(
            (
                metric.label,
                f"{effect.factor}={fmt_value(effect.value)} vs {fmt_value(effect.baseline)}",
                stratum_label(effect.cell),
                str(effect.pairs),
                shown,
                verdict,
            )
        )
    headers = ("metric", "effect", "cell", "pairs", "effect [CI]", "verdict")
    return Table(headers, tuple(rows), "lllrrl", "effects-per-cell")
