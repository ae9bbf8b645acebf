"""Interactions between factors (report/interactions.py) on hand-made run folders whose truth is known: an effect that
flips sign across another factor's values is found and shown per stratum, never averaged into "equivalent"; an
effect that does not is not flagged; one seed per configuration cannot tell. The F distribution is checked against
printed tables."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
from helpers import grid_run

from cifar_ray.report import build_report
from cifar_ray.report.document import to_markdown
from cifar_ray.report.export import export_json
from cifar_ray.report.interactions import f_upper, strata_test
from cifar_ray.report.sections import document
from cifar_ray.report.stats import t_upper


def flipping(swept: dict) -> float:
    """The truth: adam +2 pp at batch 64, −2 pp at batch 512; batch size alone nothing."""
    if swept["optimizer"] != "adam":
        return 0.80
    return 0.80 + (0.02 if swept["batch_size"] == 64 else -0.02)


def additive(swept: dict) -> float:
    """The truth: adam +2 pp at either batch size; batch 512 −1 pp for either optimizer: no interaction."""
    return 0.80 + 0.02 * (swept["optimizer"] == "adam") - 0.01 * (swept["batch_size"] == 512)


def markdown(report) -> str:
    """README.md's text without its plots (drawing them takes most of a report's time)."""
    return to_markdown(document(report, {}))


def findings_of(text: str) -> str:
    return text.split("## Findings")[1].split("\n## ")[0]


def test_f_upper_matches_printed_tables():
    """Critical values of F from printed tables (upper 5 % and 1 % points), and F(1, d) = t(d)²."""
    for f, df1, df2, p in [
        (4.9646, 1, 10, 0.05),
        (4.1028, 2, 10, 0.05),
        (3.0984, 3, 20, 0.05),
        (19.296, 5, 2, 0.05),
        (161.45, 1, 1, 0.05),
        (4.0179, 4, 30, 0.01),
        (2.8233, 8, 60, 0.01),
    ]:
        assert f_upper(f, df1, df2) == pytest.approx(p, rel=2e-4), (f, df1, df2)
    for t, df in [(0.3, 3), (2.5, 7), (4.0, 15)]:
        assert f_upper(t * t, 1, df) == pytest.approx(2 * t_upper(t, df), rel=1e-9)
    assert (f_upper(0.0, 2, 5), f_upper(float("inf"), 2, 5)) == (1.0, 0.0)


def test_the_strata_test_is_one_way_anova_plus_the_test_set():
    """Three strata of 3 pairs, means 2, 5, 8 (pp), each with sd 1: between-strata mean square 3 x 18 / 2 = 27,
    within 1, so F = 27 on (2, 6) df; two strata: F = t² of the pooled two-sample t-test. The test set's part of se²
    (here 1/3 per stratum mean, as much as the spread's) halves the weights and F."""

    def strata(means, testset=0.0, n=(3, 3, 3)):
        return pd.DataFrame(
            {
                "n_pairs": n,
                "mean_diff": means,
                "std_diff": 1.0,
                "testset_var": testset,
                "se": [(1 / k + testset) ** 0.5 for k in n],
            }
        )

    df1, df2, f, p, _ = strata_test(strata([2.0, 5.0, 8.0]))
    assert (df1, df2, f) == (2, 6, pytest.approx(27.0)) and p == pytest.approx(f_upper(27.0, 2, 6))
    assert strata_test(strata([2.0, 5.0], n=(3, 3)))[2] == pytest.approx(9 / (2 / 3))
    assert strata_test(strata([2.0, 5.0, 8.0], testset=1 / 3))[2] == pytest.approx(13.5)
    one_short = strata([2.0, 5.0, 8.0], n=(3, 3, 1))  # a stratum with one pair shows its mean but is not tested
    assert strata_test(one_short)[:2] == (1, 4)
    assert math.isnan(strata_test(strata([2.0, 5.0, 8.0], n=(3, 1, 1)))[2])


def test_an_effect_that_flips_sign_is_an_interaction_not_equivalence(tmp_path):
    """adam +2 pp at batch 64, −2 pp at batch 512, 16 seeds, 0.2 pp seed noise: averaged over batch sizes adam's
    effect is 0 ± 0.4 pp, which reads "equivalent within ±1 pp" when the strata are pooled. The report must find the
    interaction (p far below 5 % after Holm), show +2 and −2 per batch size, and never call adam equivalent."""
    run_dir = grid_run(tmp_path / "run", 16, flipping)
    report = build_report(run_dir)
    tests = report.interactions.tests
    tests = tests[tests["metric"] == "accuracy"].set_index(["factor", "by"])
    assert tests.loc[("optimizer", ("batch_size",)), "result"] == "depends"
    assert tests.loc[("optimizer", ("batch_size",)), "p_holm"] < 1e-6
    strata = report.interactions.strata
    strata = strata[(strata["metric"] == "accuracy") & (strata["factor"] == "optimizer")]
    assert strata["n_pairs"].tolist() == [16, 16]
    assert strata["estimate"].tolist() == pytest.approx([2.0, -2.0], abs=0.2)
    assert (strata.iloc[0]["ci_low"] > 0) and (strata.iloc[1]["ci_high"] < 0)
    (pooled,) = [e for e in report.records if e.metric == "accuracy" and e.factor == "optimizer" and not e.cell]
    assert pooled.verdict == "depends" and pooled.depends_on == ("batch_size",)
    cells = [e for e in report.records if e.metric == "accuracy" and e.factor == "optimizer" and e.cell]
    assert [(e.cell, e.verdict) for e in cells] == [({"batch_size": 64}, "differs"), ({"batch_size": 512}, "differs")]
    assert cells[0].estimate == pytest.approx(2.0, abs=0.2) and cells[1].estimate == pytest.approx(-2.0, abs=0.2)
    text = markdown(report)
    findings = findings_of(text)
    assert "equivalent" not in findings
    adam = next(line for line in findings.splitlines() if line.startswith("- **optimizer=adam** vs momentum: "))
    assert "; final test accuracy -0.02 pp, 32 of 32 pairs: depends on batch_size" in adam
    about_two = r"(1\.9\d|2\.0\d) pp"
    assert re.search(
        rf"its effect on final test accuracy depends on batch_size: \+{about_two} at batch_size=64 \(16 pairs\), "
        rf"-{about_two} at batch_size=512 \(16 pairs\)",
        findings,
    )
    section = text.split("## Effects per cell")[1].split("\n## ")[0]
    assert re.search(rf"\| optimizer=adam vs momentum \| batch_size=512 \| 16 \| -{about_two} \[", section)
    data = json.loads(export_json(report, tmp_path).read_text(encoding="utf-8"))["interactions"]
    assert [t["result"] for t in data["tests"] if t["metric"] == "accuracy"] == ["depends", "depends"]
    assert [(s["stratum"], s["n_pairs"]) for s in data["strata"][:2]] == [
        ({"batch_size": 64}, 16),
        ({"batch_size": 512}, 16),
    ]


def test_an_effect_that_does_not_flip_is_no_interaction(tmp_path):
    """adam +2 pp at both batch sizes, batch 512 −1 pp with either optimizer (purely additive): nothing depends on
    anything, no finding names an interaction, and adam's pooled verdict stands."""
    run_dir = grid_run(tmp_path / "run", 4, additive)
    report = build_report(run_dir)
    accuracy = report.interactions.tests[report.interactions.tests["metric"] == "accuracy"]
    assert set(accuracy["result"]) == {"no evidence"}
    assert (accuracy["tested"] == 2).all()
    assert report.effects["optimizer"]["final_test_acc"].iloc[0]["verdict"] == "differs"
    findings = findings_of(markdown(report))
    assert "depends on" not in findings and "Interactions" not in findings


def test_one_seed_per_configuration_cannot_test_an_interaction(tmp_path):
    """One seed per configuration, two factors: each batch size holds one adam-vs-momentum pair, so the effect's
    spread within a stratum is unknown: the report says the interaction cannot be tested, and why."""
    run_dir = grid_run(tmp_path / "run", 1, flipping)
    report = build_report(run_dir)
    tests = report.interactions.tests
    assert set(tests[tests["metric"] == "accuracy"]["result"]) == {"cannot be tested"}
    assert "**Interactions** of final test accuracy: cannot be tested" in findings_of(markdown(report))
