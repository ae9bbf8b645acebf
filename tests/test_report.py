"""The report, on hand-made run folders written exactly as training writes them (no Ray, no mocks)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest
from helpers import (
    DIVERGED,
    FAILED,
    GRID,
    OVERFIT,
    PENDING,
    combos,
    healthy_epochs,
    make_run,
    overfitting_epochs,
    report_text,
    trial_name,
    write_sweep,
    write_trial,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cifar_ray.core.config import ConfigError
from cifar_ray.report import (
    OVERFIT_RULE,
    build_report,
    find_overfitting,
    markdown_table,
    write_report,
)
from cifar_ray.report.export import export
from cifar_ray.report.load import time_per_epoch
from cifar_ray.report.stats import sample_stats

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def finished(written: dict) -> dict[int, list[dict]]:
    return {i: e for i, e in written.items() if i not in (FAILED, DIVERGED, PENDING)}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("runs") / "bs-workers"
    return run_dir, make_run(run_dir)


@pytest.fixture(scope="module")
def readme(run, tmp_path_factory) -> Path:
    return write_report(run[0], tmp_path_factory.mktemp("out") / "report")


def test_trial_table_has_one_row_per_trial_with_the_logged_numbers(run, readme):
    run_dir, written = run
    trials = build_report(run_dir).trials
    assert trials["trial"].tolist() == [trial_name(i) for i in range(8)]
    assert trials.loc[FAILED, "status"] == "failed" and trials.loc[PENDING, "epochs_done"] == 0
    row, epochs = trials.loc[1], written[1]
    assert row["final_test_acc"] == pytest.approx(epochs[-1]["test_acc"])
    best = max(epochs, key=lambda e: e["test_acc"])
    assert best["epoch"] == 3  # trial 1's last epoch drops: best != final
    assert row["best_test_acc"] == pytest.approx(best["test_acc"]) and row["best_epoch"] == 3
    # The gap is like-for-like: the training subset evaluated as the test set is, not the running train accuracy.
    assert row["train_basis"] == "eval"
    assert row["gap"] == pytest.approx(epochs[-1]["train_eval_acc"] - epochs[-1]["test_acc"])
    assert row["final_train_acc"] == pytest.approx(epochs[-1]["train_acc"])
    assert row["final_train_eval_loss"] == pytest.approx(epochs[-1]["train_eval_loss"])
    # time/epoch: the median of the epochs after the first (TIME_PER_EPOCH_RULE), the breakdown their mean
    assert row["time_per_epoch_s"] == pytest.approx(statistics.median(e["epoch_time_s"] for e in epochs[1:]))
    assert row["train_time_s"] == pytest.approx(sum(e["epoch_time_s"] for e in epochs))
    assert row["peak_mem_mb"] == max(e["peak_mem_mb"] for e in epochs)
    assert row["peak_mem_total_mb"] == max(e["peak_mem_total_mb"] for e in epochs)
    assert row["effective_batch"] == 2 * 64  # batch_size x accum_steps
    assert row["time_data_s"] == pytest.approx(statistics.mean(e["time_data_s"] for e in epochs[1:]))
    assert row["samples_per_s"] == pytest.approx(statistics.mean(e["samples_per_s"] for e in epochs[1:]))
    assert "future_key" not in trials.columns

    text = readme.read_text()
    table = text.split("## Trials")[1].split("\n\n")[1].splitlines()
    assert len(table) == 2 + 8
    line = next(line for line in table if trial_name(1) in line)
    assert f"| finished (4/4) | {100 * epochs[-1]['test_acc']:.2f} | {100 * best['test_acc']:.2f} (3) |" in line
    assert f"| {epochs[-1]['peak_mem_mb']:.1f} |" in line
    # At most 10 columns, the most telling first; the others stay in trials.csv and report.json.
    header = table[0]
    assert header == (
        "| trial | batch_size | workers | seed | outcome (epochs) | final test acc (%) | best test acc (%) (epoch) "
        "| time/epoch (s) | peak mem per worker (MB) | overfitting |"
    )
    pending = next(line for line in table if trial_name(PENDING) in line)
    assert "| pending (0/4) |" in pending


def test_header_comes_from_the_logs(readme):
    text = readme.read_text()
    assert text.startswith(
        "# bs-workers\n\n**Question.** Does a bigger batch or more workers train faster at equal accuracy?\n\n"
        "## Configurations\n\n"
    )
    assert (
        "| Measured | 8 trials (5 finished, 1 failed, 1 diverged, 0 oom, 1 pending): batch_size 64, 128 × "
        "workers 1, 2 × 2 seeds, 4 epochs each on cifar10, tested on 10000 images."
    ) in text
    assert "| Date | 2025-03-04 05:06 (UTC+0000) |" in text
    assert "`abc1234def`" in text
    assert "4 × NVIDIA H100 80GB HBM3" in text
    assert "Python 3.11.9, torch 2.14.1, Ray 2.60.0" in text
    assert "| Wall time | 1 h 02 min |" in text
    assert " runs" not in text.split("## Findings")[0]  # trials are called trials
    # The keys every trial shares: only those off their default in the Markdown, all of them in report.json.
    assert "| Fixed settings (not default) | epochs=4, accum_steps=2, backend=nccl |" in text
    assert "data_dir" not in text.split("## Findings")[0]


def test_factor_tables_mean_and_sample_std(run, readme):
    run_dir, written = run
    report = build_report(run_dir)
    ok = finished(written)
    swept = combos()
    for key in GRID:
        frame = report.groups[key].set_index(key)
        for value in GRID[key]:
            finals = [ok[i][-1]["test_acc"] for i in ok if swept[i][key] == value]
            bests = [max(e["test_acc"] for e in ok[i]) for i in ok if swept[i][key] == value]
            times = [statistics.median(e["epoch_time_s"] for e in ok[i][1:]) for i in ok if swept[i][key] == value]
            assert frame.loc[value, "n"] == len(finals)
            assert frame.loc[value, "final_test_acc_mean"] == pytest.approx(statistics.mean(finals))
            assert frame.loc[value, "best_test_acc_mean"] == pytest.approx(statistics.mean(bests))
            assert frame.loc[value, "time_per_epoch_s_mean"] == pytest.approx(statistics.mean(times))
            if len(finals) > 1:
                assert frame.loc[value, "final_test_acc_std"] == pytest.approx(statistics.stdev(finals))
            else:
                assert math.isnan(frame.loc[value, "final_test_acc_std"])
    # batch_size=128 has one finished trial (4); the others failed, diverged or never started.
    assert report.groups["batch_size"]["n"].tolist() == [4, 1]
    assert report.groups["workers"]["n"].tolist() == [3, 2]

    text = readme.read_text()
    section = text.split("## Effect of `batch_size`")[1].split("## ")[0]
    finals64 = [ok[i][-1]["test_acc"] for i in ok if swept[i]["batch_size"] == 64]
    cell = f"{100 * statistics.mean(finals64):.2f} ± {100 * statistics.stdev(finals64):.2f}"
    assert cell in section
    assert f"{100 * ok[4][-1]['test_acc']:.2f} ± —" in section  # n = 1


def test_per_value_means_are_compact_and_crown_nothing(run, readme):
    """Means only (the effects are the paired table's): no Δ columns, no bold winner regardless of the noise."""
    section = readme.read_text().split("## Effect of `workers`")[1].split("## ")[0]
    table = section.split("Per-value means:")[1].split("\n\n")[1].splitlines()
    assert table[0] == (
        "| workers | n | final test acc (%) | best test acc (%) | time/epoch (s) | peak mem per worker (MB) "
        "| peak mem, total over workers (MB) |"
    )
    assert not any("**" in row or " pp" in row or "Δ" in row for row in table)


def test_default_baseline_is_the_first_grid_value(run, readme):
    report = build_report(run[0])
    assert report.baseline == {"batch_size": 64, "workers": 1}
    frame = report.groups["batch_size"].set_index("batch_size")
    delta = frame.loc[128, "final_test_acc_mean"] - frame.loc[64, "final_test_acc_mean"]
    assert frame.loc[128, "final_test_acc_delta"] == pytest.approx(delta)
    pct = 100 * (frame.loc[128, "time_per_epoch_s_mean"] / frame.loc[64, "time_per_epoch_s_mean"] - 1)
    assert frame.loc[128, "time_per_epoch_s_delta_pct"] == pytest.approx(pct)
    assert frame.loc[64, "final_test_acc_delta"] == 0
    section = readme.read_text().split("## Effect of `batch_size`")[1].split("## ")[0]
    assert "| 64 (baseline) |" in section and "| batch_size=128 | 1 of 4 |" in section


def test_baseline_option_changes_the_reference(run):
    report = build_report(run[0], baseline={"batch_size": 128})
    frame = report.groups["batch_size"].set_index("batch_size")
    assert frame.loc[128, "is_baseline"] and not frame.loc[64, "is_baseline"]
    assert frame.loc[64, "final_test_acc_delta"] == pytest.approx(
        frame.loc[64, "final_test_acc_mean"] - frame.loc[128, "final_test_acc_mean"]
    )
    assert report.baseline["workers"] == 1  # untouched factor keeps its first value


def test_baseline_value_not_in_grid_is_rejected(run, tmp_path):
    with pytest.raises(ConfigError, match=r"batch_size=100.*not in the grid; allowed: 64, 128"):
        write_report(run[0], tmp_path, baseline={"batch_size": 100})


def test_baseline_key_not_swept_is_rejected(run, tmp_path):
    with pytest.raises(ConfigError, match=r"'lr' is not a swept factor.*swept keys: batch_size, workers"):
        write_report(run[0], tmp_path, baseline={"lr": 0.1})
    with pytest.raises(ConfigError, match="'seed' is not a swept factor"):
        write_report(run[0], tmp_path, baseline={"seed": 0})


def test_overfitting_rule():
    epochs = [1, 2, 3, 4]
    falling = [1.4, 1.0, 0.6, 0.3]
    found = find_overfitting(epochs, falling, [1.5, 1.2, 1.3, 1.45])
    assert (found.min_epoch, found.onset) == (2, 3)
    assert find_overfitting(epochs, falling, [1.5, 1.2, 1.1, 1.0]) is None  # test loss keeps falling
    assert find_overfitting(epochs, falling, [1.5, 1.2, 1.21, 1.215]) is None  # rise within 2 %: noise
    assert find_overfitting(epochs, [1.4, 1.0, 1.1, 1.3], [1.5, 1.2, 1.3, 1.45]) is None  # train loss rises too
    assert find_overfitting(epochs, [1.4, None, 0.6, 0.3], [1.5, None, 1.3, 1.45]) is not None  # nulls skipped
    assert find_overfitting([1], [1.0], [1.0]) is None


def test_overfitting_trial_is_flagged_and_explained(run, readme):
    trials = build_report(run[0]).trials
    assert trials["overfitting"].tolist() == [i == OVERFIT for i in range(8)]
    assert trials.loc[OVERFIT, "overfit_epoch"] == 3
    text = readme.read_text()
    assert OVERFIT_RULE in text
    row = next(line for line in text.splitlines() if line.startswith(f"| `{trial_name(OVERFIT)}`"))
    assert "**yes** (from epoch 3)" in row
    healthy = next(line for line in text.splitlines() if line.startswith(f"| `{trial_name(0)}`"))
    assert healthy.endswith("| no |")
    sentences = [line for line in text.split("## Overfitting")[1].split("## ")[0].splitlines() if line.startswith("- ")]
    assert len(sentences) == 1 and trial_name(OVERFIT) in sentences[0]
    assert "1.2000 in epoch 2" in sentences[0] and "1.3000 in epoch 3" in sentences[0]
    epochs = overfitting_epochs(OVERFIT, combos()[OVERFIT])
    assert "while eval train loss fell from 0.9000 to 0.5000" in sentences[0]  # not the running 1.0 to 0.6
    gap = 100 * (epochs[-1]["train_eval_acc"] - epochs[-1]["test_acc"])
    assert sentences[0].endswith(f"final eval train − test accuracy gap {gap:.2f} pp.")


def test_excluded_trials_are_listed_with_their_reason(readme):
    text = readme.read_text()
    section = text.split("## Excluded trials")[1].split("## ")[0]
    assert f"`{trial_name(FAILED)}`" in section and "failed after 1 of 4 epochs" in section
    assert "RuntimeError: boom in the loader" in section
    assert f"`{trial_name(DIVERGED)}`" in section and "diverged at epoch 2" in section
    assert f"`{trial_name(PENDING)}`" in section and "pending: 0 of 4 epochs" in section
    assert "Aggregates use the 5 included trial(s); the 3 other(s) are listed under *Excluded trials*." in text


def test_findings_name_leaders_only_beyond_the_noise(run, readme):
    """Fastest: the two fastest configurations differ by less than the seed noise of time/epoch, so neither is
    named; Least memory: one worker's total is far below the others', beyond the noise, so it is named."""
    report = build_report(run[0])
    configs = report.configs[report.configs["n"] > 0].set_index(["batch_size", "workers"])
    text = readme.read_text().split("## Findings")[1].split("## ")[0]
    fast = next(line for line in text.splitlines() if "**Fastest**" in line)
    t = configs["time_per_epoch_s_mean"]
    assert fast == (
        "- **Fastest** (by the geometric mean of warm epochs; noise: seed noise of the log time per epoch): within "
        f"the seed noise of each other: batch_size=128, workers=1 (1 of 2 trials failed; {t[(128, 1)]:.2f} s/epoch), "
        f"batch_size=64, workers=2 ({t[(64, 2)]:.2f} s/epoch)."
    )
    small = configs.loc[(64, 1)]
    line = next(line for line in text.splitlines() if "**Least memory**" in line)
    assert line.startswith(
        f"- **Least memory** (by the peak total over workers): batch_size=64, workers=1 at "
        f"{small['peak_mem_total_mb_mean']:,.1f} MB total over workers, {small['peak_mem_mb_mean']:,.1f} MB per "
        "worker, mean of 2 trials, beyond the seed noise of every other configuration"
    )


def test_effect_lines_say_how_many_pairs_and_what_removed_the_others(run, readme):
    """workers=2 diverged in one seed and never ran in another: 2 of its 4 planned pairs remain, and its line says
    so; batch_size=128 has one pair: no verdict, and no spread to tell how many seeds would settle it."""
    report = build_report(run[0])
    ok = finished(run[1])
    pairs = [ok[2][-1]["test_acc"] - ok[0][-1]["test_acc"], ok[3][-1]["test_acc"] - ok[1][-1]["test_acc"]]
    workers = report.effects["workers"]["final_test_acc"].iloc[0]
    assert (workers["n_pairs"], workers["n_planned"]) == (2, 4)
    assert workers["mean_diff"] == pytest.approx(statistics.mean(pairs))
    text = readme.read_text().split("## Findings")[1].split("## ")[0]
    line = next(line for line in text.splitlines() if line.startswith("- **workers=2**"))
    assert line.startswith("- **workers=2** vs 1: time per epoch ")  # the answer: time, memory, then accuracy
    assert f"; final test accuracy {100 * statistics.mean(pairs):+.2f} pp, 2 of 4" in line
    assert (
        "2 of 4 pairs (2 lost: workers=2 diverged in 1; workers=2 pending in 1): no verdict (fewer than 3 pairs)"
        in line
    )
    line = next(line for line in text.splitlines() if line.startswith("- **batch_size=128**"))
    assert line.startswith("- **batch_size=128** vs 64: time per epoch ") and line.endswith(
        f"; final test accuracy {100 * (ok[4][-1]['test_acc'] - ok[0][-1]['test_acc']):+.2f} "
        "pp, 1 of 4 pairs (3 lost: batch_size=128 failed in 1; batch_size=128 diverged in 1; batch_size=128 pending "
        "in 1): no verdict (fewer than 3 pairs); seeds that would resolve it: unknown (one pair gives no spread); "
        "test-set noise bounded: no per-image log."
    )
    assert "Seed noise of final test accuracy: " in text and "over 2 configurations with ≥ 2 included seeds" in text


def test_plots_are_valid_png_and_linked(readme):
    text = readme.read_text()
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert set(links) == {
        "curves_loss.png",
        "curves_test_acc.png",
        "batch_size_cost.png",
        "batch_size_accuracy.png",
        "workers_cost.png",
        "workers_accuracy.png",
        "accuracy_vs_time.png",
        "speedup.png",
        "train_test_accuracy.png",
    }
    for link in links:
        path = readme.parent / link
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_the_text_the_report_tests_read_is_the_readme_less_its_figures(run, readme):
    """helpers.report_text, read by the tests of the report's text instead of README.md (which costs its plots)."""
    blocks = readme.read_text(encoding="utf-8").rstrip("\n").split("\n\n")
    figures = [block for block in blocks if block.startswith("![")]
    assert len(figures) == 9
    text = report_text(build_report(run[0]))
    assert text.rstrip("\n").split("\n\n") == [block for block in blocks if block not in figures]


def test_same_logs_give_byte_identical_files(run, readme, tmp_path):
    again = write_report(run[0], tmp_path / "again")
    assert again.read_bytes() == readme.read_bytes()
    pngs = sorted(p.name for p in readme.parent.glob("*.png"))
    assert pngs == sorted(p.name for p in again.parent.glob("*.png")) and len(pngs) == 9
    for name in pngs:
        assert (again.parent / name).read_bytes() == (readme.parent / name).read_bytes(), name


def test_csv_export(run, tmp_path):
    run_dir, written = run
    main = write_report(run_dir, tmp_path, fmt="csv")
    assert main == tmp_path / "trials.csv"
    trials = pd.read_csv(main)
    assert len(trials) == 8 and trials["status"].tolist()[FAILED] == "failed"
    group = pd.read_csv(tmp_path / "factor_batch_size.csv").set_index("batch_size")
    ok, swept = finished(written), combos()
    finals = [ok[i][-1]["test_acc"] for i in ok if swept[i]["batch_size"] == 64]
    assert group.loc[64, "final_test_acc_mean"] == pytest.approx(statistics.mean(finals))
    assert group.loc[64, "final_test_acc_std"] == pytest.approx(statistics.stdev(finals))
    assert math.isnan(group.loc[128, "final_test_acc_std"])
    assert pd.read_csv(tmp_path / "factor_workers.csv")["n"].tolist() == [3, 2]
    assert len(pd.read_csv(tmp_path / "configurations.csv")) == 4
    assert len(pd.read_csv(tmp_path / "epochs.csv")) == sum(len(e) for e in written.values())


def test_json_export(run, tmp_path):
    run_dir, written = run
    main = write_report(run_dir, tmp_path, fmt="json", baseline={"workers": 2})
    data = json.loads(main.read_text())
    assert main.name == "report.json"
    assert data["sweep"]["name"] == "bs-workers" and data["sweep"]["status_counts"]["diverged"] == 1
    assert len(data["trials"]) == 8 and data["trials"][OVERFIT]["overfit_epoch"] == 3
    assert data["factors"]["workers"]["baseline"] == 2
    rows = {row["workers"]: row for row in data["factors"]["workers"]["rows"]}
    ok, swept = finished(written), combos()
    finals = {w: [ok[i][-1]["test_acc"] for i in ok if swept[i]["workers"] == w] for w in (1, 2)}
    assert rows[1]["final_test_acc_mean"] == pytest.approx(statistics.mean(finals[1]))
    assert rows[1]["final_test_acc_std"] == pytest.approx(statistics.stdev(finals[1]))
    assert rows[1]["final_test_acc_delta"] == pytest.approx(statistics.mean(finals[1]) - statistics.mean(finals[2]))
    assert rows[2]["is_baseline"] is True
    rows128 = {row["batch_size"]: row for row in data["factors"]["batch_size"]["rows"]}
    assert rows128[128]["final_test_acc_std"] is None  # one trial: no std
    assert data["sweep"]["fixed_settings"] == {
        "model": "simple_cnn",
        "optimizer": "momentum",
        "epochs": 4,
        "accum_steps": 2,
        "amp": "off",
        "backend": "nccl",
        "strategy": "ddp",
        "train_eval_size": 5000,
    }
    assert data["sweep"]["trials"] == 8 and "runs" not in data["sweep"]
    assert data["verdicts"] == {"margin": 0.01, "comparisons": 0, "test_images": 10000}


def test_default_out_dir_is_beside_the_run(run, tmp_path, monkeypatch):
    import shutil

    run_dir = shutil.copytree(run[0], tmp_path / "runs" / "bs-workers")
    monkeypatch.chdir(tmp_path)
    path = write_report(run_dir, fmt="json")
    assert path == run_dir / "report" / "report.json" and path.is_file() and not Path("reports").exists()


def test_bad_inputs_raise_config_error(run, tmp_path):
    empty = tmp_path / "empty"
    write_sweep(empty, [trial_name(0)])
    with pytest.raises(ConfigError, match="no trials in .*empty"):
        write_report(empty, tmp_path / "out")
    with pytest.raises(ConfigError, match="no run folder at"):
        write_report(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ConfigError, match="unknown report format 'pdf'; allowed: md, csv, json"):
        write_report(run[0], tmp_path / "out", fmt="pdf")


def test_single_cpu_run_without_grid(tmp_path):
    """A `cifar-ray train` run: no grid, one trial on CPU, no step-time breakdown."""
    run_dir = tmp_path / "single"
    write_sweep(run_dir, ["t"], grid={}, repeats=1, cluster={"cpus": 8.0, "gpus": 0.0, "nodes": 1})
    swept = {"batch_size": 64, "workers": 1, "seed": 0}
    epochs = [{k: v for k, v in row.items() if not k.startswith("time_")} for row in healthy_epochs(0, swept)]
    folder = run_dir / "t"
    write_trial(run_dir, 0, swept, "finished", epochs, gpus=False)
    (run_dir / trial_name(0)).rename(folder)
    text = report_text(build_report(run_dir))
    assert "CPU only: Test CPU, 16 cores, 8 CPUs in the Ray cluster on 1 node" in text
    assert "One configuration" in text and "Step-time" not in text and "## Effect of" not in text
    with pytest.raises(ConfigError, match="swept keys: none"):
        write_report(run_dir, tmp_path / "out", baseline={"batch_size": 64})


def test_markdown_table_escapes_pipes():
    table = markdown_table(["a", "b"], [["x|y", 1]], "lr")
    assert table.splitlines() == ["| a | b |", "|---|---:|", "| x\\|y | 1 |"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=20))
def test_stats_match_statistics_module(values):
    mean, std = sample_stats(pd.Series(values, dtype=float))
    assert mean == pytest.approx(statistics.mean(values), rel=1e-9, abs=1e-6)
    if len(values) > 1:
        assert std == pytest.approx(statistics.stdev(values), rel=1e-6, abs=1e-6)
    else:
        assert math.isnan(std)


def test_no_finished_trial_still_reports(tmp_path):
    run_dir = tmp_path / "allfail"
    write_sweep(run_dir, [trial_name(0), trial_name(1)], grid={"workers": [1, 2]}, repeats=1)
    for i, workers in enumerate([1, 2]):
        swept = {"batch_size": 64, "workers": workers, "seed": 0}
        write_trial(run_dir, i, swept, "oom", healthy_epochs(i, swept, n=1), error="CUDA out of memory")
    report = build_report(run_dir)
    text = export(report, tmp_path / "out").read_text(encoding="utf-8")
    assert "No trial finished with every epoch logged: there is nothing to compare yet." in text
    assert "ran out of memory after 1 of 4 epochs — `CUDA out of memory`" in text
    assert report.groups["workers"]["n"].tolist() == [0, 0]
    data = json.loads(export(report, tmp_path / "out", fmt="json").read_text(encoding="utf-8"))
    assert data["factors"]["workers"]["rows"][0]["final_test_acc_mean"] is None


def test_float_and_string_grid_with_cli_parsed_baseline(tmp_path):
    from cifar_ray.core.strict_yaml import parse_value

    grid = {"lr": [0.1, 0.01], "amp": ["off", "bf16"]}
    run_dir = tmp_path / "lr-amp"
    names = [trial_name(i) for i in range(4)]
    write_sweep(run_dir, names, grid=grid, repeats=1, finished_at=None, wall_time_s=None)
    for i, (lr, amp) in enumerate(itertools.product(*grid.values())):
        swept = {"batch_size": 64, "workers": 1, "seed": 0}
        status, epochs = (
            ("running", healthy_epochs(i, swept, n=2)) if i == 3 else ("finished", healthy_epochs(i, swept))
        )
        write_trial(run_dir, i, {"lr": lr, "amp": amp} | swept, status, epochs)
    report = build_report(run_dir, baseline={"lr": parse_value("0.01"), "amp": parse_value("bf16")})
    assert report.baseline == {"lr": 0.01, "amp": "bf16"}
    assert report.groups["amp"]["n"].tolist() == [2, 1]  # the running trial is not aggregated
    text = report_text(build_report(run_dir, baseline={"lr": 0.01}))
    assert "| 0.01 (baseline) |" in text and "still running: 2 of 4 epochs so far" in text
    assert "not finished" in text
    with pytest.raises(ConfigError, match="allowed: off, bf16"):
        build_report(run_dir, baseline={"amp": parse_value("fp16")})


def test_time_per_epoch_leaves_out_the_first_epochs_warm_up():
    """A slot's first trial pays the warm-up in its first epoch: time/epoch is the same as a later trial's."""
    first_in_slot = pd.DataFrame({"epoch_time_s": [9.0, 2.0, 2.2, 1.9]})
    later_in_slot = pd.DataFrame({"epoch_time_s": [2.1, 2.0, 2.2, 1.9]})
    assert time_per_epoch(first_in_slot) == time_per_epoch(later_in_slot) == 2.0
    assert time_per_epoch(pd.DataFrame({"epoch_time_s": [9.0]})) == 9.0  # one epoch: nothing else to take


def test_one_trial_of_one_epoch_is_said_in_the_singular(tmp_path):
    """ "1 epochs each", "All 1 trials finished": a sweep's smallest run read like a typo."""
    from cifar_ray.report.document import to_markdown
    from cifar_ray.report.header import hardware, measured_text
    from cifar_ray.report.sections import excluded_section, findings_section

    swept = {"batch_size": 64, "workers": 1, "seed": 0}
    write_sweep(tmp_path / "one", [trial_name(0)], grid={}, repeats=1, host={"cpu_model": "C", "cpu_count": 1})
    write_trial(tmp_path / "one", 0, swept, "finished", healthy_epochs(0, swept, n=1), gpus=False, planned=1)
    report = build_report(tmp_path / "one")
    assert "1 trial (1 finished, " in measured_text(report) and ", 1 epoch each on " in measured_text(report)
    assert hardware(report.run).startswith("CPU only: C, 1 core, ")
    text = to_markdown(findings_section(report, {}))
    assert "The trial finished with every epoch logged and enters the aggregates." in text

    write_sweep(tmp_path / "two", [trial_name(0), trial_name(1)], grid={"seed": [0, 1]}, repeats=1)
    write_trial(tmp_path / "two", 0, swept, "finished", healthy_epochs(0, swept, n=1), gpus=False, planned=1)
    write_trial(tmp_path / "two", 1, swept | {"seed": 1}, "failed", [], error="boom", gpus=False, planned=1)
    assert "failed after 0 of 1 epoch — `boom`" in to_markdown(excluded_section(build_report(tmp_path / "two"), {}))
