"""The report's statistics on hand-made factorial runs: paired effects, their t intervals, seed noise, and "best"
by the sweep's metric/mode. Run folders are written as training writes them (tests/helpers.py)."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from pathlib import Path

import numpy
import pandas as pd
import pytest
from helpers import FACTORIAL_GRID, FACTORIAL_SEEDS, make_factorial, ranked_correct, report_text
from hypothesis import given, settings
from hypothesis import strategies as st

from cifar_ray.core.runlog import OBJECTIVES as SWEEP_OBJECTIVES
from cifar_ray.report import OBJECTIVES, build_report, seed_noise, t_quantile, write_report


@pytest.fixture(scope="module")
def factorial(tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("runs") / "factorial"
    return run_dir, make_factorial(run_dir)


def finding(text: str, key: str) -> str:
    findings = text.split("## Findings")[1].split("\n## ")[0]
    return next(line for line in findings.splitlines() if line.startswith(f"- **{key}"))


@pytest.mark.parametrize(
    "df, expected",
    [
        (1, 12.706),
        (2, 4.303),
        (3, 3.182),
        (4, 2.776),
        (5, 2.571),
        (10, 2.228),
        (11, 2.201),
        (20, 2.086),
        (30, 2.042),
        (60, 2.000),
        (120, 1.980),
    ],
)
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_other_levels_and_limits():
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-4)
    assert t_quantile(0.995, 10) == pytest.approx(3.169, abs=5e-4)
    assert t_quantile(0.975, 20000) == pytest.approx(1.95996, abs=2e-4)  # tends to the normal quantile
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-12)
    for p, df in ((1.0, 3), (0.4, 3), (0.975, 0)):
        with pytest.raises(ValueError):
            t_quantile(p, df)


@settings(max_examples=50, deadline=None)
@given(st.floats(min_value=0.5, max_value=0.9999))
def test_t_quantile_matches_closed_forms(p):
    a = 2 * p - 1
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9, abs=1e-9)  # Cauchy
    assert t_quantile(p, 2) == pytest.approx(a * math.sqrt(2 / (1 - a * a)), rel=1e-9, abs=1e-9)


def test_paired_effects_are_the_matched_differences(factorial):
    run_dir, finals = factorial
    report = build_report(run_dir)
    trials = report.trials.assign(final=[finals[i] for i in range(len(finals))])
    index = trials.set_index(["optimizer", "amp", "seed", "workers"])["final"]
    diffs = [
        index[(o, a, s, 2)] - index[(o, a, s, 1)]
        for o, a, s in itertools.product(FACTORIAL_GRID["optimizer"], FACTORIAL_GRID["amp"], FACTORIAL_SEEDS)
    ]
    row = report.effects["workers"]["final_test_acc"].iloc[0]
    assert row["workers"] == 2 and row["n_pairs"] == 12
    assert row["mean_diff"] == pytest.approx(statistics.mean(diffs))
    assert row["std_diff"] == pytest.approx(statistics.stdev(diffs))
    # The shared test set's part (10000 test images, logged per image): the variance over images of the per-image
    # difference averaged over the pairs, over the images; it does not shrink with the pairs.
    pairs = [
        (finals[i], finals[j])
        for i, a in enumerate(report.trials.itertuples())
        for j, b in enumerate(report.trials.itertuples())
        if a.workers == 2 and b.workers == 1 and (a.optimizer, a.amp, a.seed) == (b.optimizer, b.amp, b.seed)
    ]
    per_image = numpy.mean([ranked_correct(p, 10_000) * 1.0 - ranked_correct(q, 10_000) for p, q in pairs], axis=0)
    testset = per_image.var(ddof=1) / 10_000
    half = 2.201 * math.sqrt(statistics.variance(diffs) / 12 + testset)  # t(0.975, 11)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(
        (row["mean_diff"] - half, row["mean_diff"] + half), abs=1e-5
    )
    assert row["testset_var"] == pytest.approx(testset) and row["testset_noise"] == "measured per image"
    assert row["mean_diff"] == pytest.approx(0.01, abs=0.002) and row["ci_high"] - row["ci_low"] < 0.01
    assert row["verdict"] == "differs" and row["n_planned"] == 12 and row["lost"] == ""
    assert report.effects["optimizer"]["final_test_acc"].iloc[0]["mean_diff"] == pytest.approx(0.10, abs=0.002)
    amp = report.effects["amp"]["final_test_acc"].iloc[0]
    assert amp["n_pairs"] == 12 and amp["ci_low"] < 0 < amp["ci_high"] and amp["verdict"] == "equivalent"
    time = report.effects["workers"]["time_per_epoch_s"].iloc[0]  # a ratio: 5 s of 10 s per epoch
    assert time["ratio"] == pytest.approx(0.5, abs=0.001) and time["vci_high"] < 1 and time["verdict"] == "differs"
    # The pooled per-value means are still there, with the optimizer's 10 pp inside workers' spread.
    assert report.groups["workers"]["final_test_acc_std"].min() > 0.04


def test_seed_noise_is_the_pooled_within_configuration_std(factorial):
    run_dir, finals = factorial
    report = build_report(run_dir)
    by_config: dict[tuple, list[float]] = {}
    for i, (_, row) in enumerate(report.trials.iterrows()):
        by_config.setdefault((row["optimizer"], row["workers"], row["amp"]), []).append(finals[i])
    pooled = math.sqrt(statistics.mean(statistics.variance(v) for v in by_config.values()))  # equal n: plain mean
    std, configs = seed_noise(report.trials, report.factors, "final_test_acc")
    assert configs == 8 and std == pytest.approx(pooled)
    assert 0.001 < std < 0.0035  # the 0.2 pp that was put in


def test_paired_findings_separate_a_small_real_effect_from_none(factorial, tmp_path):
    """The pooled per-value means put the optimizer's 10 pp into workers' ± (about 5 pp) and called +1 pp not
    conclusive; matched pairs see the +1 pp with a 0.2 pp wide interval."""
    text = report_text(build_report(factorial[0]))
    workers = finding(text, "workers=2")
    found = re.search(
        r"workers=2\*\* vs 1: time per epoch 2.00x faster .*; final test accuracy \+(\d\.\d\d) pp, 12 of 12 pairs: "
        r"CI excludes 0; test-set noise measured per image\.$",
        workers,
    )
    mean = float(found.group(1))
    section = text.split("## Effect of `workers`")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| workers=2 |"))
    low, high = map(float, re.search(r"\[\+(\d\.\d\d), \+(\d\.\d\d)\]", row).groups())
    assert 0.7 < mean < 1.3 and low < mean < high and high - low < 1.0
    assert finding(text, "amp=bf16").endswith(
        "12 of 12 pairs: equivalent within ±1 pp; test-set noise measured per image."
    )
    assert finding(text, "optimizer=adam").endswith("12 of 12 pairs: CI excludes 0; test-set noise measured per image.")
    assert "Seed noise of final test accuracy: 0." in text and "over 8 configurations with ≥ 2 included seeds" in text

    # The interval its verdict used: Holm tests the second smallest of the 3 accuracy p-values at 0.05 / 2.
    assert row.startswith(f"| workers=2 | 12 of 12 | +{mean:.2f} [+{low:.2f}, +{high:.2f}] (97.5 % CI, Holm) |")
    assert "| CI excludes 0 | 0.50x [0.50, 0.50] (98.3 % CI, Holm) | faster |" in row
    assert "Per-value means:" in section
    how = text.split("## How to read this report")[1]
    assert "Holm's correction across this report's accuracy comparisons (3 with 3 pairs or more)" in how


def test_no_matched_pairs_is_said(tmp_path):
    """workers=1 only finished with momentum, workers=2 only with adam: nothing to pair, nothing claimed."""
    run_dir = tmp_path / "unpaired"
    grid = {"optimizer": ["momentum", "adam"], "workers": [1, 2]}
    make_factorial(
        run_dir,
        grid,
        status=lambda s: "finished" if (s["workers"] == 1) == (s["optimizer"] == "momentum") else "failed",
    )
    report = build_report(run_dir)
    assert report.effects["workers"]["final_test_acc"]["n_pairs"].tolist() == [0]
    text = report_text(report)
    assert "**workers=2** vs 1: no matched pairs (no included trial with workers=1" in finding(text, "workers")
    section = text.split("## Effect of `workers`")[1].split("\n## ")[0]
    assert "| workers=2 | 0 of 6 | — | no pairs | — | no pairs | — | no pairs |" in section


def test_exports_carry_the_paired_effects(factorial, tmp_path):
    run_dir = factorial[0]
    effects = pd.read_csv(write_report(run_dir, tmp_path, fmt="csv").parent / "effect_workers.csv")
    accuracy = ["n_pairs", "n_planned", "n_open", "lost", "mean_diff", "std_diff", "testset_var", "testset_noise"]
    accuracy += ["se", "ci_low", "ci_high", "p_differs", "p_equivalent", "p_differs_holm", "p_equivalent_holm"]
    accuracy += ["pairs_needed", "more_seeds", "survival", "testset_limited", "testset_growth", "verdict", "failed"]
    accuracy += ["depends_on"]
    verdict = ["vci_level", "vci_low", "vci_high", "vci_tost", "vci_holm", "vci_note"]
    ratio = ["base_geomean", "value_geomean", "log_ratio", "ratio", "df", "basis", "unfair", "pair_ratios"]
    assert effects.columns.tolist() == ["metric", "workers", *accuracy, *verdict, *ratio]
    # accuracy as a difference; time per epoch and memory (per worker: no trial logged a total) as ratios
    assert effects["metric"].tolist() == ["final_test_acc", "time_per_epoch_s", "peak_mem_mb"]
    assert effects["n_pairs"].tolist() == [12, 12, 12] and effects["verdict"].tolist() == [
        "differs",
        "differs",
        "equivalent",
    ]
    data = json.loads(write_report(run_dir, tmp_path, fmt="json").read_text(encoding="utf-8"))
    paired = data["factors"]["amp"]["paired"]["final_test_acc"]
    assert paired[0]["amp"] == "bf16" and paired[0]["n_pairs"] == 12 and paired[0]["verdict"] == "equivalent"
    assert data["seed_noise"]["configurations"] == 8 and 0.001 < data["seed_noise"]["final_test_acc_std"] < 0.0035
    assert (data["sweep"]["best_column"], data["sweep"]["best_mode"]) == ("final_test_acc", "max")


def test_every_sweep_metric_has_a_trial_column(factorial):
    assert set(OBJECTIVES) == set(SWEEP_OBJECTIVES)
    columns = set(build_report(factorial[0]).trials.columns)
    assert {metric.column for metric in OBJECTIVES.values()} <= columns


def test_best_follows_the_sweep_metric_and_mode(tmp_path):
    """metric=test_loss, mode=min: the lowest loss (momentum, workers=1) is best, not the most accurate (adam)."""
    run_dir = tmp_path / "by-loss"
    grid = {"optimizer": ["momentum", "adam"], "workers": [1, 2]}
    make_factorial(
        run_dir,
        grid,
        loss=lambda s: 0.40 + 0.2 * (s["optimizer"] == "adam") + 0.05 * (s["workers"] == 2),
        metric="test_loss",
        mode="min",
    )
    report = build_report(run_dir)
    assert (report.objective.column, report.objective.better) == ("final_test_loss", "min")
    text = report_text(report)
    findings = text.split("## Findings")[1].split("\n## ")[0]
    best = next(line for line in findings.splitlines() if "**Best**" in line)
    assert best == (
        "- **Best** (by the sweep's metric: lowest final test loss): optimizer=momentum, workers=1 at 0.4000, mean of "
        "3 trials, beyond the seed noise of every other configuration (the last: optimizer=adam, workers=2, 0.6500)."
    )
    accurate = next(line for line in findings.splitlines() if "**Most accurate**" in line)
    assert "optimizer=adam, workers=2 at" in accurate  # a different configuration
    assert "| Best means | lowest final test loss (sweep metric=test_loss, mode=min) |" in text
    section = text.split("## Effect of `optimizer`")[1].split("\n## ")[0]
    table = section.split("Per-value means")[1]
    assert "| final test acc (%) | final test loss |" in table
    momentum = next(line for line in table.splitlines() if line.startswith("| momentum (baseline) |"))
    assert "| 0.425 ± 0.027 |" in momentum


def test_unknown_metric_falls_back_to_accuracy_and_says_so(tmp_path):
    run_dir = tmp_path / "odd-metric"
    make_factorial(run_dir, {"workers": [1, 2]}, metric="f1_score", mode="max")
    report = build_report(run_dir)
    assert report.objective.column == "final_test_acc" and "f1_score" in report.objective_note
    text = report_text(report)
    assert (
        "**Best** means the highest final test acc (%) (fallback: sweep metric=f1_score, mode=max has no trial column)."
    ) in text
