"""The reflection reward as data: a weighted list of named parts, each scored by a part scorer, and their total.

    parts = reflection_parts(cfg, data_dir)      # built through the registry's factories (memrl.rewards.registry)
    scored = await score_parts(parts, samples)   # every scorer once per batch: each sample's values and total

Parts built by one factory may share one scorer (coverage, format and the length penalty are one judge call): a
scorer runs once per batch whatever the number of its parts. A part's value is None where its scorer could not
score the sample; the sample's total is then None too (trainers leave it out of its group).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memrl.rewards.config import RewardConfig

Values = Mapping[str, float | None]


@dataclass(frozen=True)
class Sample:
    """One reflection reply and what it is graded against."""

    completion: str
    truth: Any = None  # its ground truth: GroundTruth, its dict or its JSON string
    key: str | None = None  # the reflection row's key (parts that play the user's next session read it)


@dataclass(frozen=True)
class Scored:
    """One sample's values of a scorer's parts, and what trainers log beside them (verl: in its reward dict)."""

    values: Values
    logged: Values = field(default_factory=dict)


class PartScorer(Protocol):
    async def ascore(self, samples: Sequence[Sample]) -> list[Scored]: ...

    def batch_metrics(self, scored: Sequence[Scored]) -> dict[str, float]:
        """What TRL logs once per batch (`reward/judge_failed`, ...)."""
        ...


@dataclass(frozen=True)
class RewardPart:
    name: str  # what trainers log (TRL: `rewards/<name>/mean`) and the key of its value
    weight: float
    scorer: PartScorer


class PartContext:
    """What a registry factory builds parts from: the reward config, the stage's data, and the scorers parts share."""

    def __init__(
        self, cfg: RewardConfig, data_dir: Path | None = None, shared: Mapping[str, Any] | None = None
    ) -> None:
        self.cfg = cfg
        self.data_dir = data_dir
        self._shared: dict[str, Any] = dict(shared or {})

    def shared(self, name: str, build: Callable[[], Any]) -> Any:
        """The scorer called `name`, built on first use: the parts of one factory (or several) share it."""
        if name not in self._shared:
            self._shared[name] = build()
        return self._shared[name]


def scorers(parts: Sequence[RewardPart]) -> list[PartScorer]:
    """The distinct scorers of `parts`, in order."""
    seen: dict[int, PartScorer] = {}
    for part in parts:
        seen.setdefault(id(part.scorer), part.scorer)
    return list(seen.values())


def total(parts: Sequence[RewardPart], values: Values) -> float | None:
    """The weighted sum of a sample's part values, None where one is None (rounded as the judge's score is)."""
    terms = [values[p.name] for p in parts]
    if any(v is None for v in terms):
        return None
    return round(sum(p.weight * v for p, v in zip(parts, terms, strict=True) if v is not None), 6)


@dataclass(frozen=True)
class ScoredBatch:
    values: list[dict[str, float | None]]  # per sample: every part's value
    logged: list[dict[str, float | None]]  # per sample: what the scorers log beside the parts
    totals: list[float | None]  # per sample: the weighted sum of its parts
    metrics: dict[str, float]  # every scorer's batch_metrics


async def score_parts(parts: Sequence[RewardPart], samples: Sequence[Sample]) -> ScoredBatch:
    """Every scorer of `parts` once on the batch (concurrently), merged per sample."""
    distinct = scorers(parts)
    results = await asyncio.gather(*(s.ascore(samples) for s in distinct))
    values: list[dict[str, float | None]] = [{} for _ in samples]
    logged: list[dict[str, float | None]] = [{} for _ in samples]
    metrics: dict[str, float] = {}
    for scorer, scored in zip(distinct, results, strict=True):
        for sample_values, sample_logged, one in zip(values, logged, scored, strict=True):
            sample_values |= one.values
            sample_logged |= one.logged
        metrics |= scorer.batch_metrics(scored)
    return ScoredBatch(values, logged, [total(parts, v) for v in values], metrics)
