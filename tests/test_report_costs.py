"""Time and memory verdicts (issue 35, items 1, 4, 5, 7, 8), on run folders written by hand with a known truth:
per-epoch times as repeated measurements (the first epoch dropped), ratios of geometric means with the noise the data
have (between pairs over several seeds, else within-trial epochs, labelled), a comparison of a shared with an
exclusive trial flagged, memory that needs pairs, leaders that carry their failures, the interval a verdict used, the
answer first, and one time-per-epoch statistic for the report and the terminal."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from helpers import cost_run, report_text, trial_name

from cifar_ray.commands.common import SUMMARY_COLUMNS, answer_lines, trial_result
from cifar_ray.core import runlog
from cifar_ray.core.runlog import TrialLog
from cifar_ray.report import build_report
from cifar_ray.report.findings import findings
from cifar_ray.report.judge import verdict_intervals
from cifar_ray.report.screen import answer_text
from cifar_ray.report.sharing import shared_trials
from cifar_ray.report.stats import BETWEEN, WITHIN
from cifar_ray.report.verdicts import holm_multipliers

# Student-t quantiles from a printed table (the reference for stats.t_quantile's use here).
T975 = {2: 4.302653, 3: 3.182446, 6: 2.446912}
T95 = {3: 2.353363}


def findings_text(run_dir: Path) -> str:
    return report_text(build_report(run_dir)).split("## Findings")[1].split("\n## ")[0]


ONE_SEED = {1: [30.0, 10.0, 10.4, 9.6, 10.0], 2: [20.0, 6.5, 6.3, 6.7, 6.5]}


def test_one_seed_time_ratio_reads_the_warm_epochs_with_their_own_noise(tmp_path):
    """One seed, workers 1 vs 2, five epochs each; the first (30 s, 20 s) is warm-up. Truth: the geometric means of
    the warm epochs, 9.995 s and 6.499 s, a ratio of 0.650 (1.54x faster); its noise is the epochs' spread about
    each trial's mean (6 degrees of freedom), labelled as within-trial only; 95 % CI well below 1: faster."""
    trials = [{"swept": {"workers": w, "seed": 0}, "times": ONE_SEED[w]} for w in (1, 2)]
    run_dir = cost_run(tmp_path / "run", trials, {"workers": [1, 2]})
    report = build_report(run_dir)
    row = report.effects["workers"]["time_per_epoch_s"].iloc[0]
    logs = {w: [math.log(t) for t in ONE_SEED[w][1:]] for w in (1, 2)}
    d = statistics.fmean(logs[2]) - statistics.fmean(logs[1])
    ss = sum((x - statistics.fmean(v)) ** 2 for v in logs.values() for x in v)
    se = math.sqrt(ss / 6 * (1 / 4 + 1 / 4))
    assert row["ratio"] == pytest.approx(math.exp(d)) and row["ratio"] == pytest.approx(0.6502, abs=1e-3)
    assert row["basis"] == WITHIN and row["df"] == 6 and row["se"] == pytest.approx(se)
    assert (row["vci_low"], row["vci_high"]) == pytest.approx((math.exp(d - T975[6] * se), math.exp(d + T975[6] * se)))
    assert row["verdict"] == "differs"
    line = findings(report)[0]  # the answer first
    assert line.startswith("**workers=2** vs 1: time per epoch 1.54x faster (10.00 → 6.50 s, geometric means over")
    assert "within-trial epoch noise only): faster;" in line
    fastest = next(f for f in findings(report) if f.startswith("**Fastest**"))
    assert "noise: within-trial epoch noise only): workers=2 at 6.50 s/epoch, beyond the epoch-to-epoch" in fastest


def test_several_seeds_time_ratio_uses_the_between_pair_spread(tmp_path):
    """Three seeds; every epoch of a trial takes the same time (no within-trial noise), but the seeds' ratios
    differ: 0.60, 0.66, 0.63. Truth: the ratio is their geometric mean and its interval the t interval (2 df) of
    the log ratios' spread: between pairs, never the zero-width within-trial one."""
    ratios = {0: 0.60, 1: 0.66, 2: 0.63}
    trials = [
        {"swept": {"workers": w, "seed": s}, "times": [9.0] + [10.0 * (1 + 0.1 * s) * (ratios[s] if w == 2 else 1)] * 3}
        for s in ratios
        for w in (1, 2)
    ]
    row = build_report(cost_run(tmp_path / "run", trials, {"workers": [1, 2]})).effects["workers"]["time_per_epoch_s"]
    row = row.iloc[0]
    logs = [math.log(r) for r in ratios.values()]
    se = statistics.stdev(logs) / math.sqrt(3)
    assert row["basis"] == BETWEEN and row["df"] == 2 and row["se"] == pytest.approx(se)
    assert row["ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert row["vci_high"] == pytest.approx(math.exp(statistics.fmean(logs) + T975[2] * se))
    assert row["verdict"] == "differs"


def test_equal_times_are_no_difference_within_the_margin_with_a_labelled_90_percent_interval(tmp_path):
    """Four seeds, workers=2 within ±1 % of workers=1: no difference within ±5 %, by two one-sided tests whose
    interval is the 90 % one, labelled as such in the table."""
    wobble = {0: 1.01, 1: 0.99, 2: 1.005, 3: 0.995}
    trials = [
        {"swept": {"workers": w, "seed": s}, "times": [20.0] + [10.0 * (wobble[s] if w == 2 else 1)] * 3}
        for s in wobble
        for w in (1, 2)
    ]
    run_dir = cost_run(tmp_path / "run", trials, {"workers": [1, 2]})
    report = build_report(run_dir)
    row = report.effects["workers"]["time_per_epoch_s"].iloc[0]
    logs = [math.log(r) for r in wobble.values()]
    se = statistics.stdev(logs) / 2
    assert row["verdict"] == "equivalent" and row["vci_level"] == pytest.approx(0.90) and row["vci_tost"]
    assert row["vci_high"] == pytest.approx(math.exp(statistics.fmean(logs) + T95[3] * se))
    text = report_text(report)
    assert "(90 % CI, equivalence (TOST)) | within ±5 % |" in text
    assert "time per epoch 1.00x" in findings_text(run_dir)


def concurrent(start: float, end: float, slot: str) -> dict:
    return {"started_unix": start, "finished_unix": end, "slot": slot, "system": {"nodes": ["node-a"]}}


def test_a_shared_trial_against_an_exclusive_one_is_flagged_not_judged(tmp_path):
    """workers=1 trials ran two at a time on one node (their spans overlap, in two slots); workers=2 trials ran
    alone, one after the other. Truth: the time ratio is measured (1.54x) but not judged (unfair), the trials that
    shared are named, the Fastest ranking says it is not fair; memory (a trial's own peak) is not affected."""
    grid = {"workers": [1, 2], "optimizer": ["momentum", "adam"]}
    trials = [
        {
            "swept": {"workers": 1, "optimizer": "momentum", "seed": 0},
            "times": ONE_SEED[1],
            "meta": concurrent(0, 50, "a"),
        },
        {"swept": {"workers": 1, "optimizer": "adam", "seed": 0}, "times": ONE_SEED[1], "meta": concurrent(1, 51, "b")},
        {
            "swept": {"workers": 2, "optimizer": "momentum", "seed": 0},
            "times": ONE_SEED[2],
            "meta": concurrent(60, 90, "c"),
        },
        {
            "swept": {"workers": 2, "optimizer": "adam", "seed": 0},
            "times": ONE_SEED[2],
            "meta": concurrent(91, 120, "c"),
        },
    ]
    run_dir = cost_run(tmp_path / "run", trials, grid)
    report = build_report(run_dir)
    assert set(report.shared) == {trial_name(0), trial_name(1)}
    time = report.effects["workers"]["time_per_epoch_s"].iloc[0]
    assert time["verdict"] == "unfair" and len(time["unfair"]) == 2
    assert report.effects["optimizer"]["time_per_epoch_s"].iloc[0]["verdict"] != "unfair"  # shared vs shared
    assert report.effects["workers"][report.memory_column].iloc[0]["verdict"] != "unfair"
    text = findings_text(run_dir)
    assert "time per epoch 1.54x faster" in text and "not judged, unfair: 2 of the 2 pairs" in text
    assert "Not a fair ranking" in text and f"{trial_name(0)} (beside {trial_name(1)} on one node's CPUs)" in text


def test_cpu_trials_share_a_node_only_when_their_spans_overlap_in_different_slots():
    def cpu(name: str, start: float, end: float, slot: str, node: str = "n1") -> TrialLog:
        meta = {"system": {"device_type": "cpu", "nodes": [node]}, "started_unix": start, "finished_unix": end}
        return TrialLog.of(name, meta | {"slot": slot})

    trials = [
        cpu("t0", 0, 10, "s1"),
        cpu("t1", 5, 15, "s2"),  # beside t0
        cpu("t2", 10.5, 20, "s1"),  # after t0 in its slot, beside t1
        cpu("t3", 0, 30, "s3", node="n2"),  # another node
    ]
    assert shared_trials(trials) == {
        "t0": "beside t1 on one node's CPUs",
        "t1": "beside t0, t2 on one node's CPUs",
        "t2": "beside t1 on one node's CPUs",
    }


def test_memory_is_one_number_per_trial_and_needs_pairs_over_seeds(tmp_path):
    """Memory (total over workers) of workers=2 is 1.8x workers=1's. With one seed: one pair, no noise, no verdict,
    said so. With three seeds (±1 % per trial): between pairs, "more"."""
    one = [
        {"swept": {"workers": w, "seed": 0}, "times": [5.0] * 3, "memory": 1000.0 * (1.8 if w == 2 else 1)}
        for w in (1, 2)
    ]
    row = build_report(cost_run(tmp_path / "one", one, {"workers": [1, 2]})).effects["workers"]["peak_mem_total_mb"]
    assert row.iloc[0]["verdict"] == "no verdict" and math.isnan(row.iloc[0]["se"])
    text = findings_text(tmp_path / "one")
    assert "peak memory (total over workers) 1.80x more (1,000 → 1,800 MB" in text
    assert "no verdict (one number per trial: needs pairs over several seeds, or 3 pairs)" in text
    three = [
        {
            "swept": {"workers": w, "seed": s},
            "times": [5.0] * 3,
            "memory": 1000.0 * (1.8 if w == 2 else 1) * (1 + 0.01 * s),
        }
        for s in (0, 1, 2)
        for w in (1, 2)
    ]
    three[5]["memory"] *= 1.02  # some spread between the pairs
    row = build_report(cost_run(tmp_path / "three", three, {"workers": [1, 2]})).effects["workers"]["peak_mem_total_mb"]
    assert row.iloc[0]["verdict"] == "differs" and row.iloc[0]["basis"] == BETWEEN


def test_leaders_say_their_failures_first_and_missing_trials_are_counted(tmp_path):
    """lr=0.8 is the most accurate of the trials that finished, but 3 of its 6 diverged; two planned trials never
    got a folder. Truth: Most accurate names lr=0.8 with "3 of 6 trials diverged" before its accuracy, and the two
    missing trials are counted against the 14 planned and named."""
    trials = [
        {
            "swept": {"lr": lr, "workers": 1, "seed": s},
            "times": [5.0] * 3,
            "acc": (0.85 if lr == 0.8 else 0.70) + 0.001 * s,
        }
        | ({"status": "diverged"} if lr == 0.8 and s >= 3 else {})
        for lr in (0.1, 0.8)
        for s in range(6)
    ]
    run_dir = cost_run(tmp_path / "run", trials, {"lr": [0.1, 0.8]}, extra_planned=2)
    lines = findings(build_report(run_dir))
    accurate = next(line for line in lines if line.startswith("**Most accurate**"))
    assert accurate.startswith(
        "**Most accurate**: lr=0.8 (whose trials did not all finish: 3 of 6 trials diverged) at "
    )
    missing = next(line for line in lines if line.startswith("**Missing**"))
    assert missing == (
        f"**Missing**: 2 of 14 planned trials have no folder in the run and enter no aggregate: {trial_name(12)}, "
        f"{trial_name(13)}."
    )


def test_holm_multipliers_rank_the_p_values():
    assert holm_multipliers([0.01, 0.04, 0.03]) == [3, 1, 2]


def test_the_interval_shown_is_the_one_the_verdict_used():
    """Two comparisons in one family: the smaller p is tested at α/2, so its interval is the 97.5 % one (marked
    Holm); an equivalence shows its 90 % interval; outside the family (no p) the plain 95 %. A 95 % interval that
    excludes 0 beside "not conclusive" is explained: Holm's step-down stopped earlier."""
    frame = pd.DataFrame(
        {
            "n_pairs": [4, 4, 4, 2],
            "mean_diff": [0.05, 0.001, 0.03, 0.05],
            "se": [0.005, 0.002, 0.011, 0.01],
            "p_differs": [0.002, 0.7, 0.072, math.nan],
            "p_equivalent": [0.9, 0.001, 0.5, math.nan],
            "verdict": ["differs", "equivalent", "not conclusive", "no verdict"],
        }
    )
    verdict_intervals([frame], "mean_diff")
    level = frame["vci_level"].tolist()
    assert level == pytest.approx([1 - 0.05 / 3, 1 - 2 * 0.05 / 3, 1 - 0.05 / 2, 0.95])
    assert frame["vci_holm"].tolist() == [True, True, True, False] and frame["vci_tost"].tolist()[1]
    assert frame.loc[3, "vci_low"] == pytest.approx(0.05 - 12.706205 * 0.01)  # t 0.975 with 1 df
    assert frame.loc[3, "vci_note"] == ""  # its 95 % interval includes 0
    # Holm stops at p = 0.03 (tested at 0.025): p = 0.04 is then open, though its own 95 % interval excludes 0.
    stopped = pd.DataFrame(
        {
            "n_pairs": [4, 4],
            "mean_diff": [0.04, 0.036],
            "se": [0.01, 0.01],
            "p_differs": [0.03, 0.04],
            "p_equivalent": [0.9, 0.9],
            "verdict": ["not conclusive", "not conclusive"],
        }
    )
    verdict_intervals([stopped], "mean_diff")
    assert stopped.loc[1, "vci_level"] == 0.95 and stopped.loc[1, "vci_low"] == pytest.approx(0.036 - T975[3] * 0.01)
    assert stopped["vci_note"].tolist() == ["", "Holm's step-down stopped at a smaller p before this one"]


def test_terminal_summary_and_report_share_the_time_per_epoch(tmp_path):
    """Epoch times 30, 10, 12, 11: both the terminal's summary row and the report's trial table read 11 s (the
    median after the warm-up epoch), and the summary's last lines are the report's answer."""
    trials = [{"swept": {"workers": w, "seed": 0}, "times": [30.0, 10.0 * w, 12.0 * w, 11.0 * w]} for w in (1, 2)]
    run_dir = cost_run(tmp_path / "run", trials, {"workers": [1, 2]})
    run = runlog.load_run(run_dir)
    report = build_report(run_dir)
    assert "time_per_epoch_s" in SUMMARY_COLUMNS and "epoch_time_s" not in SUMMARY_COLUMNS
    assert [trial_result(t)["time_per_epoch_s"] for t in run.trials] == [11.0, 22.0]
    assert report.trials["time_per_epoch_s"].tolist() == [11.0, 22.0]
    answer = answer_lines(report)
    answers = answer[answer.index("answer:") + 1 :]
    assert answer[0] == "configurations:" and answers == [f"  {line}" for line in answer_text(report)]
    assert answers[0].startswith("  workers=2 vs 1: 2.00x slower per epoch")


@pytest.mark.parametrize(
    "times, expected", [([9.0, 2.0, 2.2, 1.9], 2.0), ([9.0], 9.0), ([9.0, None, 3.0], 3.0), ([4.0, 1.0, 3.0], 2.0)]
)
def test_time_per_epoch_is_the_median_after_the_first_epoch(times, expected):
    assert runlog.time_per_epoch(times) == expected


def test_time_per_epoch_without_times_is_nan():
    assert math.isnan(runlog.time_per_epoch([]))


def test_one_seeds_pairs_that_disagree_in_direction_are_not_conclusive(tmp_path):
    """One seed, optimizer adam vs momentum at workers 1 and 2, each trial's warm epochs tight (±0.05 s). Truth: adam
    is 1.03x slower at workers=1 (5.0 -> 5.15 s) and 1.19x faster at workers=2 (4.25 -> 3.57 s): the pairs disagree,
    so how much two trials of one configuration differ is far beyond the within-trial epoch noise, which alone would
    call the 1.07x mean ratio "faster". The verdict is not conclusive and names both pairs' ratios."""
    times = {("momentum", 1): 5.0, ("adam", 1): 5.15, ("momentum", 2): 4.25, ("adam", 2): 3.57}
    trials = [
        {"swept": {"optimizer": o, "workers": w, "seed": 0}, "times": [9.0, t - 0.05, t + 0.05, t]}
        for (o, w), t in times.items()
    ]
    run_dir = cost_run(tmp_path / "run", trials, {"optimizer": ["momentum", "adam"], "workers": [1, 2]})
    row = build_report(run_dir).effects["optimizer"]["time_per_epoch_s"].iloc[0]
    assert row["n_pairs"] == 2 and row["ratio"] < 1 and row["verdict"] == "not conclusive"
    line = next(x for x in findings_text(run_dir).splitlines() if x.startswith("- **optimizer="))
    assert (
        "not conclusive: its pairs disagree in direction" in line
        and "(value / baseline per pair: 1.03x, 0.84x)" in line
    )
    workers = build_report(run_dir).effects["workers"]["time_per_epoch_s"].iloc[0]
    assert workers["basis"] == WITHIN and workers["verdict"] == "differs"  # both pairs faster: within-trial stands
    # Fastest does not settle what the optimizer's comparison leaves open: both workers=2 trials, neither alone.
    fastest = next(x for x in findings(build_report(run_dir)) if x.startswith("**Fastest**"))
    assert (
        "within the epoch-to-epoch noise (and the trial-to-trial noise optimizer's disagreeing pairs show)" in fastest
    )
    assert "optimizer=adam, workers=2 (3.57 s/epoch), optimizer=momentum, workers=2 (4.25 s/epoch)." in fastest
