"""The roofline finding (report/roofline.py) on a hand-made run: MFU per factor value, the bound of each from the
step-time breakdown, and what a larger batch can still gain."""

from __future__ import annotations

import pytest
from helpers import factorial_epochs, trial_name, write_sweep, write_trial

from cifar_ray.report import roofline
from cifar_ray.report.build import build_report
from cifar_ray.report.document import Figure, Table

PEAK = "GEMM probe: 1024² fp32 on cpu, 1 thread"
# (batch_size, seed) -> status, mfu, seconds per epoch in compute, data, optimizer
TRIALS = {
    (64, 0): ("finished", 0.30, 6.0, 1.0, 3.0),  # compute-bound; per-step share 30 %: a larger batch gains <= 1/0.7
    (64, 1): ("finished", 0.40, 6.0, 1.0, 3.0),
    (256, 0): ("finished", 0.50, 4.0, 5.0, 1.0),  # data-bound; per-step share 10 %: <= 1/0.9
    (256, 1): ("failed", 0.90, 9.0, 0.1, 0.1),  # not finished: left out
}


def make_run(run_dir):
    grid = {"batch_size": [64, 256], "seed": [0, 1]}
    write_sweep(run_dir, [trial_name(i) for i in range(len(TRIALS))], grid=grid, name="roofline")
    for i, ((batch, seed), (status, mfu, compute, data, optimizer)) in enumerate(TRIALS.items()):
        epochs = [
            row
            | {
                "flops_per_s": mfu * 1e11,
                "mfu": mfu,
                "peak_flops_per_s": 1e11,
                "peak_source": PEAK,
                "time_compute_s": compute,
                "time_data_s": data,
                "time_optimizer_s": optimizer,
                "time_allreduce_s": 0.0,
                "time_eval_s": 50.0,  # evaluation is no training phase: it bounds nothing
            }
            for row in factorial_epochs(0.7, 0.9, 12.0)
        ]
        write_trial(run_dir, i, {"batch_size": batch, "workers": 1, "seed": seed}, status, epochs, gpus=False)
    return run_dir


def test_mfu_and_bound_per_factor_value(tmp_path):
    data = roofline.roofline_data(build_report(make_run(tmp_path / "run")))
    small, large = data.factors["batch_size"]
    assert (small.value, small.n, large.value, large.n) == (64, 2, 256, 1)
    assert small.mfu == pytest.approx(0.35) and large.mfu == pytest.approx(0.5)
    assert small.flops_per_s == pytest.approx(0.35e11)
    assert small.bound.phase == "compute" and small.bound.shares["optimizer"] == pytest.approx(0.3)
    assert small.bound.batch_gain == pytest.approx(1 / 0.7)
    assert large.bound.phase == "data" and large.bound.batch_gain == pytest.approx(1 / 0.9)
    assert data.largest_batch["batch_size"] == 256 and data.peak_sources == [PEAK]


def test_the_finding_answers_why_a_larger_batch_stops_helping(tmp_path):
    report = build_report(make_run(tmp_path / "run"))
    text = roofline.finding(roofline.roofline_data(report), report)
    assert "**Compute-bound** in 2 of 3 finished trials, at 30 %–40 % of the peak" in text
    assert "bound by data in 1" in text and PEAK in text
    assert "take 10 % of the step: a still larger batch gains at most 1.11×" in text
    assert "MFU went 35 % → 50 %" in text


def test_blocks_table_and_plot(tmp_path):
    report = build_report(make_run(tmp_path / "run"))
    blocks = roofline.roofline_blocks(report)
    table = next(b for b in blocks if isinstance(b, Table))
    assert table.name == "roofline-batch_size"
    assert table.rows == (
        ("64", "2", "35.00", "35 %", "compute", "1.43×"),
        ("256", "1", "50.00", "50 %", "data", "1.11×"),
    )
    assert any(isinstance(b, Figure) and b.file == roofline.PLOT_FILE for b in blocks)
    roofline.draw_roofline(roofline.roofline_data(report), tmp_path / roofline.PLOT_FILE)
    assert (tmp_path / roofline.PLOT_FILE).read_bytes().startswith(b"\x89PNG")


def test_a_run_without_mfu_gets_no_section(tmp_path):
    run_dir = tmp_path / "old"
    write_sweep(run_dir, [trial_name(0)], grid={"batch_size": [64]}, name="old")
    write_trial(run_dir, 0, {"batch_size": 64, "workers": 1}, "finished", factorial_epochs(0.7, 0.9, 12.0), gpus=False)
    assert roofline.roofline_blocks(build_report(run_dir)) == []


def test_an_estimated_allreduce_wait_counts_as_communication():
    """DDP on CUDA logs the all-reduce wait as an estimate (time_allreduce_estimate_s): it bounds as a measured one."""
    times = {"time_compute_s": 2.0, "time_data_s": 1.0, "time_optimizer_s": 1.0, "time_allreduce_estimate_s": 4.0}
    estimated = roofline.bound(times, 0.3)
    assert estimated.phase == "communication" and estimated.shares["communication"] == 0.5
    assert estimated.batch_gain == pytest.approx(1 / (1 - 5 / 8))  # the optimizer step and the all-reduce per step
    measured = roofline.bound({**times, "time_allreduce_s": 4.0, "time_allreduce_estimate_s": float("nan")}, 0.3)
    assert measured == estimated
