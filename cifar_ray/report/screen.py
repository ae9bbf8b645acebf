"""The report's first screen, what a student reads and hands in: every configuration in one table (config_table:
beyond MAX_CONFIG_ROWS, the best and the worst by the sweep's metric) and one short line per compared factor value
(answer_lines), each effect in a few words from its `Effect` record. The details (intervals' sources, noise, seeds
advice, test-set notes) are the findings' and the per-factor sections'. Formats records; computes nothing."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from ..core.text import text_table
from .build import Report
from .document import Table
from .effects import DEPENDS, DIFFERS, EQUIVALENT, FAILED, NO_PAIRS, NO_PRACTICAL, NO_VERDICT, OPEN, UNFAIR, Effect
from .format import fmt_mean_std, fmt_value, value_key
from .metrics import COMPARED, FACTOR_METRICS, Compared
from .verdicts import RATIO_BAND

# the order an answer line names the metrics in: what a configuration costs to reach the goal, then what it is
ANSWER_ORDER = ("time_to_target", "time_per_epoch", "peak_memory", "accuracy")
MAX_CONFIG_ROWS = 12  # beyond: the best and the worst half of these by the sweep's metric
OUTCOME_ORDER = ("finished", "diverged", "oom", "failed", "incomplete", "running", "interrupted", "pending")


def shown_configs(report: Report) -> tuple[pd.DataFrame, int]:
    """The configurations the table shows, best first by the sweep's metric (those with no finished trial last),
    and how many are left out: every one up to MAX_CONFIG_ROWS, else the best and the worst MAX_CONFIG_ROWS / 2."""
    column = f"{report.objective.column}_mean"
    configs = report.configs.sort_values(column, ascending=report.objective.better == "min", na_position="last")
    if len(configs) <= MAX_CONFIG_ROWS:
        return configs, 0
    half = MAX_CONFIG_ROWS // 2
    return pd.concat([configs.head(half), configs.tail(half)]), len(configs) - MAX_CONFIG_ROWS


def _outcomes_text(outcomes: dict[str, int]) -> str:
    """`3 finished`, `2 finished, 1 diverged`."""
    order = [o for o in OUTCOME_ORDER if outcomes.get(o)] + [o for o in outcomes if o not in OUTCOME_ORDER]
    return ", ".join(f"{outcomes[o]} {o}" for o in order) or "—"


def config_table(report: Report) -> Table:
    """One row per configuration: its values, its trials by outcome, time per epoch, peak memory and final test
    accuracy (mean ± sd over its finished seeds), and the time to the target where one is set."""
    configs, _ = shown_configs(report)
    memory = "peak mem, total (MB)" if report.memory_column == FACTOR_METRICS[5].column else "peak mem/worker (MB)"
    accuracy = FACTOR_METRICS[0]
    headers = [*report.factors, "trials", "s/epoch", memory, "final test acc (%)"]
    target = report.target is not None
    if target:
        headers.append(f"time to {fmt_value(round(100 * report.target, 6))} % (s)")
    rows = []
    for _, config in configs.iterrows():
        row = [fmt_value(config[key]) for key in report.factors]
        row += [
            _outcomes_text(config["outcomes"]),
            _mean_sd(None, config, "time_per_epoch_s"),
            _mean_sd(None, config, report.memory_column),
            _mean_sd(accuracy, config, accuracy.column),
        ]
        if target:
            row.append(_target_cell(config))
        rows.append(tuple(row))
    align = "l" * len(report.factors) + "l" + "r" * (len(headers) - len(report.factors) - 1)
    return Table(tuple(headers), tuple(rows), align, "configurations")


def _mean_sd(metric, config: pd.Series, column: str) -> str:
    """`mean ± sd` over a configuration's finished seeds; the mean alone for one seed."""
    mean, sd = config[f"{column}_mean"], config[f"{column}_std"]
    return fmt_mean_std(metric, mean, sd) if not pd.isna(sd) else fmt_mean_std(metric, mean, sd).split(" ± ")[0]


def _target_cell(config: pd.Series) -> str:
    """`41.2 ± 3.1 (3 of 3 reached)`, `not reached (0 of 3)`: mean ± sd over the seeds that reached the target."""
    reached, n = int(config["target_reached"]), int(config["n"])
    if not reached:
        return f"not reached (0 of {n})" if n else "—"
    time = _mean_sd(None, config, "time_to_target_s")
    return f"{time} ({reached} of {n} reached)"


def left_out_line(report: Report) -> str:
    """`188 more configurations are not shown: ...`, or "" when the table shows them all."""
    _, left_out = shown_configs(report)
    if not left_out:
        return ""
    return (
        f"{left_out} more configurations, between these best and worst by the sweep's metric, are in "
        "`configurations.csv` (`--format csv`)."
    )


def _ci(metric: Compared, effect: Effect, flip: bool) -> str:
    if effect.interval is None:
        return ""
    if metric.unit == "pp":
        return f" (CI {effect.interval.low:+.1f} to {effect.interval.high:+.1f})"
    low, high = (
        (1 / effect.interval.high, 1 / effect.interval.low) if flip else (effect.interval.low, effect.interval.high)
    )
    return f" (CI {low:.2f}–{high:.2f})"


def effect_phrase(report: Report, metric: Compared, effect: Effect) -> str:
    """One effect in a few words: `1.30x faster per epoch (CI 1.25–1.37)`, `accuracy +0.90 pp, undecided: 2 pairs`,
    `time per epoch depends on batch_size`."""
    if effect.verdict == DEPENDS:
        return f"{metric.label} depends on {', '.join(effect.depends_on)} (*Effects per cell*)"
    if effect.verdict == UNFAIR:
        return f"{metric.label} not judged (a shared device against one alone)"
    if effect.verdict == NO_PAIRS:
        return f"{metric.label}: no pairs yet"
    if metric.unit == "pp":
        size, flip = f"{metric.short} {effect.estimate:+.2f} pp", False
    else:
        flip = effect.estimate < 1
        ratio = 1 / effect.estimate if flip else effect.estimate
        about = f"to {fmt_value(round(100 * report.target, 6))} %" if metric.needs_target else metric.short
        size = f"{ratio:.2f}x {metric.words[0] if flip else metric.words[1]} {about}"
        if metric.name == COMPARED[2].name:
            size += " in total" if report.memory_column == FACTOR_METRICS[5].column else " per worker"
    band = RATIO_BAND if metric.unit == "ratio" else f"±{fmt_value(round(100 * report.margin, 6))} pp"
    if effect.verdict == DIFFERS:
        return size + _ci(metric, effect, flip)
    if effect.verdict == EQUIVALENT:
        return f"{metric.label} the same within {band}" if metric.unit == "ratio" else f"accuracy equivalent ({band})"
    if effect.verdict == NO_PRACTICAL:
        return f"{size}, within {band}: no practical difference"
    if effect.verdict == OPEN:
        return f"{size}, not conclusive"
    if effect.verdict == NO_VERDICT:
        lost = f"; {effect.pairs_lost} lost: not reached" if metric.needs_target and effect.pairs_lost else ""
        return f"{size} (undecided: {effect.pairs} pair{'s' * (effect.pairs != 1)}{lost})"
    return f"{size}, {effect.verdict}"


def _pooled(records: Iterable[Effect], factor: str) -> dict[tuple, dict[str, Effect]]:
    """The pooled effects of `factor`: its value's typed key, in grid order -> metric name -> effect."""
    out: dict[tuple, dict[str, Effect]] = {}
    for effect in records:
        if effect.factor == factor and not effect.cell:
            out.setdefault(value_key(effect.value), {})[effect.metric] = effect
    return out


def answer_lines(report: Report) -> list[str]:
    """One line per factor value against its baseline, at most about 30 words: each compared metric's effect in a
    few words (effect_phrase); a value that failed in every seed says only that."""
    lines = []
    metrics = sorted(
        (metric for metric in COMPARED if any(e.metric == metric.name for e in report.records)),
        key=lambda metric: ANSWER_ORDER.index(metric.name),
    )
    for key in report.factors:
        for effects in _pooled(report.records, key).values():
            first = next(iter(effects.values()))
            head = f"**{key}={fmt_value(first.value)}** vs {fmt_value(first.baseline)}: "
            if first.verdict == FAILED:
                lines.append(head + f"{first.reason}: nothing to compare.")
                continue
            phrases = [effect_phrase(report, m, effects[m.name]) for m in metrics if m.name in effects]
            accuracy = effects.get(COMPARED[0].name)
            lost = f"; lost: {accuracy.lost_why}" if accuracy and accuracy.pairs_lost and accuracy.lost_why else ""
            lines.append(head + "; ".join(phrases) + lost + ".")
    return lines


def answer_text(report: Report) -> list[str]:
    """The answer lines as plain text, for the terminal; [] with fewer than two configurations finished."""
    if report.configs["n"].gt(0).sum() < 2 and not any(e.verdict == FAILED for e in report.records):
        return []
    return [line.replace("**", "").replace("`", "") for line in answer_lines(report)]


def config_text(report: Report) -> list[str]:
    """The configuration table as terminal lines (and what it leaves out)."""
    table = config_table(report)
    lines = text_table([list(row) for row in table.rows], header=list(table.headers)).splitlines()
    left_out = left_out_line(report)
    return lines + ([left_out.replace("`", "")] if left_out else [])
