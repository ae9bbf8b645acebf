"""The shared test set's noise in a paired accuracy effect (report/testset.py): hand-made run folders whose truth is
known, the arithmetic against references computed directly, the fallback bound's direction, and a Monte Carlo
check of the whole standard error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy
import pytest
from helpers import (
    FACTORIAL_EPOCHS,
    factorial_epochs,
    report_text,
    trial_name,
    write_correct,
    write_sweep,
    write_trial,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cifar_ray.core import runlog
from cifar_ray.core.errors import StorageError
from cifar_ray.report import build_report, testset
from cifar_ray.report.effects import DIFFERS
from cifar_ray.report.testset import BOUND, MEASURED, ImageScores, Scored


def shared_test_run(run_dir: Path, seeds: int, images: int, gained: int, churn: int, logged: bool = True) -> Path:
    """workers=1 (the baseline) vs workers=2 over `seeds` seeds on the same `images` test images. Every trial gets
    right the first 90 % of the images, except `churn` random ones per trial that it gets right or wrong by a coin
    (its seed's luck); workers=2 also gets right the `gained` images after those 90 %, the same ones in every seed.
    The truth: workers=2 is better by gained / images, on those images. With `logged`, each trial logs which images
    it got right, as training does."""
    rng = numpy.random.default_rng(images + seeds)
    combos = [(w, s) for w in (1, 2) for s in range(seeds)]
    write_sweep(run_dir, [trial_name(i) for i in range(len(combos))], grid={"workers": [1, 2]}, repeats=seeds)
    for i, (workers, seed) in enumerate(combos):
        correct = numpy.arange(images) < int(0.9 * images)
        if workers == 2:
            correct[int(0.9 * images) : int(0.9 * images) + gained] = True
        luck = rng.choice(images, churn, replace=False)
        correct[luck] = rng.random(churn) < 0.5
        epochs = factorial_epochs(float(correct.mean()), 0.5, 10.0 / workers)
        write_trial(run_dir, i, {"workers": workers, "seed": seed}, "finished", epochs, gpus=False)
        meta_path = run_dir / trial_name(i) / runlog.TRIAL_FILE
        meta = json.loads(meta_path.read_text())
        meta["config"] |= {"dataset": "synthetic", "test_subset": images, "epochs": FACTORIAL_EPOCHS}
        meta_path.write_text(json.dumps(meta))
        if logged:
            write_correct(run_dir, i, correct, FACTORIAL_EPOCHS)
    return run_dir


def accuracy_effect(run_dir: Path):
    return build_report(run_dir).effects["workers"]["final_test_acc"].iloc[0]


def test_many_seeds_call_a_small_consistent_effect_real(tmp_path):
    """20 seeds, 10,000 images, +0.6 pp on the same 60 images in every seed, the models disagreeing on about 1 %
    of the images besides: the per-image log shows a difference the test set cannot have made up, so the interval
    excludes 0, and the report says its test-set noise was measured."""
    run_dir = shared_test_run(tmp_path / "run", seeds=20, images=10_000, gained=60, churn=100)
    row = accuracy_effect(run_dir)
    assert row["mean_diff"] == pytest.approx(0.006, abs=0.0005) and row["n_pairs"] == 20
    assert row["testset_noise"] == MEASURED and row["ci_low"] > 0.003
    assert row["verdict"] == DIFFERS
    text = report_text(build_report(run_dir))
    assert "20 of 20 pairs: CI excludes 0; test-set noise measured per image." in text


def test_an_old_run_without_the_log_falls_back_to_a_bound_named_and_never_smaller(tmp_path):
    """The same trials as above, logged as older versions did (accuracies only): the report cannot see how
    little the models disagree, so it bounds the test-set part by what any disagreement could give, says so, and
    the bound is no smaller than what the per-image log measured; at 10,000 images it leaves +0.6 pp open."""
    new = accuracy_effect(shared_test_run(tmp_path / "new", seeds=20, images=10_000, gained=60, churn=100))
    run_dir = shared_test_run(tmp_path / "old", seeds=20, images=10_000, gained=60, churn=100, logged=False)
    report = build_report(run_dir)
    old = report.effects["workers"]["final_test_acc"].iloc[0]
    assert old["mean_diff"] == pytest.approx(new["mean_diff"]) and old["std_diff"] == pytest.approx(new["std_diff"])
    assert old["testset_noise"] == BOUND and old["testset_var"] >= new["testset_var"]
    trials = report.trials
    sd = {w: numpy.sqrt(p * (1 - p)) for w, p in trials.groupby("workers")["final_test_acc"]}
    assert old["testset_var"] == pytest.approx(float(numpy.mean(sd[2].to_numpy() + sd[1].to_numpy())) ** 2 / 9_999)
    assert old["ci_low"] < 0 < old["ci_high"] and old["verdict"] != DIFFERS
    text = report_text(report)
    assert "test-set noise bounded: no per-image log." in text


@pytest.mark.parametrize("seeds", [3, 40])
def test_on_200_images_one_and_a_half_points_is_not_called_however_many_seeds(tmp_path, seeds):
    """200 images, +1.5 pp: 3 images, the same 3 in every seed. Which 200 images were drawn could make that up, and
    more seeds do not draw other images: the test-set part stays at least that of 3 images in 200 (0.86 pp) with
    3 seeds or 40, and the interval holds 0 (the older floor, p (1 - p) / n per trial divided by the pairs, excluded
    it with 40: [+0.47, +2.40] pp)."""
    row = accuracy_effect(shared_test_run(tmp_path / "run", seeds=seeds, images=200, gained=3, churn=2))
    assert row["testset_noise"] == MEASURED
    assert row["testset_var"] >= (3 / 200) * (197 / 200) / 199
    assert row["ci_low"] < 0 < row["ci_high"] and row["verdict"] != DIFFERS
    assert math.isnan(row["more_seeds"])  # no number of seeds would settle it: none is promised


def test_a_record_of_another_epoch_is_not_used_and_a_damaged_one_is_an_error(tmp_path):
    """A test_correct.json from an epoch other than the last logged one is not the evaluation behind the final
    accuracy: the bound is used. One that does not parse is a read that failed: retried, then an error naming it."""
    run_dir = shared_test_run(tmp_path / "run", seeds=3, images=200, gained=3, churn=2)
    write_correct(run_dir, 0, numpy.ones(200, dtype=bool), FACTORIAL_EPOCHS - 1)
    assert accuracy_effect(run_dir)["testset_noise"] == BOUND
    damaged = run_dir / trial_name(1) / runlog.TEST_CORRECT_FILE
    damaged.write_text(json.dumps({"epoch": 3, "images": 200, "bits": "AAAA"}))  # 3 bytes for 200 images
    with pytest.raises(StorageError, match=f"cannot read {damaged} .*3 bytes for 200 images"):
        build_report(run_dir)


def test_the_record_round_trips_in_dataset_order(tmp_path):
    correct = numpy.random.default_rng(1).random(1001) < 0.7
    write_correct(tmp_path, 0, correct, 5)
    record = runlog.read_correct_images(tmp_path / trial_name(0))
    assert (record.epoch, record.images, len(record.bits)) == (5, 1001, 126)
    assert numpy.array_equal(testset.unpack(record), correct)
    assert runlog.read_correct_images(tmp_path / "absent") is None


def scored(*vectors) -> list[Scored]:
    return [
        Scored(float(numpy.mean(v)), len(v), ImageScores("synthetic", numpy.asarray(v, dtype=bool))) for v in vectors
    ]


def test_the_measured_part_by_hand():
    """Two pairs on 4 images; the second pair's value cell holds two trials (averaged). Per-image differences:
    pair 1: [0, 1, 0, 0]; pair 2: [1, 1, 1, 0.5] - [1, 0, 1, 1] = [0, 1, 0, -0.5]. Their mean over the pairs:
    [0, 1, 0, -0.25], mean 0.1875, sample variance (0.03515625 + 0.66015625 + 0.03515625 + 0.19140625) / 3 =
    0.307291..., over 4 images: 0.0768229..."""
    pairs = [
        (scored([1, 1, 0, 1]), scored([1, 0, 0, 1])),
        (scored([1, 1, 1, 1], [1, 1, 1, 0]), scored([1, 0, 1, 1])),
    ]
    value, how = testset.testset_var(pairs)
    assert how == MEASURED and value == pytest.approx(0.92187500 / 3 / 4)
    # A trial without the log, or one on other images, turns the comparison to the bound.
    assert testset.testset_var([pairs[0], (pairs[1][0], [Scored(0.75, 4, None)])])[1] == BOUND
    other = [Scored(0.75, 4, ImageScores("cifar10", numpy.array([1, 0, 1, 1], dtype=bool)))]
    assert testset.testset_var([pairs[0], (pairs[1][0], other)])[1] == BOUND


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(2, 60),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(-1.0, 1.0),
    st.integers(0, 2**32 - 1),
)
def test_the_bound_is_never_below_what_is_measured(pairs, images, p, q, tie, seed):
    """Whatever the models' disagreement (`tie` from the value's errors mirroring the baseline's to copying them),
    the accuracy-only bound holds the per-image measure on the same trials: Minkowski, in testset's docstring."""
    rng = numpy.random.default_rng(seed)
    made = []
    for _ in range(pairs):
        base = rng.random(images) < q
        value = rng.random(images) < p
        mix = rng.random(images) < abs(tie)
        value = numpy.where(mix, ~base if tie < 0 else base, value)
        made.append((scored(value), scored(base)))
    measured, how = testset.testset_var(made)
    assert how == MEASURED
    unlogged = [
        ([Scored(t.accuracy, t.images, None) for t in a], [Scored(t.accuracy, t.images, None) for t in b])
        for a, b in made
    ]
    bound, how = testset.testset_var(unlogged)
    assert how == BOUND and bound >= measured - 1e-12


def test_the_bound_is_reached_where_every_error_of_one_is_a_right_answer_of_the_other():
    value = numpy.arange(100) % 2 == 0
    pairs = [(scored(value), scored(~value))] * 3
    measured, _ = testset.testset_var(pairs)
    bound = testset.bound_var(pairs)
    assert measured == pytest.approx(bound) == pytest.approx(1 / 99)


def test_monte_carlo_the_standard_error_covers_what_old_floors_missed():
    """Images drawn from a population where 4 % of images favour A (A right with 0.9, B 0.1), 85 % are easy for
    both (0.97) and 11 % hard for both (0.5); each seed's training is a fresh coin per image. With 30 seeds on the
    same 1,000 images the effect's variance is mostly which images were drawn: sigma_mu^2 / n + E Var(e) / (k n).
    Over 400 draws of a test set and its 30 seeds: the measured part's mean is sigma_mu^2 / n + E Var(e) / (k n),
    as testset's docstring derives; the variance of the effect is that too; the interval from se^2 = s^2 / k +
    measured covers the truth at least 95 % of the time, and the old floor (s^2 + p(1 - p) / n summed over a
    pair) / k, which shrinks with k, covers it far less often."""
    rng = numpy.random.default_rng(11)
    draws, k, n = 400, 30, 1_000
    kinds = numpy.array([[0.9, 0.1], [0.97, 0.97], [0.5, 0.5]])
    share = numpy.array([0.04, 0.85, 0.11])
    p = kinds[:, 0] @ share - kinds[:, 1] @ share  # the true effect
    mu = kinds[:, 0] - kinds[:, 1]
    sigma_mu2 = share @ mu**2 - (share @ mu) ** 2
    var_e = share @ (kinds[:, 0] * (1 - kinds[:, 0]) + kinds[:, 1] * (1 - kinds[:, 1]))
    expected = sigma_mu2 / n + var_e / (k * n)
    t = 2.045  # t(0.975, 29)
    effects, measured, covered, covered_old = [], [], 0, 0
    for _ in range(draws):
        chances = kinds[rng.choice(3, n, p=share)]  # this test set's images
        a = rng.random((k, n)) < chances[:, 0]
        b = rng.random((k, n)) < chances[:, 1]
        diffs = a.astype(float) - b
        pair = diffs.mean(axis=1)
        effect, spread = pair.mean(), pair.var(ddof=1)
        part = testset.measured_var(diffs)
        se = math.sqrt(spread / k + part)
        pa, pb = a.mean(axis=1), b.mean(axis=1)
        se_old = math.sqrt((spread + numpy.mean(pa * (1 - pa) + pb * (1 - pb)) / n) / k)
        effects.append(effect)
        measured.append(part)
        covered += abs(effect - p) <= t * se
        covered_old += abs(effect - p) <= t * se_old
    assert numpy.mean(measured) == pytest.approx(expected, rel=0.05)
    assert numpy.var(effects, ddof=1) == pytest.approx(expected, rel=0.2)
    assert covered / draws >= 0.95
    assert covered_old / draws < 0.85


def test_most_accurate_counts_the_shared_test_set_however_many_seeds(tmp_path):
    """The 200-image, +1.5 pp run with 40 seeds: the seeds agree, but the same 3 images make the lead, and which
    200 images were drawn could make that up. "Most accurate" names no single configuration (the older floor,
    p (1 - p) / n divided by the seeds, named workers=2 alone); the line says which noise it used."""
    run_dir = shared_test_run(tmp_path / "run", seeds=40, images=200, gained=3, churn=2)
    text = report_text(build_report(run_dir))
    line = next(line for line in text.splitlines() if line.startswith("- **Most accurate**"))
    assert "within the seed and test-set noise of each other: workers=2" in line and "workers=1" in line, line
