"""Paired comparisons on held-out data: the mean difference of two scores measured on the same items, with a
bootstrap interval (scipy's resampling, over items)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, tuple[float, float]] | None:
    """mean(a - b) and its percentile bootstrap interval, resampling the items (a[i], b[i]) together; pairs with
    a NaN on either side are left out. None when fewer than two pairs remain: no interval to give."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} scores against {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
    if len(diffs) < 2:
        return None
    mean = sum(diffs) / len(diffs)
    if max(diffs) == min(diffs):  # every resample gives the same mean
        return mean, (mean, mean)
    import numpy as np
    from scipy.stats import bootstrap

    result = bootstrap(
        (np.asarray(diffs),),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return mean, (float(result.confidence_interval.low), float(result.confidence_interval.high))
