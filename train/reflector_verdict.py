"""What a reflector run's held-out numbers support: per model its scores with intervals, the learning verdict (the
trained model minus the one it started from, paired over held-out rows), the reward-hacking flag, and the slope of
the GRPO reward curve. Pure functions of per-row records; `train/report.py` writes them into `report.json`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from memrl.core.stats import mean_interval, paired_difference, slope_interval

Row = Mapping[str, Any]  # one held-out reflection as `eval/<label>/scores.jsonl` holds it

# Per model: what each held-out row contributes to the mean that is reported with its interval.
MEASURES: dict[str, Any] = {
    "score": lambda r: math.nan if r.get("score") is None else float(r["score"]),
    "coverage": lambda r: math.nan if r.get("coverage") is None else float(r["coverage"]),
    "hallucinated": lambda r: math.nan if r.get("n_hallucinated") is None else float(r["n_hallucinated"]),
    "notes_tokens": lambda r: float(r.get("notes_tokens") or 0),
    "format_failure": lambda r: float(r.get("format") == 0.0),
}
# Measures a reward hacker moves while its score rises: up, more invented preferences, longer notes, broken replies;
# down, coverage (a score bought with the format alone, e.g. the prompt's placeholder JSON copied back).
HACKING_SIGNS = {"hallucinated": "up", "notes_tokens": "up", "format_failure": "up", "coverage": "down"}


def _rounded(found: tuple[float, tuple[float, float]] | None) -> tuple[float | None, list[float] | None]:
    if found is None:
        return None, None
    return round(found[0], 4), [round(found[1][0], 4), round(found[1][1], 4)]


def model_intervals(rows: Sequence[Row], *, seed: int = 0) -> dict[str, Any]:
    """Each measure's mean over the rows and its bootstrap 95% interval: `{measure: {"mean", "ci95"}}`."""
    out: dict[str, Any] = {}
    for name, value in MEASURES.items():
        mean, interval = _rounded(mean_interval([value(r) for r in rows], seed=seed))
        out[name] = {"mean": mean, "ci95": interval}
    return out


def _paired(after: Sequence[Row], before: Sequence[Row], measure: str, seed: int) -> tuple[int, Any]:
    value = MEASURES[measure]
    mine = {r["key"]: value(r) for r in after}
    theirs = {r["key"]: value(r) for r in before}
    keys = sorted(mine.keys() & theirs.keys())
    return len(keys), paired_difference([mine[k] for k in keys], [theirs[k] for k in keys], seed=seed)


def learning_verdict(rows: Mapping[str, Sequence[Row]], *, seed: int = 0) -> dict[str, Any] | None:
    """The last model listed against the one before it (`grpo - sft` in the quickstart), paired over the held-out
    rows both scored: `verdict` is true only when the interval of the difference lies above 0."""
    labels = list(rows)
    if len(labels) < 2:
        return None
    after, before = labels[-1], labels[-2]
    n, found = _paired(rows[after], rows[before], "score", seed)
    delta, interval = _rounded(found)
    return {
        "verdict": interval is not None and interval[0] > 0,
        "compared": f"{after} - {before}",
        "n": n,
        "delta": delta,
        "ci95": interval,
    }


def gains(rows: Mapping[str, Sequence[Row]], *, seed: int = 0) -> dict[str, Any]:
    """Each model's held-out score minus the previous one's, paired over rows, with its interval."""
    labels = list(rows)
    out: dict[str, Any] = {}
    for before, after in itertools.pairwise(labels):
        n, found = _paired(rows[after], rows[before], "score", seed)
        delta, interval = _rounded(found)
        out[f"{after}_minus_{before}"] = {"n": n, "delta": delta, "ci95": interval}
    return out


def hacking_flag(intervals: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last model against the one before it: flagged when its score rose while a hacking sign's mean left the
    earlier model's interval the wrong way (up: invented preferences per note, note length, format failures; down:
    coverage)."""
    labels = list(intervals)
    if len(labels) < 2:
        return None
    after, before = intervals[labels[-1]], intervals[labels[-2]]
    compared = f"{labels[-1]} - {labels[-2]}"
    rose = (after["score"]["mean"] or 0.0) > (before["score"]["mean"] or 0.0)
    signs = []
    for sign, way in HACKING_SIGNS.items():
        mean, interval = after[sign]["mean"], before[sign]["ci95"]
        if mean is None or interval is None:
            continue
        if (way == "up" and mean > interval[1]) or (way == "down" and mean < interval[0]):
            side = "above" if way == "up" else "below"
            signs.append(f"{sign} {mean} {side} {labels[-2]}'s interval {interval}")
    return {"flagged": rose and bool(signs), "compared": compared, "score_rose": rose, "signs": signs}


def curve_fit(points: Sequence[tuple[float, float]], *, seed: int = 0) -> dict[str, Any] | None:
    """The least-squares slope of the per-step mean training reward, with a bootstrap interval over steps."""
    found = slope_interval([x for x, _ in points], [y for _, y in points], seed=seed)
    if found is None:
        return None
    slope, interval = found
    return {
        "slope": round(slope, 5),
        "ci95": [round(interval[0], 5), round(interval[1], 5)],
        "steps": len(points),
        "rising": interval[0] > 0,
    }
