"""The report's one judge (report/judge.py) on hand-made run folders whose truth is known, tested on its `Effect`
records (report/effects.py), not on sentences: interactions on time as on accuracy, a pattern in one cell of two other
factors, a value that failed in every seed, a change too small to matter, and more seeds that keep a verdict. Then the
per-cell procedure's error rate by Monte Carlo, and the JSON records' exact fields."""

from __future__ import annotations

import itertools
import json
import random
import typing
from pathlib import Path

import numpy
import pandas as pd
import pytest
from helpers import cost_run, grid_run

from cifar_ray.report import build_report
from cifar_ray.report.effects import VERDICTS, Effect, Verdict
from cifar_ray.report.export import export_json
from cifar_ray.report.findings import NOISE_UNKNOWN, NOISE_UNKNOWN_AGAIN, findings
from cifar_ray.report.interactions import strata_test
from cifar_ray.report.judge import judge_differences
from cifar_ray.report.metrics import COMPARED
from cifar_ray.report.verdicts import ALPHA


def effect(report, metric: str, factor: str, cell: dict | None = None) -> Effect:
    (found,) = [e for e in report.records if (e.metric, e.factor, e.cell) == (metric, factor, cell or {})]
    return found


def timed(times: dict, seeds: int, grid: dict, jitter: float = 0.01) -> list[dict]:
    """One trial per grid point and seed, five epochs (the first a slow warm-up) around `times[point]` seconds."""
    rng = random.Random(5)
    trials = []
    for point in itertools.product(*grid.values()):
        for seed in range(seeds):
            t = times[point]
            warm = [t * (1 + rng.uniform(-jitter, jitter)) for _ in range(4)]
            trials.append({"swept": dict(zip(grid, point)) | {"seed": seed}, "times": [3 * t, *warm]})
    return trials


def test_a_second_worker_slower_at_batch_32_and_faster_at_512_depends_on_the_batch_size(tmp_path):
    """Truth: the second worker is 1.4x slower at batch 32 (all-reduce bound) and 1.74x faster at batch 512, 3 seeds.
    Pooled that is a 1.1x that says nothing; the judge must test the interaction on time, call the pooled effect
    "depends" on batch_size, and give each batch size its own verdict."""
    grid = {"workers": [1, 2], "batch_size": [32, 512]}
    times = {(1, 32): 10.0, (2, 32): 14.0, (1, 512): 10.0, (2, 512): 10.0 / 1.74}
    report = build_report(cost_run(tmp_path / "run", timed(times, 3, grid), grid))
    pooled = effect(report, "time_per_epoch", "workers")
    assert pooled.verdict == "depends" and pooled.depends_on == ("batch_size",)
    small, large = (effect(report, "time_per_epoch", "workers", {"batch_size": b}) for b in (32, 512))
    assert (small.verdict, large.verdict) == ("differs", "differs")
    assert small.estimate == pytest.approx(1.4, rel=0.02) and large.estimate == pytest.approx(1 / 1.74, rel=0.02)
    assert small.interval.low > 1 > large.interval.high and "Holm" in small.interval.label
    assert small.pairs == large.pairs == 3


def test_a_pattern_in_one_cell_of_two_other_factors_is_shown_in_that_cell(tmp_path):
    """Truth: adam +1.5 pp in three cells of batch_size x amp and -3.0 pp in the fourth (512, bf16), 4 seeds. A split
    by one factor at a time averages the -3 pp cell with a +1.5 pp one; the judge must split by the cells as well,
    call adam's pooled effect "depends", and report the -3 pp in its own cell."""
    grid = {"optimizer": ["momentum", "adam"], "batch_size": [64, 512], "amp": ["off", "bf16"]}

    def accuracy(swept: dict) -> float:
        if swept["optimizer"] != "adam":
            return 0.80
        return 0.80 + (-0.03 if (swept["batch_size"], swept["amp"]) == (512, "bf16") else 0.015)

    report = build_report(grid_run(tmp_path / "run", 4, accuracy, grid))
    tests = report.interactions.tests
    joint = tests[(tests["metric"] == "accuracy") & (tests["factor"] == "optimizer")]
    assert ("batch_size", "amp") in set(joint["by"])
    assert effect(report, "accuracy", "optimizer").verdict == "depends"
    worst = effect(report, "accuracy", "optimizer", {"batch_size": 512, "amp": "bf16"})
    assert worst.estimate == pytest.approx(-3.0, abs=0.3) and worst.verdict == "differs" and worst.pairs == 4
    others = [effect(report, "accuracy", "optimizer", {"batch_size": b, "amp": a}) for b, a in [(64, "off")]]
    assert others[0].estimate == pytest.approx(1.5, abs=0.6)  # 4 seeds of 0.2 pp noise each side


def test_a_value_that_diverged_in_every_seed_is_its_factors_answer(tmp_path):
    """Truth: lr=2.0 diverged in 3 of 3 seeds. Its comparisons are "failed", on every metric, with the count as the
    reason, and the findings open with it, not with "one configuration"."""
    grid = {"lr": [0.1, 2.0]}
    trials = [
        {"swept": {"lr": lr, "seed": seed}, "times": [5.0, 4.0, 4.1, 3.9], "status": "diverged" if lr == 2.0 else None}
        for lr in grid["lr"]
        for seed in range(3)
    ]
    for trial in trials:
        trial["status"] = trial["status"] or "finished"
    report = build_report(cost_run(tmp_path / "run", trials, grid))
    for metric in (metric for metric in COMPARED if not metric.needs_target):  # no target: no time to it
        failed = effect(report, metric.name, "lr")
        assert (failed.verdict, failed.reason, failed.pairs) == ("failed", "diverged in 3 of 3", 0)
    assert "diverged in 3 of 3" in findings(report)[0]


def test_a_time_change_inside_the_five_percent_band_is_no_practical_difference(tmp_path):
    """Truth: 5.00 vs 5.05 s per epoch, tight epochs, 3 seeds: the interval excludes 1 (a real 1.01x) but lies inside
    the ±5 % band the report calls no difference: "no practical difference", not "slower"."""
    grid = {"workers": [1, 2]}
    report = build_report(cost_run(tmp_path / "run", timed({(1,): 5.0, (2,): 5.05}, 3, grid, 0.001), grid))
    time = effect(report, "time_per_epoch", "workers")
    assert time.verdict == "no practical difference" and time.estimate == pytest.approx(1.01, abs=0.002)
    assert 1 < time.interval.low and time.interval.high < 1.05 and "5%" in time.reason


@pytest.mark.parametrize("seeds", [1, 2])
def test_more_seeds_never_take_a_time_verdict_away(tmp_path, seeds):
    """Truth: the second worker is 1.84x faster in every seed. One seed judges it on its epochs' noise; two seeds
    that agree must keep the verdict (their one degree of freedom combined with the epochs', not alone)."""
    grid = {"workers": [1, 2]}
    run_dir = cost_run(tmp_path / "run", timed({(1,): 10.0, (2,): 10.0 / 1.84}, seeds, grid), grid)
    time = effect(build_report(run_dir), "time_per_epoch", "workers")
    assert time.verdict == "differs" and time.estimate == pytest.approx(1 / 1.84, rel=0.02)
    assert time.interval.high < 1


def test_the_per_cell_family_keeps_its_error_rate_under_holm():
    """Monte Carlo of the per-cell procedure: 4 cells of 5 pairs each with no effect anywhere, judged as one Holm
    family (judge.judge_differences, as the judge judges a metric's cells): the chance that any cell is called
    "differs" stays at most ALPHA (800 families: the bound plus three standard errors). And the interaction test
    (interactions.strata_test) that decides whether cells are judged at all rejects equal cells at about ALPHA."""
    rng = numpy.random.default_rng(11)

    def cell(diffs: numpy.ndarray) -> pd.DataFrame:
        n = len(diffs)
        row = {"value": 1, "n_pairs": n, "n_planned": n, "n_open": 0, "lost": "", "mean_diff": diffs.mean()}
        row |= {"std_diff": diffs.std(ddof=1), "testset_var": 0.0, "se": diffs.std(ddof=1) / n**0.5}
        return pd.DataFrame([row])

    families, any_false, rejected = 800, 0, 0
    for _ in range(families):
        diffs = rng.normal(0.0, 1.0, size=(4, 5))
        frames = judge_differences([cell(d) for d in diffs], margin=0.01, seeds=5)
        any_false += any(frame.loc[0, "verdict"] == "differs" for frame in frames)
        strata = pd.DataFrame({"n_pairs": 5, "mean_diff": diffs.mean(axis=1), "std_diff": diffs.std(axis=1, ddof=1)})
        rejected += strata_test(strata.assign(testset_var=0.0))[3] < ALPHA
    bound = ALPHA + 3 * (ALPHA * (1 - ALPHA) / families) ** 0.5
    assert any_false / families <= bound
    assert abs(rejected / families - ALPHA) <= 3 * (ALPHA * (1 - ALPHA) / families) ** 0.5


def test_the_json_effects_hold_exactly_the_documented_fields_for_the_committed_quickstart(tmp_path):
    """`report --format json`'s effects for the quickstart's logs: accuracy, time and memory for both factors, each
    record with exactly the documented fields and a verdict from the documented set."""
    logs = Path(__file__).parent.parent / "reports" / "quickstart" / "logs"
    data = json.loads(export_json(build_report(logs), tmp_path).read_text())
    fields = ["metric", "factor", "value", "baseline", "cell", "pairs", "pairs_lost", "estimate", "unit", "interval"]
    fields += ["verdict", "reason"]
    assert all(list(record) == fields for record in data["effects"])
    pooled = {(r["metric"], r["factor"]) for r in data["effects"] if r["cell"] == {}}
    assert pooled == {(m.name, f) for m in COMPARED if not m.needs_target for f in ("workers", "optimizer")}
    assert {r["verdict"] for r in data["effects"]} <= set(VERDICTS)
    assert {r["unit"] for r in data["effects"]} == {"pp", "ratio"}


def test_the_verdict_literal_is_the_verdict_list():
    assert typing.get_args(Verdict) == VERDICTS


def test_damaged_and_missing_trial_files_are_named_not_a_traceback(tmp_path):
    """A run folder with one trial.json that is not JSON, one trial folder with metrics but no trial.json, and one
    trial planned with no folder: the report still builds from the rest, and names each with why."""
    grid = {"workers": [1, 2]}
    trials = timed({(1,): 10.0, (2,): 5.0}, 3, grid)
    run_dir = cost_run(tmp_path / "run", trials, grid, extra_planned=1)
    (run_dir / "trial_000" / "trial.json").write_text("{not json")
    (run_dir / "trial_001" / "trial.json").unlink()
    report = build_report(run_dir)
    assert report.missing["trial_000"].startswith("its trial.json is damaged: ")
    assert report.missing["trial_001"] == "its folder has no trial.json"
    assert report.missing["trial_006"] == "no folder in the run"
    assert effect(report, "time_per_epoch", "workers").pairs == 1  # seed 2's pair; seeds 0 and 1 lost their baseline
    missing = next(line for line in findings(report) if line.startswith("**Missing**"))
    assert all(name in missing for name in ("trial_000", "trial_001", "trial_006"))


def test_why_no_leader_is_named_is_said_once():
    """The quickstart ran each configuration once: the most accurate and the least memory are both unnamed for that
    one reason, said in the first of those lines and pointed back to in the next (it was said twice)."""
    logs = Path(__file__).parent.parent / "reports" / "quickstart" / "logs"
    lines = findings(build_report(logs))
    unnamed = [line for line in lines if ": none named: " in line]
    assert len(unnamed) == 2 and sum(NOISE_UNKNOWN in line for line in lines) == 1
    assert f"none named: {NOISE_UNKNOWN} (" in unnamed[0] and f"none named: {NOISE_UNKNOWN_AGAIN} (" in unnamed[1]
