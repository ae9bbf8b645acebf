"""What the report may conclude (report/verdicts.py), on hand-made run folders written as training writes them:
intervals floored by the test set, no verdict below three pairs, equivalence within a margin, Holm's correction,
incomplete trials left out, and the seeds that would settle an open comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import (
    FACTORIAL_EPOCHS,
    factorial_epochs,
    make_factorial,
    ranked_correct,
    report_text,
    trial_name,
    write_correct,
    write_sweep,
    write_trial,
)

from cifar_ray.cli import main
from cifar_ray.report import build_report
from cifar_ray.report.judge import judge_differences as judge
from cifar_ray.report.verdicts import holm, p_differs, p_equivalent, pairs_needed


def paired_run(run_dir: Path, accuracy: dict[tuple[int, int], float], test_subset: int = 0, logged=None) -> Path:
    """workers 1 vs 2 over seeds: `accuracy` maps (workers, seed) to the final test accuracy; `logged` maps
    (workers, seed) to the epochs a trial marked finished logged (all of them by default). Each trial logs which
    test images it got right (ranked_correct: the pairs disagree on the fewest images their accuracies allow)."""
    combos = [{"workers": w, "seed": s} for w, s in accuracy]
    write_sweep(
        run_dir,
        [trial_name(i) for i in range(len(combos))],
        grid={"workers": [1, 2]},
        repeats=len({s for _, s in accuracy}),
        name="paired",
    )
    for i, swept in enumerate(combos):
        key = (swept["workers"], swept["seed"])
        epochs = factorial_epochs(accuracy[key], 0.5, 10.0 / swept["workers"])[: (logged or {}).get(key)]
        write_trial(run_dir, i, swept, "finished", epochs, gpus=False, planned=FACTORIAL_EPOCHS)
        write_correct(run_dir, i, ranked_correct(accuracy[key], test_subset or 10_000), len(epochs))
        if test_subset:
            meta_path = run_dir / trial_name(i) / "trial.json"
            meta = json.loads(meta_path.read_text())
            meta["config"] |= {"dataset": "synthetic", "test_subset": test_subset}
            meta_path.write_text(json.dumps(meta))
    return run_dir


def workers_effect(run_dir: Path, **options) -> pd.Series:
    return build_report(run_dir, **options).effects["workers"]["final_test_acc"].iloc[0]


def findings_line(text: str, start: str) -> str:
    findings = text.split("## Findings")[1].split("\n## ")[0]
    return next(line for line in findings.splitlines() if line.startswith(start))


def test_equal_differences_on_a_small_test_set_are_not_a_zero_width_interval(tmp_path):
    """Three pairs that all differ on the same one image of 500 (+0.2 pp): the spread is 0, but one image is what
    the draw of 500 test images can move (its test-set part: var over images of the per-image difference / 500,
    0.2 pp), so the interval stays 1.7 pp wide: no difference is claimed, and within ±1 pp the two are equivalent."""
    run_dir = paired_run(
        tmp_path / "run", {(w, s): 0.800 + 0.002 * (w == 2) for w in (1, 2) for s in (0, 1, 2)}, test_subset=500
    )
    row = workers_effect(run_dir)
    assert row["std_diff"] == pytest.approx(0.0, abs=1e-12) and row["mean_diff"] == pytest.approx(0.002)
    assert row["testset_var"] == pytest.approx((1 / 500) / 500) and row["se"] == pytest.approx(0.002)
    assert row["ci_high"] - row["ci_low"] > 0.015
    assert row["verdict"] == "equivalent"
    text = report_text(build_report(run_dir))
    line = findings_line(text, "- **workers=2**")
    assert "3 of 3 pairs: equivalent within ±1 pp; test-set noise measured per image." in line
    assert "tested on 500 images" in text and "(n = 500 here" in text


def test_two_pairs_give_no_verdict_however_clear(tmp_path):
    run_dir = paired_run(tmp_path / "run", {(w, s): 0.70 + 0.10 * (w == 2) + 0.001 * s for w in (1, 2) for s in (0, 1)})
    row = workers_effect(run_dir)
    assert row["n_pairs"] == 2 and row["ci_low"] > 0  # the interval alone would call it
    assert row["verdict"] == "no verdict" and math.isnan(row["p_differs"])
    text = report_text(build_report(run_dir))
    # Its 95 % CI excludes 0: the verdict says why that is no verdict (item 5 of issue 35).
    no_verdict = "2 of 2 pairs: no verdict (fewer than 3 pairs: its CI excludes 0, but 1 degree of freedom is too few"
    line = findings_line(text, "- **workers=2**")
    assert no_verdict + " to judge by); about 1 more seed per grid point would resolve it" in line
    assert "`cifar-ray sweep FILE --resume --repeats 3`" in findings_line(text, "- **workers=2**")


def test_no_effect_is_equivalent_within_the_margin_the_user_sets(tmp_path, capsys):
    run_dir = tmp_path / "factorial"
    make_factorial(run_dir)
    assert build_report(run_dir).effects["amp"]["final_test_acc"].iloc[0]["verdict"] == "equivalent"
    narrow = build_report(run_dir, margin_pp=0.05).effects["amp"]["final_test_acc"].iloc[0]
    assert narrow["verdict"] == "not conclusive"  # ±0.05 pp is finer than 10000 test images resolve
    out = tmp_path / "out"
    # JSON: the findings README.md lists, without drawing its plots
    assert main(["report", str(run_dir), "--out", str(out), "--margin", "2", "--format", "json"]) == 0
    found = json.loads((out / "report.json").read_text(encoding="utf-8"))["findings"]
    assert next(line for line in found if line.startswith("**amp=bf16**")).endswith(
        "12 of 12 pairs: equivalent within ±2 pp; test-set noise measured per image."
    )
    capsys.readouterr()
    refused = tmp_path / "refused"
    assert main(["report", str(run_dir), "--out", str(refused), "--margin", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "cifar-ray: error: --margin 0: the equivalence margin is percentage points above 0, below 100\n"
    assert not refused.exists()


def test_tests_and_holm():
    assert p_differs(0.01, 0.005, 10) == pytest.approx(0.0734, abs=1e-3)  # t = 2, 10 df
    assert p_equivalent(0.0, 0.005, 10, 0.01) == pytest.approx(0.0734 / 2, abs=1e-3)
    assert p_equivalent(0.02, 0.005, 10, 0.01) > 0.5
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])


def test_holm_turns_two_marginal_effects_into_open_ones():
    """Two comparisons at p = 0.03 each: either alone clears 5 %, together neither does after Holm."""
    t = 2.7  # with 5 pairs (4 df): two-sided p about 0.054; with 8 pairs (7 df) about 0.031
    spread = {"n_pairs": 8, "n_planned": 8, "n_open": 0, "se": 0.001, "std_diff": 0.001 * 8**0.5, "testset_var": 0.0}
    rows = [{"workers": 2, "mean_diff": t * 0.001} | spread, {"workers": 4, "mean_diff": -t * 0.001} | spread]
    (one,) = judge([pd.DataFrame(rows[:1])], margin=0.0001, seeds=8)
    assert one.loc[0, "p_differs"] < 0.05 and one.loc[0, "verdict"] == "differs"
    (both,) = judge([pd.DataFrame(rows)], margin=0.0001, seeds=8)
    assert (both["p_differs"] < 0.05).all() and (both["p_differs_holm"] > 0.05).all()
    assert both["verdict"].tolist() == ["not conclusive", "not conclusive"]
    assert (both["more_seeds"] >= 1).all()


def test_pairs_needed_is_the_first_count_that_resolves():
    mean, var_pair, margin, alpha = 0.01, 0.02**2, 0.005, 0.05
    needed = pairs_needed(mean, var_pair, margin, alpha)
    assert 10 < needed < 100

    def resolved(n: int) -> bool:
        se = math.sqrt(var_pair / n)
        return p_differs(mean, se, n - 1) < alpha or p_equivalent(mean, se, n - 1, margin) < alpha

    assert resolved(needed) and not resolved(needed - 1)
    assert pairs_needed(0.0, 1.0, 0.001, alpha) is None  # beyond MAX_PAIRS


def test_a_finished_trial_with_missing_epochs_is_excluded_as_incomplete(tmp_path):
    """Seed 2 of workers=2 is marked finished but logged 1 of 3 epochs (its accuracy then was far lower)."""
    accuracy = {(w, s): 0.80 + 0.01 * (w == 2) + 0.001 * s for w in (1, 2) for s in (0, 1, 2, 3)}
    run_dir = paired_run(tmp_path / "run", accuracy, logged={(2, 2): 1})
    report = build_report(run_dir)
    trial = report.trials.set_index(["workers", "seed"]).loc[(2, 2)]
    assert (trial["status"], trial["outcome"], trial["epochs_done"]) == ("finished", "incomplete", 1)
    row = report.effects["workers"]["final_test_acc"].iloc[0]
    assert (row["n_pairs"], row["n_planned"], row["lost"]) == (3, 4, "workers=2 incomplete in 1")
    assert row["mean_diff"] == pytest.approx(0.01)
    assert report.groups["workers"]["n"].tolist() == [4, 3]
    text = report_text(report)
    excluded = text.split("## Excluded trials")[1].split("\n## ")[0]
    assert f"`{trial['trial']}` (workers=2, seed=2): incomplete: marked finished with 1 of 3 epochs logged." in excluded
    assert "3 of 4 pairs (1 lost: workers=2 incomplete in 1)" in findings_line(text, "- **workers=2**")
    assert "| Measured | 8 trials (7 finished, 0 failed, 0 diverged, 0 oom, 1 incomplete)" in text
