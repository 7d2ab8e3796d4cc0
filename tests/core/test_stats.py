"""Held-out statistics: paired differences, means and slopes with bootstrap intervals, and the claim rule."""

from __future__ import annotations

import math
import random

import pytest

from memrl.core.stats import (
    detectable_effect,
    mean_interval,
    paired_difference,
    pooled_claim,
    slope_interval,
    within_slope_interval,
)


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


def test_a_rising_curve_has_a_slope_interval_above_zero_and_noise_does_not() -> None:
    rng = random.Random(0)
    steps = [float(s) for s in range(1, 31)]
    rising = [0.8 + 0.02 * s + rng.gauss(0, 0.15) for s in steps]
    slope, (low, high) = slope_interval(steps, rising)
    assert slope == pytest.approx(0.02, abs=0.01) and 0 < low < slope < high
    flat = [0.8 + rng.gauss(0, 0.15) for _ in steps]
    _, (low, high) = slope_interval(steps, flat)
    assert low < 0 < high
    assert slope_interval([1.0, 2.0], [0.0, 1.0]) is None  # two points: no interval to give
    assert slope_interval([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]) is None  # one step: no slope


def test_the_within_prompt_slope_sees_through_which_prompts_a_step_drew() -> None:
    """Prompts of very different difficulty, two a step, each seen once an epoch over two epochs: the per-step mean
    swings with the draw and its slope interval spans 0, while the slope within each prompt finds the planted rise."""
    rng = random.Random(1)
    difficulty = {f"p{i}": rng.uniform(0.0, 2.0) for i in range(20)}
    groups: dict[str, list[tuple[float, float]]] = {}
    by_step: dict[int, list[float]] = {}
    order = [*rng.sample(sorted(difficulty), 20), *rng.sample(sorted(difficulty), 20)]
    for n, prompt in enumerate(order):
        step = n // 2 + 1
        for _ in range(2):  # two rollouts a prompt
            reward = difficulty[prompt] + 0.012 * step + rng.gauss(0, 0.2)
            groups.setdefault(prompt, []).append((float(step), reward))
            by_step.setdefault(step, []).append(reward)
    steps = sorted(by_step)
    _, (low, high) = slope_interval([float(s) for s in steps], [sum(by_step[s]) / len(by_step[s]) for s in steps])
    assert low < 0 < high
    slope, (low, high), prompts = within_slope_interval(groups)  # type: ignore[misc]
    assert prompts == 20 and 0 < low < slope < high and slope == pytest.approx(0.012, abs=0.008)
    flat = {p: [(x, difficulty[p] + rng.gauss(0, 0.2)) for x, _ in points] for p, points in groups.items()}
    _, (low, high), _ = within_slope_interval(flat)  # type: ignore[misc]
    assert low < 0 < high
    # A prompt seen at one step only says nothing of the slope: with fewer than three others there is no interval.
    once = {f"q{i}": [(float(i), 1.0), (float(i), 0.5)] for i in range(10)}
    assert within_slope_interval(once | {"p0": groups["p0"], "p1": groups["p1"]}) is None


def test_a_claim_needs_the_pooled_interval_above_zero_and_no_seed_below() -> None:
    good = [[0.2, 0.1, 0.3, 0.0, 0.2], [0.1, 0.2, 0.1, 0.3, 0.0], [0.3, 0.1, 0.2, 0.2, 0.1]]
    claim = pooled_claim(good)
    assert claim.holds and claim.seeds == 3 and claim.pooled_ci95 is not None and claim.pooled_ci95[0] > 0
    # Pooled above 0, but one seed's own estimate is below 0: no claim.
    one_bad = [*good, [0.1, -0.2, -0.1, 0.0, -0.1]]
    claim = pooled_claim(one_bad)
    assert not claim.holds and "below 0" in claim.why and claim.pooled is not None and claim.pooled > 0
    # Every seed at or above 0, but the pooled interval reaches 0: no claim.
    weak = [[0.3, -0.3, 0.0], [0.2, -0.2, 0.05], [0.0, 0.1, -0.1]]
    claim = pooled_claim(weak)
    assert not claim.holds and "reaches" in claim.why
    assert not pooled_claim([[0.5]]).holds  # one unit: no interval


def test_a_mean_interval_brackets_the_mean() -> None:
    mean, (low, high) = mean_interval([1.0, 2.0, 3.0, 4.0, math.nan])
    assert mean == 2.5 and low < mean < high
    assert mean_interval([1.0]) is None


def test_the_detectable_effect_is_what_the_interval_shows_four_times_in_five() -> None:
    rng = random.Random(3)
    spread = [rng.gauss(0.0, 0.7) for _ in range(60)]
    detectable = detectable_effect(spread)
    assert detectable is not None and 0.18 < detectable < 0.32  # 2.8 x 0.7 / sqrt(60) = 0.253, give or take the draw
    # Four times the units, half the effect; fewer than two units, nothing to say.
    quadrupled = detectable_effect(spread * 4)
    assert quadrupled is not None and abs(quadrupled - detectable / 2) < 0.01
    assert detectable_effect([0.5]) is None and detectable_effect([0.1, math.nan]) is None

    # Repeated experiments with that true gain: the paired bootstrap interval lies above 0 in about 4 of 5; with half
    # that gain, in far fewer.
    def shown(gain: float) -> float:
        hits = 0
        for trial in range(120):
            draw = random.Random(trial)
            diffs = [gain + draw.gauss(0.0, 0.7) for _ in range(60)]
            found = paired_difference(diffs, [0.0] * 60, resamples=1000, seed=trial)
            hits += found is not None and found[1][0] > 0
        return hits / 120

    assert 0.68 <= shown(0.253) <= 0.92
    assert shown(0.253 / 2) <= 0.5
