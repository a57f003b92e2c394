"""The paired comparison: bootstrap interval of the accuracy change and McNemar's exact test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluate import paired


def _pair(n: int, both: int, candidate_only: int, baseline_only: int, seed: int = 0):
    """Correctness arrays of n examples: `both` right in both, then the discordant ones."""
    candidate = np.zeros(n, bool)
    baseline = np.zeros(n, bool)
    candidate[:both] = baseline[:both] = True
    candidate[both : both + candidate_only] = True
    baseline[both + candidate_only : both + candidate_only + baseline_only] = True
    order = np.random.default_rng(seed).permutation(n)
    return candidate[order], baseline[order]


def _binomial_tail(n: int, k: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


@pytest.mark.parametrize(("b", "c"), [(10, 2), (2, 10), (7, 7), (0, 5), (40, 25), (0, 0)])
def test_mcnemar_exact_is_twice_the_smaller_binomial_tail(b, c):
    expected = 1.0 if b + c == 0 else min(1.0, 2 * _binomial_tail(b + c, min(b, c)))
    assert paired.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9)


def test_mcnemar_exact_stays_finite_for_thousands_of_discordant_pairs():
    p = paired.mcnemar_exact(2600, 2400)
    # The normal approximation of the same test: z = (b - c) / sqrt(b + c).
    z = 200 / math.sqrt(5000)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=0.05)


def test_identical_models_have_a_zero_width_interval_and_no_difference():
    correct = np.random.default_rng(1).random(500) < 0.9
    comparison = paired.compare(correct, correct.copy(), confidence=0.95)
    assert (comparison.lower, comparison.upper, comparison.difference) == (0.0, 0.0, 0.0)
    assert comparison.p_value == 1.0
    assert comparison.verdict == paired.NO_DETECTABLE_DIFFERENCE


def test_the_multinomial_bootstrap_matches_resampling_examples():
    # Drawing N example indices with replacement, the textbook paired bootstrap, gives the same
    # interval within Monte Carlo error.
    candidate, baseline = _pair(2000, 1700, 90, 60)
    lower, upper = paired.bootstrap_interval(
        candidate, baseline, confidence=0.95, resamples=4000, seed=3
    )
    rng = np.random.default_rng(4)
    index = rng.integers(0, 2000, size=(4000, 2000))
    differences = candidate[index].mean(axis=1) - baseline[index].mean(axis=1)
    brute = np.quantile(differences, [0.025, 0.975])
    assert lower == pytest.approx(brute[0], abs=0.002)
    assert upper == pytest.approx(brute[1], abs=0.002)
    assert lower < 0.015 < upper  # the observed difference, (90 - 60) / 2000


def test_the_interval_is_seeded_and_narrows_with_more_examples():
    small = _pair(500, 440, 15, 10)
    large = _pair(10000, 8800, 300, 200)
    first = paired.bootstrap_interval(*small, confidence=0.95)
    assert paired.bootstrap_interval(*small, confidence=0.95) == first
    narrow = paired.bootstrap_interval(*large, confidence=0.95)
    assert narrow[1] - narrow[0] < (first[1] - first[0]) / 3
    wider = paired.bootstrap_interval(*large, confidence=0.99)
    assert wider[0] < narrow[0] and wider[1] > narrow[1]


@pytest.mark.parametrize(
    ("candidate_only", "baseline_only", "verdict"),
    [
        (300, 100, paired.BETTER),
        (100, 300, paired.WORSE),
        (105, 100, paired.NO_DETECTABLE_DIFFERENCE),
    ],
)
def test_the_verdict_follows_the_interval(candidate_only, baseline_only, verdict):
    comparison = paired.compare(*_pair(10000, 9000, candidate_only, baseline_only), confidence=0.95)
    assert comparison.verdict == verdict
    assert comparison.candidate_only == candidate_only
    assert comparison.baseline_only == baseline_only
    assert comparison.difference == pytest.approx((candidate_only - baseline_only) / 10000)
    assert comparison.lower <= comparison.difference <= comparison.upper
    assert (comparison.p_value < 0.05) == (verdict != paired.NO_DETECTABLE_DIFFERENCE)
    assert verdict in comparison.summary() and comparison.document()["verdict"] == verdict


def test_different_examples_cannot_be_paired():
    with pytest.raises(ValueError, match="a paired comparison needs the same examples"):
        paired.compare(np.ones(10, bool), np.ones(11, bool), confidence=0.95)


@pytest.mark.parametrize("confidence", [0.5, 1.0, 0.2, 95.0])
def test_a_confidence_outside_half_to_one_is_refused(confidence):
    with pytest.raises(ValueError, match=r"confidence is a level in \(0.5, 1\)"):
        paired.check_confidence(confidence)
