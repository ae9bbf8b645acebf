"""The findings: facts read off the configuration tables (best by the sweep's metric, fastest, most accurate, least
memory) and the paired effect of each factor, each a sentence."""

from __future__ import annotations

import pandas as pd

from .build import Report
from .compare import RUN_FACTOR
from .format import (
    best_phrase,
    fmt_mean_std,
    fmt_metric,
    fmt_num,
    fmt_pct,
    fmt_value,
    is_missing,
    paired_parts,
    values_label,
    verdict,
)
from .header import run_level_text
from .metrics import FACTOR_METRICS, PAIRED_METRICS, Metric
from .sharing import gpu_neighbours


def _best(frame: pd.DataFrame, column: str, better: str) -> tuple[int, int] | None:
    """Row labels of the best and the worst value of `column` (NaN ignored), or None."""
    values = frame[column].dropna()
    if len(values) < 1:
        return None
    return (values.idxmax(), values.idxmin()) if better == "max" else (values.idxmin(), values.idxmax())


def shared_gpu_note(report: Report) -> str:
    """One line naming the finished trials that shared a GPU (report/sharing.py), whose times the time comparisons
    use; "" when none did (CPU trials never)."""
    finished = set(report.trials.loc[report.trials["status"] == "finished", "trial"])
    by_reason: dict[str, list[str]] = {}
    for name, reason in gpu_neighbours(report.run.trials).items():
        if name in finished:
            by_reason.setdefault(reason, []).append(name)
    if not by_reason:
        return ""
    shared = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())
    return f"Time/epoch of trials that shared a GPU includes their neighbours' contention: {shared}."


def findings(report: Report) -> list[str]:
    """Facts read off the configuration tables (best by the sweep's metric, fastest, most accurate, least memory)
    and the paired effects of each factor."""
    configs = report.configs[report.configs["n"] > 0]
    done = int((report.trials["status"] == "finished").sum())
    if not len(configs):
        return ["No trial finished: there is nothing to compare yet."]
    lines = []
    repeated = report.run.sweep.get("repeats", 1) not in (None, 1) or "seed" in report.grid
    unit = "configuration (mean over its finished seeds)" if repeated else "configuration"

    def name(i: int) -> str:
        return values_label(configs.loc[i], report.factors) or "the only configuration"

    def n_note(i: int) -> str:
        n = int(configs.loc[i, "n"])
        return f", mean of {n} trials" if n > 1 else ""

    if len(configs) == 1:
        config = configs.loc[configs.index[0]]
        accuracy = fmt_mean_std(FACTOR_METRICS[0], config["final_test_acc_mean"], config["final_test_acc_std"])
        return [
            f"One {unit}: final test accuracy {accuracy} %, "
            f"{fmt_num(config['time_per_epoch_s_mean'])} s/epoch, peak memory {_memory_text(config)} "
            f"({done} finished trial{'s' if done != 1 else ''})."
        ]

    best = report.objective
    if report.objective_note:
        lines.append(f"**Best** means the {best_phrase(best)} ({report.objective_note}).")
    pick = _best(configs, f"{best.column}_mean", best.better) if best != FACTOR_METRICS[0] else None
    if pick:  # the default objective's best is the Most accurate line
        top, low = pick
        lines.append(
            f"**Best** {unit} by the sweep's metric ({best_phrase(best)}): {name(top)} at "
            f"{fmt_metric(best, configs.loc[top, f'{best.column}_mean'])}{n_note(top)}; the worst is "
            f"{name(low)} ({fmt_metric(best, configs.loc[low, f'{best.column}_mean'])})."
        )
    pick = _best(configs, "time_per_epoch_s_mean", "min")
    if pick:
        fast, slow = pick
        t_fast, t_slow = configs.loc[fast, "time_per_epoch_s_mean"], configs.loc[slow, "time_per_epoch_s_mean"]
        lines.append(
            f"**Fastest** {unit}: {name(fast)} at {fmt_num(t_fast)} s/epoch{n_note(fast)}; "
            f"{t_slow / t_fast:.2f}× faster than the slowest, {name(slow)} ({fmt_num(t_slow)} s/epoch)."
        )
        if note := shared_gpu_note(report):
            lines.append(note)
    pick = _best(configs, "final_test_acc_mean", "max")
    if pick:
        top, low = pick
        a_top, a_low = configs.loc[top, "final_test_acc_mean"], configs.loc[low, "final_test_acc_mean"]
        ratio = f"; {(1 - a_low) / (1 - a_top):.2f}× fewer test errors" if a_top < 1 else ""
        lines.append(
            f"**Most accurate**: {name(top)} at {fmt_pct(a_top)} % final test accuracy{n_note(top)}; "
            f"{100 * (a_top - a_low):+.2f} pp over the least accurate, {name(low)} ({fmt_pct(a_low)} %){ratio}."
        )
    # Ranked by the total (what running the configuration costs) when every configuration logged one.
    by_total = bool(configs["peak_mem_total_mb_mean"].notna().all())
    column = "peak_mem_total_mb_mean" if by_total else "peak_mem_mb_mean"
    pick = _best(configs, column, "min")
    if pick:
        small, big = pick
        m_small, m_big = configs.loc[small, column], configs.loc[big, column]
        ratio = f"{m_big / m_small:.2f}× less than" if m_small > 0 else "versus"
        basis = (
            "by the peak total over workers, what the configuration occupies; per worker is what must fit on one device"
            if by_total
            else "by the peak per worker: not every configuration logged a total"
        )
        lines.append(
            f"**Least memory** ({basis}): {name(small)} at {_memory_text(configs.loc[small])}{n_note(small)}; "
            f"{ratio} the most, {name(big)} ({_memory_text(configs.loc[big])})."
        )
    for key in report.factors:
        lines.extend(_factor_finding(report, key))
    return lines


def _memory_text(config: pd.Series) -> str:
    """`2,200 MB total over workers, 1,100 MB per worker` for a configuration row; per worker alone without a total."""
    per_worker = f"{fmt_num(config['peak_mem_mb_mean'])} MB per worker"
    total = config["peak_mem_total_mb_mean"]
    return per_worker if is_missing(total) else f"{fmt_num(total)} MB total over workers, {per_worker}"


def _paired_text(metric: Metric, row: pd.Series, unit: str) -> str:
    """`+1.00 pp (95 % CI +0.85 to +1.15 pp, 9 pairs)`."""
    mean, low, high = paired_parts(metric, row)
    n = int(row["n_pairs"])
    return f"{mean} {unit} (95 % CI {low} to {high} {unit}, {n} pairs)" if n > 1 else f"{mean} {unit} (1 pair)"


def pair_partner(report: Report, key: str, swept: str) -> str:
    """The trial a trial with another value of `key` is paired with: `swept` (the words for a swept key), or for the
    run factor the trial of the baseline run with an equal config apart from the run-level keys (RUN_MATCH_RULE)."""
    if report.comparison and key == RUN_FACTOR:
        return f"trial of run {fmt_value(report.baseline[key])} with an equal config apart from the run-level keys"
    return swept


def run_level_note(report: Report, key: str) -> str:
    """For the run factor, the run-level keys its effect includes; "" otherwise."""
    if not (report.comparison and key == RUN_FACTOR and report.comparison.run_level):
        return ""
    return f" The runs also differ in run-level keys, part of this effect: {run_level_text(report)}."


def _factor_finding(report: Report, key: str) -> list[str]:
    acc, time = (report.effects[key][m.column] for m in PAIRED_METRICS)
    if not len(acc):  # a single grid value: nothing to compare
        return []
    base = fmt_value(report.baseline[key])
    partner = pair_partner(report, key, f"trial with {key}={base} and the same other keys and seed")
    parts = []
    for (_, a), (_, t) in zip(acc.iterrows(), time.iterrows()):
        part = f"{key}={fmt_value(a[key])}: "
        if a["n_pairs"] == 0:
            parts.append(part + f"no matched pairs (no finished {partner}), so no effect is estimated")
            continue
        part += f"final test accuracy {_paired_text(PAIRED_METRICS[0], a, 'pp')}, {verdict(a)}"
        if t["n_pairs"]:
            part += f"; time/epoch {_paired_text(PAIRED_METRICS[1], t, 's')}"
        parts.append(part)
    line = (
        f"**{key}** (baseline {base}; paired differences vs the {partner}): "
        + ". ".join(parts)
        + "."
        + run_level_note(report, key)
    )
    std, configs = report.noise
    if configs:
        line += (
            f" Seed noise: {100 * std:.2f} pp (pooled within-configuration std of final test accuracy over "
            f"{configs} configuration{'s' if configs != 1 else ''} with ≥ 2 finished seeds)."
        )
    return [line]
