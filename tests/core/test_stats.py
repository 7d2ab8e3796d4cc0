"""The paired difference of two scores on the same held-out items, with its bootstrap interval."""

from __future__ import annotations

import math

import pytest

from memrl.core.stats import paired_difference


def test_the_interval_brackets_the_mean_and_is_seeded() -> None:
    trained = [1.0, 1.0, 0.5, 1.0, 0.0, 1.0, 0.5, 1.0]
    base = [0.0, 1.0, 0.5, 0.0, 0.0, 0.5, 0.0, 1.0]
    mean, (low, high) = paired_difference(trained, base)
    assert mean == pytest.approx(0.375)
    assert 0.0 < low < mean < high <= 1.0
    assert paired_difference(trained, base) == (mean, (low, high))  # same seed, same interval
    # Unpaired, these lists give the same means; pairing is what the interval rests on.
    _, (low_swapped, _) = paired_difference(sorted(trained), sorted(base))
    assert low_swapped != low


def test_nan_pairs_are_left_out_and_too_few_give_none() -> None:
    mean, ci = paired_difference([1.0, math.nan, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0])
    assert mean == pytest.approx(1 / 3) and ci[0] <= mean <= ci[1]
    assert paired_difference([1.0, math.nan], [0.0, 0.0]) is None
    assert paired_difference([0.5, 0.5], [0.25, 0.25]) == (0.25, (0.25, 0.25))
    with pytest.raises(ValueError, match="3 scores against 2"):
        paired_difference([1.0, 1.0, 1.0], [0.0, 0.0])
