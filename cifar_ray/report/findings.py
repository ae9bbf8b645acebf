"""The findings, answer first: one line per compared factor value with its time, memory and accuracy effects and
their verdicts in full (answer_lines; report/screen.py has the short ones), then the leaders read off the
configuration tables (best by the sweep's metric, fastest, most accurate, least memory; named only beyond the noise,
each with its configuration's failures said first), the trials that shared a device, the planned trials missing."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from ..core import runlog
from ..core.datasets import DATASET_SIZES
from ..core.sweep import REPEATS_MAX
from ..core.text import precise_duration, rough_duration
from .build import NO_FOLDER, Report
from .compare import RUN_FACTOR
from .effects import DEPENDS, DIFFERS, EQUIVALENT, FAILED, NO_PRACTICAL, NO_VERDICT, OPEN, UNFAIR
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
from .interactions import DEPENDS as INTERACTS
from .interactions import MIN_STRATUM_PAIRS, UNTESTABLE, by_label, stratum_label
from .judge import ci_label, fmt_dof
from .load import config_value
from .metrics import COMPARED, COST_METRICS, FACTOR_METRICS, INCLUDED, PAIRED_METRICS, TIME_TO_TARGET, Compared
from .rankings import BEST, FASTEST, LEAST_MEMORY, MOST_ACCURATE, Leaders
from .sequential import look_text
from .stats import PAIRS_DISAGREE, included
from .verdicts import MAX_PAIRS, MIN_PAIRS, RATIO_BAND


def shared_note(report: Report) -> str:
    """One line naming the included trials that shared a device with another trial (report/sharing.py), whose
    times include their neighbours' contention; "" when none did."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in report.shared.items():
        by_reason.setdefault(reason, []).append(name)
    if not by_reason:
        return ""
    shared = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())
    return f"Time/epoch of trials that shared a device includes their neighbours' contention: {shared}."


def failures_text(config: pd.Series) -> str:
    """`3 of 6 trials diverged, 1 failed` for a configuration row (stats.config_frame: its outcomes, most common
    first) whose trials did not all finish with every epoch logged; "" when all did."""
    outcomes = config["outcomes"]
    counts = [(outcome, n) for outcome, n in outcomes.items() if outcome != INCLUDED]
    if not counts:
        return ""
    (outcome, n), rest = counts[0], counts[1:]
    return f"{n} of {sum(outcomes.values())} trials {outcome}" + "".join(f", {m} {other}" for other, m in rest)


def _name(report: Report, configs: pd.DataFrame, i) -> str:
    return values_label(configs.loc[i], report.factors) or "the only configuration"


def _n_note(configs: pd.DataFrame, i) -> str:
    n = int(configs.loc[i, "n"])
    return f", mean of {n} trials" if n > 1 else ""


# Why no leader is named when no configuration ran twice: said in the first such line, pointed back to after it.
NOISE_UNKNOWN, NOISE_UNKNOWN_AGAIN = "no configuration ran twice, so the seed noise is unknown", "as above"


def _leader_line(
    report: Report, title: str, show: Callable[[pd.Series], str], ranking: Leaders | None, said: list[str]
) -> str:
    """`**Fastest**: X at 4.11 s/epoch, …` where X beats every other configuration by more than the ranking's noise
    (rankings.rank_configs); else the candidates within noise of it, or, with the noise unknown, the range measured. A
    configuration whose trials did not all finish says so first. "" when no configuration logged the measure."""
    if ranking is None or ranking.within == () or not ranking.ranked:
        return ""
    configs, ranked, within, noise = report.configs, ranking.ranked, ranking.within, ranking.noise
    head = f"**{title}**" + (f" ({ranking.basis})" if ranking.basis else "")

    def named(i) -> str:
        failed = failures_text(configs.loc[i])
        return _name(report, configs, i) + (f" (whose trials did not all finish: {failed})" if failed else "")

    if within is not None and len(within) == 1:
        best, last = ranked[0], ranked[-1]
        return (
            f"{head}: {named(best)} at {show(configs.loc[best])}{_n_note(configs, best)}, beyond {noise} of every "
            f"other configuration (the last: {_name(report, configs, last)}, {show(configs.loc[last])})."
        )
    if within is None:
        first, last = ranked[0], ranked[-1]
        reason = NOISE_UNKNOWN_AGAIN if said else NOISE_UNKNOWN
        said.append(title)
        return (
            f"{head}: none named: {reason} (measured: "
            f"{named(first)} {show(configs.loc[first])} to {_name(report, configs, last)} "
            f"{show(configs.loc[last])})."
        )
    listed = ", ".join(
        f"{_name(report, configs, i)} ({failed + '; ' if (failed := failures_text(configs.loc[i])) else ''}"
        f"{show(configs.loc[i])})"
        for i in ranked
        if i in within
    )
    return f"{head}: within {noise} of each other: {listed}."


def fastest_line(report: Report, said: list[str]) -> str:
    """**Fastest** (rankings._rank_fastest), and whether the ranking is fair."""
    ranking = report.leaders.get(FASTEST)
    line = _leader_line(report, "Fastest", lambda c: f"{fmt_num(c['time_per_epoch_s_mean'])} s/epoch", ranking, said)
    if line and report.shared and set(report.shared) != set(included(report.trials)["trial"]):
        line += " Not a fair ranking: it ranks trials that shared a device with trials that ran alone (next line)."
    return line


def findings(report: Report) -> list[str]:
    """What the sweep shows, each once: the answer first (answer_lines: each factor value's time, memory and accuracy
    effects with their verdicts), then the leaders by the sweep's metric, time, accuracy and memory (named only
    beyond the noise, failures first), the trials that shared a device, the planned trials missing, the seed noise."""
    configs = report.configs[report.configs["n"] > 0]
    done = int(len(included(report.trials)))
    if not len(configs):
        nothing = "No trial finished with every epoch logged: there is nothing to compare yet."
        return [line for line in (nothing, missing_line(report)) if line]
    if len(configs) == 1:
        config = configs.loc[configs.index[0]]
        accuracy = fmt_mean_std(FACTOR_METRICS[0], config["final_test_acc_mean"], config["final_test_acc_std"])
        one = (
            f"One configuration that finished: final test accuracy {accuracy} %, "
            f"{fmt_num(config['time_per_epoch_s_mean'])} s/epoch, peak memory {_memory_text(config)} "
            f"({done} included trial{'s' if done != 1 else ''})."
        )
        return [line for line in (*failed_lines(report), one, missing_line(report)) if line]
    lines = [line for key in report.factors for line in answer_lines(report, key)]
    lines.extend(interaction_lines(report))
    best = report.objective
    if report.objective_note:
        lines.append(f"**Best** means the {best_phrase(best)} ({report.objective_note}).")
    said: list[str] = []  # the leader lines that said NOISE_UNKNOWN
    if BEST in report.leaders:  # the default objective's best is the Most accurate line
        show_best = lambda c: fmt_metric(best, c[f"{best.column}_mean"])  # noqa: E731
        lines.append(_leader_line(report, "Best", show_best, report.leaders[BEST], said))
    lines.append(fastest_line(report, said))
    if note := shared_note(report):
        lines.append(note)
    show_acc = lambda c: f"{fmt_pct(c['final_test_acc_mean'])} %"  # noqa: E731
    lines.append(_leader_line(report, "Most accurate", show_acc, report.leaders.get(MOST_ACCURATE), said))
    lines.append(_leader_line(report, "Least memory", _memory_text, report.leaders.get(LEAST_MEMORY), said))
    lines.append(missing_line(report))
    lines = [line for line in lines if line]
    std, n_configs = report.noise
    if n_configs:
        lines.append(
            f"Seed noise of final test accuracy: {100 * std:.2f} pp over {n_configs} "
            f"configuration{'s' if n_configs != 1 else ''} with ≥ 2 included seeds."
        )
    return lines


def missing_line(report: Report) -> str:
    """`**Missing**: 2 of 14 planned trials have no folder in the run ...`, with why for a damaged one; "" for none."""
    if not report.missing:
        return ""
    planned = len(report.run.sweep.get("trials", []))
    if set(report.missing.values()) == {NO_FOLDER}:
        return (
            f"**Missing**: {len(report.missing)} of {planned} planned trials have no folder in the run and enter no "
            f"aggregate: {', '.join(report.missing)}."
        )
    named = "; ".join(f"{name} ({why})" for name, why in report.missing.items())
    return f"**Missing**: {len(report.missing)} trials ({planned} planned) enter no aggregate: {named}."


def failed_line(report: Report, key: str, row: pd.Series) -> str:
    """The answer for a value whose every trial failed (judge.FAILED): `**lr=2** vs 0.1: diverged in 3 of 3: ...`."""
    head = f"**{key}={fmt_value(row[key])}** vs {fmt_value(report.baseline[key])}: "
    return head + f"{row['failed']}: no time, memory or accuracy to compare."


def failed_lines(report: Report) -> list[str]:
    """The answer line of each value whose every trial failed: with one configuration left, the answer to give."""
    return [
        failed_line(report, key, row)
        for key in report.factors
        for _, row in report.effects[key][PAIRED_METRICS[0].column].iterrows()
        if row["verdict"] == FAILED
    ]


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
    """The verdict of an accuracy comparison (report/judge.py) in words."""
    verdict, depends = row["verdict"], ", ".join(row.get("depends_on") or ())
    look = look_text(row)
    if verdict == DEPENDS:
        return f"depends on {depends}{look} (its effect per cell: *Effects per cell*)"
    if verdict == FAILED:
        return f"{row['failed']}: no accuracy to compare"
    if verdict == EQUIVALENT:
        margin = row["look_margin"] if look and not is_missing(row["look_margin"]) else report.margin  # the look's
        text = f"equivalent within ±{fmt_value(round(100 * margin, 6))} pp{look}"
    else:
        note = f": its CI excludes 0, but {row['vci_note']}" if row.get("vci_note") else ""
        if verdict == NO_VERDICT:
            text = f"no verdict (fewer than {MIN_PAIRS} pairs{note}){look}"
        else:
            words = "CI excludes 0" if verdict == DIFFERS else verdict
            text = f"{words}{look} ({note[2:]})" if note else words + look
    return text + (f"; its size depends on {depends}" if depends else "")


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
    if is_missing(row["more_seeds"]) and row.get("vci_note"):  # open at its look, settled by its later pairs
        return ""
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
        trials = more * len(report.configs) + report.unfinished
    if report.trial_times is None:
        return how + " (how long: unknown, no finished trial recorded its start and end)"
    wall, at_once = report.trial_times
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
        f"{100 * math.sqrt(row['testset_var']):.2f} pp{on}) does not shrink with seeds"
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


def _times(x: float) -> str:
    return f"{x:.2f}x"


def ratio_text(row: pd.Series, what: str, words: tuple[str, str], unit: str) -> str:
    """A judged ratio effect (verdicts.judge_ratios) in words: `time per epoch 1.54x faster (5.01 → 3.26 s,
    geometric means over 2 pairs; 95 % CI 1.46x-1.62x, within-trial epoch noise only): faster`. `words`: the
    verdict for a ratio below and above 1."""
    if row["n_pairs"] == 0:
        return f"{what}: no matched pairs"
    ratio, lower = row["ratio"], row["ratio"] < 1
    size = 1 / ratio if lower else ratio  # said as "x faster" / "x slower", its interval on the same scale
    magnitude = _times(size) + ("" if _times(size) == _times(1) else f" {words[0] if lower else words[1]}")
    pairs = f"{int(row['n_pairs'])} pair{'s' if row['n_pairs'] != 1 else ''}"
    like = max(row["base_geomean"], row["value_geomean"])
    measured = (
        f"{fmt_num(row['base_geomean'], like)} → {fmt_num(row['value_geomean'], like)} {unit}, geometric means over "
        f"{pairs}"
    )
    if not is_missing(row["vci_level"]):
        low, high = (1 / row["vci_high"], 1 / row["vci_low"]) if lower else (row["vci_low"], row["vci_high"])
        measured += f"; {ci_label(row)}: {_times(low)}–{_times(high)}, {row['basis']}"
    verdict = row["verdict"]
    if verdict == DIFFERS:
        judged = words[0] if lower else words[1]
    elif verdict == NO_PRACTICAL:
        judged = f"no practical difference: within {RATIO_BAND}, though its CI excludes 1"
    elif verdict == EQUIVALENT:
        judged = f"no difference within {RATIO_BAND}"
    elif verdict == DEPENDS:
        judged = f"depends on {', '.join(row['depends_on'])} (its effect per cell: *Effects per cell*)"
    elif verdict == UNFAIR:
        unfair = len(row["unfair"])
        judged = (
            f"not judged, unfair: {unfair} of the {pairs} set a trial that shared a device against one that ran "
            "alone (the trials that shared are named below)"
        )
    elif row["basis"] == PAIRS_DISAGREE:
        per_pair = ", ".join(_times(r) for r in row["pair_ratios"])
        judged = f"{verdict}: {row['basis']} (value / baseline per pair: {per_pair})"
    elif verdict == NO_VERDICT:
        judged = (
            f"no verdict (its noise has fewer than {MIN_PAIRS - 1} degrees of freedom)"
            if row["basis"]
            else f"no verdict (one number per trial: needs pairs over several seeds, or {MIN_PAIRS} pairs)"
        )
    else:
        judged = verdict
    if verdict == DIFFERS and row.get("depends_on"):
        judged += f"; its size depends on {', '.join(row['depends_on'])}"
    if row.get("vci_note"):
        judged += f" (its CI excludes no change, but {row['vci_note']})"
    return f"{what} {magnitude} ({measured}): {judged}"


def answer_lines(report: Report, key: str) -> list[str]:
    """The answer to the sweep's question for `key`: one line per non-baseline value, its time per epoch, peak memory
    and final test accuracy against the baseline, each with its verdict; the accuracy with the pairs behind it, what
    removed the others and, for an open one, the seeds that would resolve it."""
    base = fmt_value(report.baseline[key])
    figure = "total over workers" if report.memory_column == COST_METRICS[2].column else "per worker"
    lines = []
    rows = zip(
        report.effects[key][PAIRED_METRICS[0].column].iterrows(),
        report.effects[key][COST_METRICS[0].column].iterrows(),
        report.effects[key][report.memory_column].iterrows(),
    )
    reaching = report.effects[key].get(TIME_TO_TARGET.column)  # with a target only
    for i, ((_, row), (_, time), (_, memory)) in enumerate(rows):
        head = f"**{key}={fmt_value(row[key])}** vs {base}: "
        if row["verdict"] == FAILED:
            lines.append(failed_line(report, key, row))
            continue
        if row["n_pairs"] == 0:
            partner = pair_partner(report, key, f"trial with {key}={base} and the same other keys and seed")
            lines.append(head + f"no matched pairs (no included {partner}; {pairs_text(row)}).")
            continue
        mean = paired_parts(PAIRED_METRICS[0], row)[0]  # its interval is in the factor's effects table
        target = ""
        if reaching is not None:  # censored trials counted: "did not reach 85 % in 1 of 3"
            reach = reaching.iloc[i]
            what = f"time to {fmt_value(round(100 * report.target, 6))} %"
            target = ratio_text(reach, what, ("sooner", "later"), "s") + (
                f" ({reach['lost']})" if reach["lost"] else ""
            )
            target += "; "
        lines.append(
            head
            + target
            + ratio_text(time, "time per epoch", ("faster", "slower"), "s")
            + "; "
            + ratio_text(memory, f"peak memory ({figure})", ("less", "more"), "MB")
            + f"; final test accuracy {mean} pp, {pairs_text(row)}: {verdict_text(report, row)}"
            f"{seeds_text(report, row)}; test-set noise {row['testset_noise']}.{run_level_note(report, key)}"
        )
    return lines


def fmt_p(p: float) -> str:
    """A p-value as the report shows it: three decimals, "< 0.001" below."""
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def effect_text(metric: Compared, estimate: float) -> str:
    """An effect's estimate as a finding writes it: `+2.0 pp`, `0.71x`."""
    return f"{estimate:+.2f} pp" if metric.unit == "pp" else _times(estimate)


def interaction_lines(report: Report) -> list[str]:
    """Each interaction found (interactions.py), on each metric, named with the effect per stratum of the factors it
    depends on (a split by several factors' cells only where no one factor's split shows it); then one line for
    those that could not be tested, saying why. Nothing when every tested one is not significant."""
    tests = report.interactions.tests
    strata = report.interactions.strata
    lines = []
    for metric in COMPARED:
        of = tests[tests["metric"] == metric.name]
        tested = int((of["result"] != UNTESTABLE).sum())
        found = of[of["result"] == INTERACTS]
        for _, test in found.iterrows():
            same = [
                len(row["by"]) == 1
                for _, row in found.iterrows()
                if row["factor"] == test["factor"] and same_value(row["value"], test["value"])
            ]
            if len(test["by"]) > 1 and any(same):
                continue  # one factor's split already shows it
            rows = [
                r
                for _, r in strata.iterrows()
                if r["metric"] == metric.name
                and r["factor"] == test["factor"]
                and r["by"] == test["by"]
                and r["tested"]
                and same_value(r["value"], test["value"])
            ]
            per_value = ", ".join(
                f"{effect_text(metric, r['estimate'])} at {stratum_label(r['stratum'])} ({int(r['n_pairs'])} "
                f"pair{'s' * (int(r['n_pairs']) != 1)})"
                for r in rows
            )
            lines.append(
                f"**{test['factor']}={fmt_value(test['value'])}** vs {fmt_value(test['baseline'])}: its effect on "
                f"{metric.label} depends on {by_label(test['by'])}: {per_value} (equal per-stratum effects rejected: "
                f"F({fmt_dof(test['df1'])}, {fmt_dof(test['df2'])}) = {fmt_num(test['F'])}, Holm-adjusted p "
                f"{fmt_p(test['p_holm'])} over {tested} interactions of {metric.label} tested)."
            )
    accuracy = tests[tests["metric"] == COMPARED[0].name]
    untestable = int((accuracy["result"] == UNTESTABLE).sum())
    if untestable:
        which = (
            "cannot be tested" if untestable == len(accuracy) else f"{untestable} of {len(accuracy)} cannot be tested"
        )
        lines.append(
            f"**Interactions** of {COMPARED[0].label}: {which}: no two strata of the other factors hold "
            f"{MIN_STRATUM_PAIRS} or more pairs each, so a factor's effect cannot be compared across them"
            + (" (one seed per configuration: no replication)" if report.seeds == 1 else "")
            + "."
        )
    return lines
