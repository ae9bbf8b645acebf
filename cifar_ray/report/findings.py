"""The findings: the leaders read off the configuration tables (best by the sweep's metric, fastest, most accurate,
least memory; named only beyond the seed noise) and the verdict of each accuracy comparison, each a sentence."""

from __future__ import annotations

import math

import pandas as pd

from ..core import runlog
from ..core.datasets import DATASET_SIZES
from ..core.status import trial_times
from ..core.sweep import REPEATS_MAX
from ..core.text import precise_duration, rough_duration
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
    same_value,
    values_label,
)
from .header import run_level_text
from .interactions import DEPENDS, DEPENDS_VERDICT, MIN_STRATUM_PAIRS, UNTESTABLE, stratum_label
from .load import config_value
from .metrics import FACTOR_METRICS, PAIRED_METRICS, Metric
from .sharing import gpu_neighbours
from .stats import UNFINISHED, included, pooled_std
from .verdicts import EQUIVALENT, MAX_PAIRS, MIN_PAIRS, NO_VERDICT, OPEN, leaders


def shared_gpu_note(report: Report) -> str:
    """One line naming the finished trials that shared a GPU (report/sharing.py), whose times the time comparisons
    use; "" when none did (CPU trials never)."""
    finished = set(included(report.trials)["trial"])
    by_reason: dict[str, list[str]] = {}
    for name, reason in gpu_neighbours(report.run.trials).items():
        if name in finished:
            by_reason.setdefault(reason, []).append(name)
    if not by_reason:
        return ""
    shared = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())
    return f"Time/epoch of trials that shared a GPU includes their neighbours' contention: {shared}."


def _leader_line(
    report: Report, configs: pd.DataFrame, title: str, metric: Metric, column: str, show, basis: str = ""
) -> str:
    """`**Fastest**: X at 4.11 s/epoch, …` where X beats every other configuration by more than the seed noise
    (verdicts.leaders); else the candidates within noise of it, or, with no repeated configuration, that the noise
    is unknown. "" when no configuration logged `column`."""
    means = configs[f"{column}_mean"]
    std, dof, _ = pooled_std(report.trials, report.factors, column)
    floor = None
    if metric.kind == "acc" and report.test_images:
        floor = means * (1 - means) / (report.test_images * configs["n"])
    within = leaders(means, configs["n"], metric.better, std, dof, floor)
    if within == []:
        return ""
    head = f"**{title}**" + (f" ({basis})" if basis else "")
    ranked = [i for i in means.dropna().sort_values(ascending=metric.better == "min").index]
    if within is not None and len(within) == 1:
        best, last = ranked[0], ranked[-1]
        return (
            f"{head}: {_name(report, configs, best)} at {show(configs.loc[best])}{_n_note(configs, best)}, beyond "
            f"the seed noise of every other configuration (the last: {_name(report, configs, last)}, "
            f"{show(configs.loc[last])})."
        )
    if within is None:
        first, last = ranked[0], ranked[-1]
        return (
            f"{head}: none named: no configuration ran twice, so the seed noise is unknown (measured: "
            f"{_name(report, configs, first)} {show(configs.loc[first])} to {_name(report, configs, last)} "
            f"{show(configs.loc[last])})."
        )
    listed = ", ".join(f"{_name(report, configs, i)} ({show(configs.loc[i])})" for i in ranked if i in within)
    return f"{head}: within noise of each other: {listed}."


def _name(report: Report, configs: pd.DataFrame, i) -> str:
    return values_label(configs.loc[i], report.factors) or "the only configuration"


def _n_note(configs: pd.DataFrame, i) -> str:
    n = int(configs.loc[i, "n"])
    return f", mean of {n} trials" if n > 1 else ""


def findings(report: Report) -> list[str]:
    """What the sweep shows, each a sentence: the leaders by the sweep's metric, time, accuracy and memory (named
    only beyond the seed noise), then one line per accuracy comparison with its verdict and the pairs behind it."""
    configs = report.configs[report.configs["n"] > 0]
    done = int(len(included(report.trials)))
    if not len(configs):
        return ["No trial finished with every epoch logged: there is nothing to compare yet."]
    if len(configs) == 1:
        config = configs.loc[configs.index[0]]
        accuracy = fmt_mean_std(FACTOR_METRICS[0], config["final_test_acc_mean"], config["final_test_acc_std"])
        return [
            f"One configuration: final test accuracy {accuracy} %, "
            f"{fmt_num(config['time_per_epoch_s_mean'])} s/epoch, peak memory {_memory_text(config)} "
            f"({done} included trial{'s' if done != 1 else ''})."
        ]
    lines = []
    best = report.objective
    if report.objective_note:
        lines.append(f"**Best** means the {best_phrase(best)} ({report.objective_note}).")
    if best != FACTOR_METRICS[0]:  # the default objective's best is the Most accurate line
        lines.append(
            _leader_line(
                report,
                configs,
                "Best",
                best,
                best.column,
                lambda c: fmt_metric(best, c[f"{best.column}_mean"]),
                f"by the sweep's metric: {best_phrase(best)}",
            )
        )
    lines.append(
        _leader_line(
            report,
            configs,
            "Fastest",
            FACTOR_METRICS[2],
            "time_per_epoch_s",
            lambda c: f"{fmt_num(c['time_per_epoch_s_mean'])} s/epoch",
        )
    )
    if note := shared_gpu_note(report):
        lines.append(note)
    lines.append(
        _leader_line(
            report,
            configs,
            "Most accurate",
            FACTOR_METRICS[0],
            "final_test_acc",
            lambda c: f"{fmt_pct(c['final_test_acc_mean'])} %",
        )
    )
    # Ranked by the total (what running the configuration costs) when every configuration logged one.
    by_total = bool(configs["peak_mem_total_mb_mean"].notna().all())
    memory = FACTOR_METRICS[5] if by_total else FACTOR_METRICS[4]
    lines.append(
        _leader_line(
            report,
            configs,
            "Least memory",
            memory,
            memory.column,
            _memory_text,
            "by the peak total over workers"
            if by_total
            else "by the peak per worker: not every configuration logged a total",
        )
    )
    lines = [line for line in lines if line]
    for key in report.factors:
        lines.extend(effect_lines(report, key))
    lines.extend(interaction_lines(report))
    std, n_configs = report.noise
    if n_configs:
        lines.append(
            f"Seed noise of final test accuracy: {100 * std:.2f} pp over {n_configs} "
            f"configuration{'s' if n_configs != 1 else ''} with ≥ 2 included seeds."
        )
    return lines


def _memory_text(config: pd.Series) -> str:
    """`2,200 MB total over workers, 1,100 MB per worker` for a configuration row; per worker alone without a total."""
    per_worker = f"{fmt_num(config['peak_mem_mb_mean'])} MB per worker"
    total = config["peak_mem_total_mb_mean"]
    return per_worker if is_missing(total) else f"{fmt_num(total)} MB total over workers, {per_worker}"


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


def verdict_text(report: Report, row: pd.Series) -> str:
    """The verdict of an accuracy comparison (verdicts.judge) in words."""
    verdict, depends = row["verdict"], row.get("depends_on") or ""
    if verdict == DEPENDS_VERDICT:
        return f"depends on {depends} (its effect per value: *Interactions*)"
    if verdict == EQUIVALENT:
        text = f"equivalent within ±{fmt_value(round(100 * report.margin, 6))} pp"
    elif verdict == NO_VERDICT:
        text = f"no verdict (fewer than {MIN_PAIRS} pairs)"
    else:
        text = verdict
    return text + (f"; depends on {depends}" if depends else "")


def pairs_text(row: pd.Series) -> str:
    """`2 of 4 pairs (2 lost: lr=0.5 diverged in 2)`."""
    n, planned = int(row["n_pairs"]), int(row["n_planned"])
    lost = f" ({planned - n} lost: {row['lost']})" if planned > n else ""
    return f"{n} of {planned} pair{'s' if planned != 1 else ''}{lost}"


def seeds_text(report: Report, row: pd.Series) -> str:
    """How many more seeds would resolve an open comparison, allowing for the pairs lost so far, with what runs them
    and how long that would take; or that the shared test set keeps it open whatever the seeds; "" for a resolved
    one."""
    if row["verdict"] not in (NO_VERDICT, OPEN):
        return ""
    if row["testset_limited"]:
        return testset_text(report, row)
    if is_missing(row["more_seeds"]):
        why = "one pair gives no spread" if row["n_pairs"] < 2 else f"not within {MAX_PAIRS} pairs"
        return f"; seeds that would resolve it: unknown ({why})"
    more, unfinished = int(row["more_seeds"]), int(row["n_open"])
    ended = int(row["n_planned"]) - unfinished
    losses = (
        f", allowing for the {ended - int(row['n_pairs'])} of {ended} ended pairs lost" if row["survival"] < 1 else ""
    )
    still = f" {unfinished} unfinished pair{'s' if unfinished != 1 else ''} (not counted as done)"
    if more == 0:
        return f"; resuming its{still} would be expected to resolve it at this spread{losses}: {run_more(report, 0)}"
    also = f", besides its{still}" if unfinished else ""
    return (
        f"; about {more} more seed{'s' if more != 1 else ''} per grid point would resolve it at this spread"
        f"{losses}{also}: {run_more(report, more)}"
    )


def run_more(report: Report, more: int) -> str:
    """What runs `more` seeds per grid point (and the run's unfinished trials): the `--resume --repeats N` command
    where the sweep command accepts it, else what to change; with how long it would take, from this run's trials."""
    total = report.seeds + more
    unfinished = int(report.trials["outcome"].isin(UNFINISHED).sum())
    if "seed" in report.grid:  # the sweep refuses repeats beside grid.seed, and a longer grid.seed renumbers trials
        how = (
            f"seed is a grid key, which `--resume --repeats` refuses: list {total} seeds under grid.seed and run it "
            "as a new run (`--name NEW`)"
        )
        trials = total * len(report.configs)
    elif total > REPEATS_MAX:
        return f"{total} seeds per grid point, more than the {REPEATS_MAX} one run takes"
    else:
        command = report.run.sweep.get("command") if not report.comparison else None
        how = f"`{runlog.more_seeds_command(command, total)}`"
        trials = more * len(report.configs) + unfinished
    times = trial_times(report.run)
    if times is None:
        return how + " (how long: unknown, no finished trial recorded its start and end)"
    wall, at_once = times
    return (
        f"{how}, ~{rough_duration(trials * wall / at_once)} ({trials} trials at this run's mean of "
        f"{precise_duration(wall)} per finished trial, {at_once} at once: an estimate from this run's trial times)"
    )


def testset_text(report: Report, row: pd.Series) -> str:
    """Why more seeds cannot settle a comparison that the shared test set's own noise keeps open, and how large a
    test set would let them."""
    images = report.test_images
    on = f" on {images} test images" if images else ""
    text = (
        f"; more seeds cannot settle it: the shared test set's own noise in this difference (sd "
        f"{100 * math.sqrt(row['testset_var']):.2f} pp{on}, the binomial bound) does not shrink with seeds"
    )
    datasets = {config_value(t.config, "dataset") for t in report.run.trials}
    if not images or len(datasets) != 1:
        return text
    full = DATASET_SIZES[datasets.pop()][1]
    needed = None if is_missing(row["testset_growth"]) else math.ceil(images * row["testset_growth"])
    if needed is not None and needed <= full:
        return (
            text + f"; a larger `test_subset` would: from about {needed} test images on (of {full}), with enough seeds"
        )
    return text + f"; even all {full} test images would not at this effect"


def effect_lines(report: Report, key: str) -> list[str]:
    """One line per non-baseline value of `key`: its accuracy effect, the pairs behind it and what removed the
    others, its verdict, and for an open one the seeds that would resolve it."""
    base = fmt_value(report.baseline[key])
    lines = []
    for _, row in report.effects[key][PAIRED_METRICS[0].column].iterrows():
        head = f"**{key}={fmt_value(row[key])}** vs {base}: "
        if row["n_pairs"] == 0:
            partner = pair_partner(report, key, f"trial with {key}={base} and the same other keys and seed")
            lines.append(head + f"no matched pairs (no included {partner}; {pairs_text(row)}).")
            continue
        mean = paired_parts(PAIRED_METRICS[0], row)[0]  # its interval is in the factor's effects table
        lines.append(
            head + f"final test accuracy {mean} pp, {pairs_text(row)}: {verdict_text(report, row)}"
            f"{seeds_text(report, row)}; test-set noise {row['testset_noise']}.{run_level_note(report, key)}"
        )
    return lines


def fmt_p(p: float) -> str:
    """A p-value as the report shows it: three decimals, "< 0.001" below."""
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def interaction_lines(report: Report) -> list[str]:
    """Each interaction found (interactions.py), named with the effect per value of the factor it depends on; then
    one line for those that could not be tested, saying why. Nothing when every tested one is not significant."""
    tests = report.interactions.tests
    strata = report.interactions.strata
    lines = []
    tested = int((tests["result"] != UNTESTABLE).sum())
    for _, test in tests[tests["result"] == DEPENDS].iterrows():
        rows = strata[(strata["factor"] == test["factor"]) & (strata["by"] == test["by"]) & strata["tested"]]
        rows = rows[[same_value(v, test["value"]) for v in rows["value"]]]
        per_value = ", ".join(
            f"{paired_parts(PAIRED_METRICS[0], r)[0]} pp at {stratum_label(test['by'], r['stratum'])} "
            f"({int(r['n_pairs'])} pairs)"
            for _, r in rows.iterrows()
        )
        lines.append(
            f"**{test['factor']}={fmt_value(test['value'])}** vs {fmt_value(test['baseline'])}: its effect on final "
            f"test accuracy depends on {test['by']}: {per_value} (equal per-value effects rejected: "
            f"F({int(test['df1'])}, {int(test['df2'])}) = {fmt_num(test['F'])}, Holm-adjusted p {fmt_p(test['p_holm'])}"
            f" over {tested} interactions tested)."
        )
    untestable = int((tests["result"] == UNTESTABLE).sum())
    if untestable:
        which = "cannot be tested" if untestable == len(tests) else f"{untestable} of {len(tests)} cannot be tested"
        lines.append(
            f"**Interactions**: {which}: no two values of the other factor hold {MIN_STRATUM_PAIRS} or more pairs "
            "each, so a factor's effect cannot be compared across them"
            + (" (one seed per configuration: no replication)" if report.seeds == 1 else "")
            + "."
        )
    return lines
