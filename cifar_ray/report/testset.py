"""The test set's part of a paired accuracy effect's error: every trial is tested on the same images.

A comparison of value A with the baseline B over k matched pairs (s = 1..k) on the same n test images: c_{s,i} is 1
where a trial got image i right (a cell of several trials: their mean), d_{s,i} = c_{A,s,i} - c_{B,s,i}, the pair's
accuracy difference D_s = mean_i d_{s,i}, the effect D = mean_s D_s = mean_i dbar_i with dbar_i = mean_s d_{s,i}.
Write d_{s,i} = mu_i + e_{s,i}: mu_i is image i's expected difference over training seeds, e_{s,i} what seed s's
training made of it. Then

    Var(D) = Var(mean_i mu_i)  +  Var(mean_s ebar_s)  =  sigma_mu^2 / n  +  tau^2 / k

- the test-set part, sigma_mu^2 / n: which images were drawn. The same for every pair, so more seeds do not shrink
  it; only more test images do. Estimated from the per-image log as var_i(dbar_i) / n (`measured_var`, ddof 1).
- the seed part, tau^2 / k, tau^2 = Var(ebar_s): estimated by s^2 / k, s the spread of the pair differences D_s
  (stats.paired_effects' std_diff). On the same images mean_i mu_i is the same in every pair, so s^2 holds no
  test-image sampling at all: only what the seeds did, including how each seed's right and wrong answers fell on
  single images.

se^2 = s^2 / k + var_i(dbar_i) / n. It counts one thing twice, on purpose: E[var_i(dbar_i)] = sigma_mu^2 +
mean_i Var(e_{s,i}) / k, because the seeds' flips on single images average out over k pairs only as 1/k, and that
same flip noise is part of tau^2 (when flips are independent across images, tau^2 = mean_i Var(e_{s,i}) / n). An
unbiased estimate would subtract mean_i of the within-image variance over pairs / (k n); it is not subtracted: the
difference can go negative, it leans on that independence, and keeping it errs wide. What it costs: with flips
independent across images, se is at most about sqrt(2) too wide (where the flips dominate), and about right where
the test set dominates (many seeds, a consistent difference). The Student-t interval keeps k - 1 degrees of freedom
(the seed part is the uncertain one). tests/test_report_testset.py checks the expectations above by Monte Carlo.

Runs logged before the per-image log (or pairs tested on different images) have only each trial's accuracy p. For
them `bound_var` is a bound that holds whatever the models' disagreement: the standard deviation over images is a
seminorm (Minkowski), and a 0/1 vector with mean p has standard deviation sqrt(p (1 - p)), so the population
standard deviation of dbar_i is at most mean_s (sigma_{A,s} + sigma_{B,s}) with sigma = sqrt(p (1 - p)) (a cell's:
the mean of its trials'). Hence var_i(dbar_i) / n = var0_i(dbar_i) / (n - 1) <= (mean_s (sigma_A + sigma_B))^2 /
(n - 1), with equality only where every error of one model is an image the other got right. The usual
p_A (1 - p_A) / n + p_B (1 - p_B) / n is not a bound: it assumes the two models' errors are not negatively
correlated. The bound is never below that sum, nor below the older floor that divided it by k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.runlog import CorrectImages

# How a comparison's test-set part was found: the effects frame's `testset_noise`.
MEASURED = "measured per image"
BOUND = "bounded: no per-image log"
NO_COUNT = "left out: test-image count unknown"


@dataclass(frozen=True)
class ImageScores:
    """Which of a trial's test images its final evaluation got right, and which images those are."""

    test_set: str  # the dataset and the count: trials of different test sets are not compared image by image
    correct: np.ndarray  # bool, one per image, in dataset order


def unpack(record: CorrectImages) -> np.ndarray:
    """The per-image correctness runlog's record packs (numpy.packbits, big bit order), as bools."""
    return np.unpackbits(np.frombuffer(record.bits, dtype=np.uint8), count=record.images).astype(bool)


@dataclass(frozen=True)
class Scored:
    """One trial of a pair's cell, as the test set scored it."""

    accuracy: float
    images: int | None  # the test images its accuracy is measured on; None when unknown
    scores: ImageScores | None  # None: the trial logged no per-image correctness (older versions)


Pair = tuple[Sequence[Scored], Sequence[Scored]]  # (the value's cell, the baseline's cell), each of >= 1 trial


def measured_var(diffs: np.ndarray) -> float:
    """The test-set part of the variance of the mean difference from the per-image differences `diffs` (pairs x
    images: a pair's value cell's correctness less its baseline cell's): var over images of their mean over pairs,
    over the images."""
    per_image = diffs.mean(axis=0)
    return float(per_image.var(ddof=1) / len(per_image))


def _sd(trial: Scored) -> float:
    return math.sqrt(trial.accuracy * (1 - trial.accuracy))


def bound_var(pairs: Sequence[Pair]) -> float:
    """The bound on measured_var from each trial's accuracy and test-image count alone (the module's docstring)."""
    return float(np.mean([np.mean([_sd(t) for t in a]) + np.mean([_sd(t) for t in b]) for a, b in pairs])) ** 2 / (
        _images(pairs) - 1
    )


def _images(pairs: Sequence[Pair]) -> int:
    # Pairs on different test-image counts (test_subset swept): the smallest count bounds every trial's noise.
    return min(t.images for a, b in pairs for t in (*a, *b))


def _cell(trials: Sequence[Scored]) -> np.ndarray:
    return np.mean([t.scores.correct for t in trials], axis=0)


def testset_var(pairs: Sequence[Pair]) -> tuple[float, str]:
    """The test-set part of the variance of the mean difference over `pairs`, and how it was found: MEASURED where
    every trial logged its per-image correctness on one test set, else BOUND (0 and NO_COUNT where a test-image count
    is unknown too: the logs of a dataset this version does not know)."""
    trials = [t for a, b in pairs for t in (*a, *b)]
    if (
        all(t.scores is not None for t in trials)
        and len({(t.scores.test_set, len(t.scores.correct)) for t in trials}) == 1
    ):
        return measured_var(np.stack([_cell(a) - _cell(b) for a, b in pairs])), MEASURED
    if any(t.images is None or t.images < 2 for t in trials):
        return 0.0, NO_COUNT
    return bound_var(pairs), BOUND
