"""The report cannot be misread: peak memory per worker and in total, the train metrics' basis (running or
evaluated like the test set), and factor plots laid out by the kind of factor. Hand-made run folders written as
training writes them (tests/helpers.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import healthy_epochs, make_factorial, make_run, trial_name, write_sweep, write_trial

from cifar_ray.report import (
    FACTOR_METRICS,
    MEMORY_MEASURES,
    accuracy_series,
    build_report,
    dodge,
    factor_axis,
    factor_positions,
    trial_overfitting,
    write_report,
)
from cifar_ray.report.export import export
from cifar_ray.report.plots import curves_data, factor_plot_data

CPU_MEASURE = "peak RSS of one worker process (the whole process: Python, torch, data)"
GPU_MEASURE = "peak memory allocated by torch on one GPU"
NEW_KEYS = ("train_eval_loss", "train_eval_acc", "peak_mem_total_mb")


def section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


@pytest.fixture(scope="module")
def old_logs(tmp_path_factory):
    """Logs written before peak_mem_total_mb and train_eval_* existed (CPU trials; accuracy rises every epoch)."""
    run_dir = tmp_path_factory.mktemp("runs") / "factorial"
    make_factorial(run_dir, {"optimizer": ["momentum", "adam"], "workers": [1, 2]})
    return run_dir


@pytest.mark.parametrize(
    "values, axis",
    [
        (["momentum", "adam"], "category"),
        ([True, False], "category"),  # booleans are not numbers here
        ([64, "auto"], "category"),
        ([0.05], "category"),  # one value: nothing to scale
        ([16, 32, 64, 128], "log2"),
        ([128, 64, 256], "log2"),  # grid order does not matter
        ([3, 6, 24], "log2"),  # the smallest times powers of two
        ([1, 2], "linear"),  # spans less than a factor of 4
        ([1, 2, 3, 4], "linear"),  # evenly spaced, not doubling
        ([0.1, 0.01, 0.001], "log10"),
        ([0.1, 0.01], "linear"),  # less than two decades
        ([0.0, 5e-4, 5e-3], "linear"),  # zero has no place on a log axis
    ],
)
def test_factor_axis(values, axis):
    assert factor_axis(values) == axis


def test_positions_and_dodge_follow_the_axis():
    assert factor_positions(["adam", "momentum"], "category").tolist() == [0.0, 1.0]
    assert factor_positions([128, 64], "log2").tolist() == [128.0, 64.0]
    assert dodge(np.array([0.0, 1.0]), "category", -0.08).tolist() == pytest.approx([-0.08, 0.92])
    # linear: a fraction of the mean step (10 here); log: of the mean ratio (2 here), the same on every value
    assert dodge(np.array([10.0, 20.0, 30.0]), "linear", 0.1).tolist() == pytest.approx([11.0, 21.0, 31.0])
    moved = dodge(np.array([16.0, 32.0, 64.0]), "log2", 0.5)
    assert (moved / [16, 32, 64]).tolist() == pytest.approx([2**0.5] * 3)
    assert dodge(np.array([5.0]), "linear", 0.3).tolist() == [5.0]


def test_best_equal_to_final_is_one_series_that_says_so():
    rows = pd.DataFrame({"final_test_acc_mean": [0.7, 0.8, np.nan], "best_test_acc_mean": [0.7, 0.8, np.nan]})
    ((metric, label),) = accuracy_series(rows)
    assert metric == FACTOR_METRICS[0] and "= best" in label
    rows.loc[1, "best_test_acc_mean"] = 0.81
    assert [metric for metric, _ in accuracy_series(rows)] == list(FACTOR_METRICS[:2])


def test_factor_plots_lay_out_each_kind_of_factor(tmp_path):
    """Numeric factors on log axes, a categorical one, best = final: drawn, linked and captioned."""
    run_dir = tmp_path / "axes"
    make_factorial(run_dir, {"workers": [1, 2, 4], "lr": [0.1, 0.001], "optimizer": ["momentum", "adam"]})
    report = build_report(run_dir)
    assert [factor_axis(report.groups[key][key].tolist()) for key in report.factors] == ["log2", "log10", "category"]
    text = export(report, tmp_path / "out").read_text(encoding="utf-8")
    for key in report.factors:
        assert f"![Final test accuracy (= best in every trial) vs {key}]({key}_accuracy.png)" in text
        assert (tmp_path / "out" / f"{key}_accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_old_logs_render_with_the_per_worker_peak_and_running_train_metrics(old_logs, tmp_path):
    report = build_report(old_logs)
    assert report.trials["peak_mem_total_mb"].isna().all() and (report.trials["train_basis"] == "running").all()
    text = export(report, tmp_path).read_text(encoding="utf-8")
    findings = section(text, "Findings")
    line = next(line for line in findings.splitlines() if "**Least memory**" in line)
    assert "(by the peak per worker: not every configuration logged a total)" in line
    assert "MB per worker" in line and "total" not in line.split("):")[1]
    table = section(text, "Effect of `workers`").split("Per-value means")[1]
    assert "| peak mem per worker (MB) | peak mem, total over workers (MB) |" in table
    assert table.splitlines()[4].endswith("| 500.0 ± 0.0 | — |")
    how = section(text, "How to read this report")
    assert "train acc, eval" not in section(text, "Trials")
    assert "Gap = final running train acc − final test acc" in how
    assert "These logs have no eval train metrics (train_eval_acc)" in how
    assert "— where the logs have no total (peak_mem_total_mb)" in how
    assert f"Peak mem per worker: {CPU_MEASURE}" in how  # the trials ran on CPUs
    assert "Running train accuracy and loss are means over the epoch's training steps" in how
    data = json.loads(export(report, tmp_path, fmt="json").read_text(encoding="utf-8"))
    assert data["trials"][0]["peak_mem_total_mb"] is None and data["trials"][0]["train_basis"] == "running"
    assert data["sweep"]["memory_measure"] == CPU_MEASURE


def test_new_logs_name_the_gpu_measure_and_export_both_peaks(tmp_path):
    run_dir = tmp_path / "bs-workers"
    written = make_run(run_dir)
    text = write_report(run_dir, tmp_path / "md").read_text(encoding="utf-8")
    how = section(text, "How to read this report")
    assert f"Peak mem per worker: {GPU_MEASURE}" in how and CPU_MEASURE not in text
    assert "no total" not in how and "Gap = final eval train acc − final test acc (percentage points)" in how
    assert "Eval train accuracy and loss evaluate the first `train_eval_size` training images (5000 here" in how
    assert "![Loss per epoch: train loss evaluated like the test set (dashed), test loss (solid)]" in text
    assert text.count("Peak mem per worker: ") == 1  # said once

    trials_csv = pd.read_csv(write_report(run_dir, tmp_path / "csv", fmt="csv"))
    last = written[0][-1]
    row = trials_csv.iloc[0]
    assert (row["peak_mem_mb"], row["peak_mem_total_mb"]) == (last["peak_mem_mb"], last["peak_mem_total_mb"])
    assert row["final_train_eval_acc"] == pytest.approx(last["train_eval_acc"]) and row["train_basis"] == "eval"
    workers = pd.read_csv(tmp_path / "csv" / "factor_workers.csv").set_index("workers")
    assert workers.loc[2, "peak_mem_total_mb_mean"] > workers.loc[1, "peak_mem_total_mb_mean"]
    assert workers.loc[2, "peak_mem_mb_mean"] < workers.loc[1, "peak_mem_mb_mean"]
    data = json.loads(write_report(run_dir, tmp_path / "json", fmt="json").read_text(encoding="utf-8"))
    assert data["sweep"]["memory_measure"] == GPU_MEASURE
    assert data["configurations"][0]["peak_mem_total_mb_mean"] is not None


def test_mixed_devices_and_bases_are_each_named(tmp_path):
    """One trial logged the new keys on a GPU, the other is an old CPU log: each says what it is."""
    run_dir = tmp_path / "mixed"
    write_sweep(run_dir, [trial_name(0), trial_name(1)], grid={"workers": [1, 2]}, repeats=1)
    for i, workers in enumerate([1, 2]):
        swept = {"batch_size": 64, "workers": workers, "seed": 0}
        epochs = healthy_epochs(i, swept)
        if i:
            epochs = [{k: v for k, v in row.items() if k not in NEW_KEYS} for row in epochs]
        write_trial(run_dir, i, swept, "finished", epochs, gpus=not i)
    report = build_report(run_dir)
    assert report.memory_measure == f"{CPU_MEASURE} on CPU trials; {GPU_MEASURE} on GPU trials"
    assert set(MEMORY_MEASURES.values()) == {CPU_MEASURE, GPU_MEASURE}
    text = export(report, tmp_path / "out").read_text(encoding="utf-8")
    trials = section(text, "Trials")
    old = next(line for line in trials.splitlines() if line.startswith(f"| `{trial_name(1)}`"))
    new = next(line for line in trials.splitlines() if line.startswith(f"| `{trial_name(0)}`"))
    assert " † |" in old and "†" not in new
    assert "† the running train acc: the trial logged no eval one" in section(text, "How to read this report")
    assert "train loss evaluated like the test set where logged, else running" in text


def test_overfitting_reads_the_eval_train_loss_where_logged():
    """The running train loss falls (augmented, changing model) while the evaluated one rises with the test loss:
    the model is not fitting its training images better, so this is no overfitting."""
    epochs = pd.DataFrame(
        {
            "epoch": [1, 2, 3],
            "train_loss": [1.4, 1.0, 0.6],
            "test_loss": [1.2, 1.0, 1.3],
            "train_eval_loss": [1.1, 0.9, 1.2],
        }
    )
    assert trial_overfitting(epochs) is None
    running = trial_overfitting(epochs.assign(train_eval_loss=np.nan))
    assert running is not None and (running.min_epoch, running.onset) == (2, 3)


def test_curves_data_draws_each_trial_with_epochs_by_its_train_basis(tmp_path):
    run_dir = tmp_path / "bs-workers"
    written = make_run(run_dir)
    data = curves_data(build_report(run_dir))
    assert data.n_trials == 8 and [curve.index for curve in data.curves] == [0, 1, 2, 3, 4, 5, 6]  # 7: no epoch
    first = data.curves[0]
    assert first.label == "batch_size=64, workers=1, seed=0"
    assert first.epoch.tolist() == [row["epoch"] for row in written[0]]
    assert first.train_loss.tolist() == [row["train_eval_loss"] for row in written[0]]  # eval logged: eval loss
    assert first.test_acc_pct.tolist() == pytest.approx([100 * row["test_acc"] for row in written[0]])
    assert not data.log_loss and data.train_phrase == "train loss evaluated like the test set"

    spread = tmp_path / "spread"  # test losses from 2.0 down to 0.005: more than a factor of 100
    write_sweep(spread, [trial_name(0)], grid={"workers": [1]}, repeats=1)
    swept = {"batch_size": 64, "workers": 1, "seed": 0}
    epochs = healthy_epochs(0, swept)
    epochs[-1]["test_loss"] = 0.005
    write_trial(spread, 0, swept, "finished", epochs)
    assert curves_data(build_report(spread)).log_loss


def test_factor_plot_data_holds_every_finished_trial_per_value(tmp_path):
    run_dir = tmp_path / "workers"
    finals = make_factorial(run_dir, {"workers": [1, 2, 4]})  # 3 seeds per value, in grid order
    data = factor_plot_data(build_report(run_dir), "workers")
    assert data.ticks == ["1", "2", "4"] and data.baseline.tolist() == [True, False, False]
    assert [bars.metric for bars in data.costs] == list(FACTOR_METRICS[2:])
    assert data.costs[0].mean.tolist() == pytest.approx([10.01, 5.01, 2.51])  # 10 s / workers + 0.01 s x seed
    assert (data.axis, data.positions.tolist(), data.order.tolist()) == ("log2", [1.0, 2.0, 4.0], [0, 1, 2])
    (series,) = data.series  # accuracy rises every epoch: best = final, one series, not moved aside
    assert series.x.tolist() == [1.0, 2.0, 4.0]
    for v, points in enumerate(series.trials):
        expected = [100 * finals[i] for i in range(3 * v, 3 * v + 3)]
        assert sorted(points.tolist()) == pytest.approx(sorted(expected))
        assert series.mean[v] == pytest.approx(np.mean(expected))

    make_run(tmp_path / "bs-workers")  # trial 1's last epoch is not its best: final and best, moved apart
    two = factor_plot_data(build_report(tmp_path / "bs-workers"), "workers")
    assert [len(s.trials[0]) for s in two.series] == [3, 3]  # workers=1: trials 0, 1 and 4 finished
    assert [s.x.tolist() for s in two.series] == [pytest.approx([0.92, 1.92]), pytest.approx([1.08, 2.08])]
