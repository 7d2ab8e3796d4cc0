"""Held-out statistics with bootstrap intervals (scipy's resampling): a paired difference of two scores measured on
the same items, a mean, a least-squares slope over steps (across them, or within groups such as prompts seen again),
the rule that turns intervals into a claim, and the smallest effect a number of paired units can show."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist, stdev
from typing import Any

Interval = tuple[float, float]


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def _bootstrap(
    samples: tuple[Any, ...],
    statistic: Callable[..., Any],
    *,
    paired: bool,
    resamples: int,
    seed: int,
    confidence: float,
) -> Interval:
    import numpy as np
    from scipy.stats import bootstrap

    result = bootstrap(
        samples,
        statistic,
        paired=paired,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def mean_interval(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, Interval] | None:
    """The mean of `values` (NaN left out) and its percentile bootstrap interval; None with fewer than two."""
    kept = _finite(values)
    if len(kept) < 2:
        return None
    mean = sum(kept) / len(kept)
    if max(kept) == min(kept):  # every resample gives the same mean
        return mean, (mean, mean)
    import numpy as np

    interval = _bootstrap(
        (np.asarray(kept),), np.mean, paired=False, resamples=resamples, seed=seed, confidence=confidence
    )
    return mean, interval


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, Interval] | None:
    """mean(a - b) and its percentile bootstrap interval, resampling the items (a[i], b[i]) together; pairs with
    a NaN on either side are left out. None when fewer than two pairs remain: no interval to give."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} scores against {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
    return mean_interval(diffs, confidence=confidence, resamples=resamples, seed=seed)


def detectable_effect(differences: Sequence[float], *, confidence: float = 0.95, power: float = 0.8) -> float | None:
    """The smallest true mean difference that this many paired units, as spread as these, would show with an interval
    above 0 in `power` of repeated experiments (normal approximation: (z of the two-sided confidence + z of the
    power) x sd / sqrt(n)). It says what an interval reaching 0 rules out, and how many units a smaller effect needs.
    None with fewer than two units."""
    kept = _finite(differences)
    if len(kept) < 2:
        return None
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2) + NormalDist().inv_cdf(power)
    return z * stdev(kept) / math.sqrt(len(kept))


def slope_interval(
    xs: Sequence[float], ys: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, Interval] | None:
    """The least-squares slope of ys over xs and its percentile bootstrap interval, resampling the (x, y) points
    together; None with fewer than three points or a single x (no slope to give)."""
    if len(xs) != len(ys):
        raise ValueError(f"slope_interval: {len(xs)} x values against {len(ys)} y values")
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if not (math.isnan(x) or math.isnan(y))]
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    import numpy as np

    x, y = np.asarray([p[0] for p in points]), np.asarray([p[1] for p in points])

    def slope(xb: Any, yb: Any, axis: int = -1) -> Any:
        xc = xb - xb.mean(axis=axis, keepdims=True)
        yc = yb - yb.mean(axis=axis, keepdims=True)
        spread = (xc * xc).sum(axis=axis)
        # A resample that drew one x only has no slope: count it as flat rather than fail the interval.
        return np.where(spread > 0, (xc * yc).sum(axis=axis) / np.where(spread > 0, spread, 1.0), 0.0)

    fitted = float(slope(x, y))
    interval = _bootstrap((x, y), slope, paired=True, resamples=resamples, seed=seed, confidence=confidence)
    return fitted, interval


def within_slope_interval(
    groups: Mapping[str, Sequence[tuple[float, float]]],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, Interval, int] | None:
    """The least-squares slope of y over x with an intercept of its own per group (the within-group, fixed-effects
    slope), its percentile bootstrap interval resampling whole groups, and how many groups it rests on. A group seen
    at one x only tells nothing of the slope and is left out; None with fewer than three groups left.

    For a training curve whose prompts come back at later steps, the groups are the prompts: a prompt's difficulty
    is its own intercept, so what remains is how its reward moved between its visits."""
    import numpy as np

    sxy, sxx = [], []
    for points in groups.values():
        kept = [(x, y) for x, y in points if not (math.isnan(x) or math.isnan(y))]
        x, y = np.asarray([p[0] for p in kept]), np.asarray([p[1] for p in kept])
        if len(kept) < 2 or x.max() == x.min():
            continue
        xc = x - x.mean()
        sxy.append(float((xc * (y - y.mean())).sum()))
        sxx.append(float((xc * xc).sum()))
    if len(sxx) < 3:
        return None

    def slope(xyb: Any, xxb: Any, axis: int = -1) -> Any:
        return xyb.sum(axis=axis) / xxb.sum(axis=axis)  # every group kept has a spread: no resample divides by 0

    fitted = float(slope(np.asarray(sxy), np.asarray(sxx)))
    interval = _bootstrap(
        (np.asarray(sxy), np.asarray(sxx)), slope, paired=True, resamples=resamples, seed=seed, confidence=confidence
    )
    return fitted, interval, len(sxx)


@dataclass(frozen=True)
class Claim:
    """Whether several seeds' held-out effects support a claim: the pooled interval lies above 0 and no seed's point
    estimate is below 0."""

    holds: bool
    pooled: float | None
    pooled_ci95: Interval | None
    seeds: int
    why: str


def pooled_claim(per_seed: Sequence[Sequence[float]], *, resamples: int = 2000, seed: int = 0) -> Claim:
    """`per_seed[i]`: the paired differences (trained - reference, one per held-out unit) of training seed i. The
    pooled effect is the mean over every seed's units, its interval a bootstrap over all of them."""
    means = [sum(v) / len(v) for v in (_finite(s) for s in per_seed) if v]
    found = mean_interval([d for s in per_seed for d in s], resamples=resamples, seed=seed)
    if found is None or not means:
        return Claim(False, None, None, len(per_seed), "fewer than two held-out units")
    pooled, interval = found
    if any(m < 0 for m in means):
        return Claim(False, pooled, interval, len(per_seed), f"a seed's estimate is below 0 ({min(means):+.4f})")
    if interval[0] <= 0:
        return Claim(False, pooled, interval, len(per_seed), f"the pooled interval reaches {interval[0]:+.4f}")
    return Claim(True, pooled, interval, len(per_seed), "pooled interval above 0, every seed's estimate at or above 0")
