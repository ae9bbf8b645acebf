"""README.md, section by section: each function returns one section's Markdown, and render_markdown lists them in
page order."""

from __future__ import annotations

from .build import Report
from .findings import findings, pair_partner, run_level_note, shared_gpu_note
from .format import fmt_int, fmt_pct, fmt_value, last_line
from .header import header_section, status_counts
from .load import TIME_PER_EPOCH_RULE
from .metrics import PAIRED_METRICS
from .stats import OVERFIT_RULE
from .tables import (
    factor_breakdown_table,
    factor_table,
    has_train_eval,
    paired_table,
    trial_breakdown_table,
    trial_table,
)

RUNNING_NOTE = (
    "Running train accuracy and loss are means over the epoch's training steps, taken with augmentation "
    "and dropout on while the weights still change, so they trail the model at the end of the epoch and "
    "can read below test accuracy: not a like-for-like comparison with the test metrics."
)

EVAL_NOTE = (
    "Eval train accuracy and loss evaluate the first `train_eval_size` training images{size} after each epoch "
    "exactly as the test set is (eval mode, no augmentation, the same code): the like-for-like comparison."
)


def train_metrics_note(report: Report) -> str:
    """What the train accuracy and loss columns measure: the running means, and the eval ones where logged."""
    if not has_train_eval(report):
        return f"{RUNNING_NOTE} These logs have no eval train metrics (train_eval_acc): the gap is not like-for-like."
    sizes = {
        t.config.get("train_eval_size")
        for t, basis in zip(report.run.trials, report.trials["train_basis"])
        if basis == "eval"
    }
    size = f" ({fmt_value(sizes.pop())} here; all of them when the training set is smaller)" if len(sizes) == 1 else ""
    return f"{RUNNING_NOTE} {EVAL_NOTE.format(size=size)}"


def _gap_note(report: Report) -> str:
    if not has_train_eval(report):
        return "gap = final running train acc − final test acc (percentage points)"
    t = report.trials
    running = ((t["train_basis"] == "running") & (t["epochs_done"] > 0)).any()
    return "gap = final eval train acc − final test acc (percentage points" + (
        "; † the running train acc: the trial logged no eval one)" if running else ")"
    )


def memory_note(report: Report) -> str:
    """What the two peak memory columns measure, worded from the trials' devices."""
    t = report.trials
    missing = ((t["epochs_done"] > 0) & t["peak_mem_total_mb"].isna()).any()
    return (
        f"Peak mem per worker: {report.memory_measure}, the largest over the workers and epochs: what must fit "
        "on one device. Peak mem, total over workers: the sum of every worker's peak (of every GPU's with "
        "strategy=dp), the largest over epochs: what running it occupies (at most: the workers may peak at "
        "different moments)" + ("; — where the logs have no total (peak_mem_total_mb)." if missing else ".")
    )


def _overfit_sentences(report: Report) -> list[str]:
    lines = []
    for _, r in report.trials[report.trials["overfitting"]].iterrows():
        o = report.overfits[r["trial"]]
        label = report.trial_label(r)
        basis = r["train_basis"]
        lines.append(
            f"- `{r['trial']}` ({label}): test loss bottomed at {o.test_min:.4f} in epoch {o.min_epoch}, "
            f"then rose to {o.test_at_onset:.4f} in epoch {o.onset} "
            f"({100 * (o.test_at_onset / o.test_min - 1):+.1f} %) while {basis} train loss fell from "
            f"{o.train_at_min:.4f} to {o.train_at_onset:.4f}; final {basis} train − test accuracy gap "
            f"{fmt_pct(r['gap'])} pp" + ("." if basis == "eval" else " (running: not like-for-like).")
        )
    return lines


def _excluded_lines(report: Report) -> list[str]:
    lines = []
    for _, r in report.trials[report.trials["status"] != "finished"].iterrows():
        label = report.trial_label(r)
        done, planned = r["epochs_done"], fmt_int(r["epochs_planned"])
        status = r["status"]
        error = last_line(r["error"])
        if status == "diverged":
            why = f"diverged at epoch {fmt_int(r['diverged_epoch'])} (non-finite loss)"
        elif status == "failed":
            why = f"failed after {done} of {planned} epochs"
        elif status == "oom":
            why = f"ran out of memory after {done} of {planned} epochs"
        elif status == "running":
            why = f"still running: {done} of {planned} epochs so far"
        else:
            why = f"{status}: {done} of {planned} epochs"
        lines.append(f"- `{r['trial']}` ({label}): {why}" + (f" — `{error}`" if error else "") + ".")
    return lines


Plots = list[tuple[str, str]]  # (file, caption) of each plot a section shows


def _lines(*lines: str) -> str:
    return "\n".join(lines)


def findings_section(report: Report) -> str:
    counts = status_counts(report.trials)
    excluded = len(report.trials) - counts["finished"]
    scope = (
        f"Aggregates use the {counts['finished']} finished trial(s) only; the {excluded} other trial(s) "
        "are excluded (listed under *Excluded trials*)."
        if excluded
        else "Every trial finished and enters the aggregates."
    )
    return _lines("## Findings", "", *(f"- {line}" for line in findings(report)), "", scope, "")


def _paired_effect_text(report: Report, key: str) -> list[str]:
    """The paired effects of `key` with how they are computed; none for a factor with a single value."""
    if not len(report.effects[key][PAIRED_METRICS[0].column]):
        return []
    base = f"{key}={fmt_value(report.baseline[key])}"
    partner = pair_partner(report, key, f"trial that has {base} and the same other keys and seed")
    return [
        f"Paired effect vs the baseline {base}: each finished trial with another {key} value is paired "
        f"with the finished {partner}; the table gives the "
        "mean of the differences (value − baseline) and a Student-t 95 % confidence interval over the "
        "pairs. An interval that excludes 0 is a real effect; its width covers seed noise and any "
        f"change of the effect across the other keys' values.{run_level_note(report, key)}",
        "",
        paired_table(report, key),
        "",
        *([note, ""] if (note := shared_gpu_note(report)) else []),
    ]


def factor_section(report: Report, key: str, plots: Plots) -> str:
    """`## Effect of key`: its paired effects, its per-value means, their step-time breakdown and its plots."""
    base = f"{key}={fmt_value(report.baseline[key])}"
    best = "highest" if report.objective.better == "max" else "lowest"
    breakdown = (
        ["Step-time breakdown (seconds per epoch, mean ± std):", "", factor_breakdown_table(report, key), ""]
        if report.breakdown
        else []
    )
    return _lines(
        f"## Effect of `{key}`",
        "",
        *_paired_effect_text(report, key),
        "Per-value means, not effects: mean ± sample std (ddof=1; — for a single trial) over finished "
        "trials with each value, all other keys and seeds pooled, so they also carry the other keys' "
        f"effects. Δ = difference of these means vs {base}: accuracy in percentage points, others in "
        f"percent. Bold: the best value per column (for {report.objective.label}, the sweep's metric, the "
        f"{best}). {memory_note(report)}",
        "",
        factor_table(report, key),
        "",
        *breakdown,
        *(f"![{caption}]({file})" for file, caption in plots),
        "",
    )


def trials_section(report: Report) -> str:
    """`## Trials`: a row per trial, what its columns mean, and each trial's step-time breakdown."""
    breakdown = (
        [
            "### Step-time breakdown",
            "",
            "Mean seconds per epoch after the first (share of time/epoch):",
            "",
            trial_breakdown_table(report),
            "",
        ]
        if report.breakdown
        else []
    )
    return _lines(
        "## Trials",
        "",
        trial_table(report),
        "",
        f"Accuracies are at the last logged epoch unless marked best; {_gap_note(report)}; time = sum of epoch "
        f"times; time/epoch is {TIME_PER_EPOCH_RULE}; samples/s and the step-time breakdown are means over those "
        "epochs; eff. batch = batch_size × accum_steps. "
        f"{train_metrics_note(report)} {memory_note(report)}",
        "",
        *breakdown,
    )


def overfitting_section(report: Report) -> str:
    flagged = _overfit_sentences(report)
    return _lines(
        "## Overfitting",
        "",
        OVERFIT_RULE,
        "",
        train_metrics_note(report),
        "",
        *(flagged or ["No trial is flagged."]),
        "",
    )


def excluded_section(report: Report) -> str:
    """`## Excluded trials` with why each is excluded; "" when every trial finished."""
    excluded = _excluded_lines(report)
    return _lines("## Excluded trials", "", "Not in the aggregates above:", "", *excluded, "") if excluded else ""


def curves_section(plots: Plots) -> str:
    return _lines("## Training curves", "", *(f"![{caption}]({file})" for file, caption in plots), "")


def render_markdown(report: Report, plots: dict[str, Plots]) -> str:
    """README.md: `plots` maps a factor to its plots ("" to the training curves)."""
    sections = [
        header_section(report),
        findings_section(report),
        *(factor_section(report, key, plots.get(key, [])) for key in report.factors),
        trials_section(report),
        overfitting_section(report),
        excluded_section(report),
        curves_section(plots.get("", [])),
    ]
    return "\n".join(section for section in sections if section)
