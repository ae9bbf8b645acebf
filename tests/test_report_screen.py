"""The report's first screen (report/screen.py), time to a target accuracy, and the overview plots' data
(report/overview.py), on hand-made run folders whose truth is known; the records and the data functions are what is
checked, the wording is the golden files'."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import cost_run, ranked_correct, trial_name, write_correct, write_sweep, write_trial

from cifar_ray.report import build_report, write_report
from cifar_ray.report.document import Bullets, Heading, Paragraph, Table
from cifar_ray.report.overview import fit_data, progress_data, speedup_data
from cifar_ray.report.screen import config_table
from cifar_ray.report.sections import document

ROOT = Path(__file__).parent.parent


def target_run(run_dir: Path, curves: dict, seeds: int = 3) -> Path:
    """batch_size values -> (seconds per epoch, test accuracy per epoch), each seed a little off (±1 %)."""
    grid = {"batch_size": list(curves)}
    combos = [{"batch_size": b, "seed": s} for b in curves for s in range(seeds)]
    write_sweep(run_dir, [trial_name(i) for i in range(len(combos))], grid=grid, repeats=seeds, name="target")
    rng = random.Random(2)
    for i, swept in enumerate(combos):
        seconds, accuracies = curves[swept["batch_size"]]
        accuracies = accuracies(swept["seed"]) if callable(accuracies) else accuracies
        rows = [
            {
                "epoch": e,
                "train_loss": 1.0,
                "train_acc": acc,
                "test_loss": 1.0,
                "test_acc": acc,
                "epoch_time_s": seconds * (1 + rng.uniform(-0.01, 0.01)),
                "peak_mem_mb": 100.0,
            }
            for e, acc in enumerate(accuracies, start=1)
        ]
        write_trial(run_dir, i, swept, "finished", rows, gpus=False, planned=len(rows))
    return run_dir


def pooled(report, metric: str):
    (found,) = [e for e in report.records if e.metric == metric and not e.cell]
    return found


SLOW_START = [0.5, 0.6, 0.7, 0.75, 0.8, 0.82, 0.84, 0.86]  # reaches 85 % at epoch 8


def test_twice_as_fast_per_epoch_yet_later_to_the_target_is_reported_the_right_way_round(tmp_path):
    """Truth: batch 128 runs an epoch in 2.5 s against 5 s at batch 64, but reaches 85 % at epoch 8 (20 s) where
    batch 64 does at epoch 3 (15 s): 2x faster per epoch, 1.33x later to the target."""
    curves = {64: (5.0, [0.7, 0.8, 0.86, 0.87, 0.88, 0.88, 0.88, 0.88]), 128: (2.5, SLOW_START)}
    report = build_report(target_run(tmp_path / "run", curves), target=0.85)
    epoch, reach = pooled(report, "time_per_epoch"), pooled(report, "time_to_target")
    assert epoch.verdict == "differs" and epoch.estimate == pytest.approx(0.5, rel=0.02)
    assert reach.verdict == "differs" and reach.estimate == pytest.approx(20 / 15, rel=0.02) and reach.pairs == 3
    assert report.trials["epochs_to_target"].tolist() == [3, 3, 3, 8, 8, 8]


def test_a_trial_that_never_reaches_the_target_is_counted_not_dropped(tmp_path):
    """Truth: one of batch 128's three seeds never reaches 85 %. It is no pair of the comparison, and the record
    and the configuration table both count it."""
    curves = {64: (5.0, [0.7, 0.8, 0.86]), 128: (2.5, lambda seed: [0.7, 0.8, 0.86 if seed else 0.84])}
    report = build_report(target_run(tmp_path / "run", curves), target=0.85)
    reach = pooled(report, "time_to_target")
    assert (reach.pairs, reach.pairs_lost) == (2, 1)
    assert reach.lost_why == "batch_size=128 did not reach 85 % in 1 of 3; the baseline in 0 of 3"
    assert report.configs["target_reached"].tolist() == [3, 2]
    assert config_table(report).rows[1][-1].endswith("(2 of 3 reached)")


def test_a_value_that_never_reaches_the_target_is_its_answer(tmp_path):
    curves = {64: (5.0, [0.7, 0.8, 0.86]), 128: (2.5, [0.7, 0.8, 0.84])}
    reach = pooled(build_report(target_run(tmp_path / "run", curves), target=0.85), "time_to_target")
    assert (reach.verdict, reach.reason) == (
        "failed",
        "batch_size=128 did not reach 85 % in 3 of 3; the baseline in 0 of 3",
    )


def test_a_target_written_as_a_percentage_is_refused_in_one_line(tmp_path):
    logs = ROOT / "reports" / "quickstart" / "logs"
    command = [sys.executable, "-m", "cifar_ray.cli", "report", str(logs), "--out", str(tmp_path), "--target", "85"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "cifar-ray: error: --target: target 85 reads as a percentage; write it as a fraction: 0.85"
    ]
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\ngrid: {lr: [0.1, 0.2]}\ntarget: 85\n")
    done = subprocess.run(
        [sys.executable, "-m", "cifar_ray.cli", "sweep", str(sweep), "--dry-run"], capture_output=True, text=True
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "0.85" in done.stderr


def first_screen(blocks) -> tuple[int, list[str]]:
    """The words before the first answer line (tables are not words), and every prose line before the per-factor
    sections."""
    words, prose, answered = 0, [], False
    for block in blocks:
        if isinstance(block, Heading) and block.text.startswith("Effect of"):
            break
        if isinstance(block, Bullets) and not answered:
            answered = True
        if isinstance(block, Heading | Paragraph) and not answered:
            words += len(block.text.split())
        if isinstance(block, Paragraph):
            prose.append(block.text)
        if isinstance(block, Bullets):
            prose += list(block.items)
    return words, prose


@pytest.mark.parametrize("target", [None, 0.8])
def test_the_quickstarts_first_screen_answers_within_100_words_in_short_lines(target):
    report = build_report(ROOT / "reports" / "quickstart" / "logs", target=target)
    blocks = document(report, {})
    assert [b.text for b in blocks if isinstance(b, Heading)][:5] == [
        "quickstart",
        "Configurations",
        "Answers",
        "Setup",
        "Plots",
    ]
    words, prose = first_screen(blocks)
    assert words < 100 and all(len(line.split()) <= 45 for line in prose), [p for p in prose if len(p.split()) > 45]
    table = next(b for b in blocks if isinstance(b, Table) and b.name == "configurations")
    assert len(table.rows) == 4 and (target is None) == (not table.headers[-1].startswith("time to 80 %"))


def test_the_overview_plots_data(tmp_path):
    """Truth: workers 2 halves the epoch at batch 512 and slows it 1.4x at batch 32 (3 seeds): the speed-up is
    drawn per batch size (the time effect depends on it), against the ideal line; accuracy against wall-clock time
    is the mean over seeds of cumulative epoch time; the fit plot's dashed line is the train accuracy."""
    grid = {"workers": [1, 2], "batch_size": [32, 512]}
    times = {(1, 32): 10.0, (2, 32): 14.0, (1, 512): 10.0, (2, 512): 5.0}
    trials = [
        {"swept": dict(zip(grid, point)) | {"seed": seed}, "times": [times[point]] * 3}
        for point in itertools.product(*grid.values())
        for seed in range(3)
    ]
    report = build_report(cost_run(tmp_path / "run", trials, grid))
    speedup = speedup_data(report)
    assert speedup.per_cell and {line.label: line.speedup for line in speedup.lines} == {
        "batch_size=32": pytest.approx((1.0, 10 / 14)),
        "batch_size=512": pytest.approx((1.0, 2.0)),
    }
    progress = {curve.label: curve for curve in progress_data(report).curves}
    assert progress["workers=2, batch_size=32"].x == pytest.approx((14.0, 28.0, 42.0))
    assert progress["workers=2, batch_size=32"].y == pytest.approx((80.0, 80.0, 80.0))
    fit = fit_data(report)[0]
    assert fit.x == (1.0, 2.0, 3.0) and fit.dashed_y == pytest.approx((80.0, 80.0, 80.0))


@pytest.mark.slow
def test_a_thousand_trial_report_builds_without_a_warning_and_keeps_its_first_screen(tmp_path):
    """200 configurations x 5 seeds: no matplotlib warning (a legend of 1,000 entries collapsed the axes), and the
    first screen still shows 12 configurations, answers within 100 words, and no long prose line."""
    grid = {"batch_size": [32, 64, 128, 256, 512], "lr": [0.01, 0.03, 0.1, 0.3, 1.0], "optimizer": list("abcdefgh")}
    combos = [dict(zip(grid, v)) | {"seed": s} for v in itertools.product(*grid.values()) for s in range(5)]
    write_sweep(tmp_path / "run", [trial_name(i) for i in range(len(combos))], grid=grid, repeats=5, name="big")
    rng = random.Random(1)
    for i, swept in enumerate(combos):
        acc = 0.6 + 0.05 * (swept["optimizer"] == "d") + rng.gauss(0, 0.005)
        rows = [
            {"epoch": e, "train_loss": 1 / e, "train_acc": acc, "test_loss": 1 / e, "test_acc": acc - 0.01 * (3 - e)}
            | {"epoch_time_s": 640 / swept["batch_size"] ** 0.5 * (1 + rng.gauss(0, 0.02)), "peak_mem_mb": 100.0}
            for e in range(1, 4)
        ]
        write_trial(tmp_path / "run", i, swept, "finished", rows, gpus=False, planned=3)
        write_correct(tmp_path / "run", i, ranked_correct(acc, 1000), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        readme = write_report(tmp_path / "run", tmp_path / "out")
    assert readme.exists() and (tmp_path / "out" / "accuracy_vs_time.png").exists()
    report = build_report(tmp_path / "run")
    words, prose = first_screen(document(report, {}))
    assert words < 100 and all(len(line.split()) <= 45 for line in prose)
    assert len(config_table(report).rows) == 12
