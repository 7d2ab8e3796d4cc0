"""The next-session outcome as a part of the reflection reward (`outcome`, weighted by reward.outcome.weight)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memrl.core.errors import ConfigError
from memrl.envs.collab.next_session import NextSessionRow, load_rows
from memrl.rewards.format import extract_notes
from memrl.rewards.parts import PartContext, RewardPart, Sample, Scored
from memrl.train.rewards.next_session import NextSessionScorer, build_scorer

FAILED_METRIC = "reward/outcome_failed"


class OutcomeScorer:
    """Plays each sample's notes (the reflection JSON's `agent_notes`; none: "") in its row's next session."""

    def __init__(self, scorer: NextSessionScorer, rows: Mapping[str, NextSessionRow]) -> None:
        self.scorer = scorer
        self.rows = rows

    async def ascore(self, samples: Sequence[Sample]) -> list[Scored]:
        if missing := [s.key for s in samples if s.key not in self.rows]:
            raise ConfigError(
                f"outcome reward: row {missing[0]!r} is not in the reflection data it was built from "
                "(the row's key: TRL's dataset `key` column, verl's extra_info.key)"
            )
        notes = [extract_notes(s.completion) or "" for s in samples]
        parts = await self.scorer.ascore([(n, self.rows[str(s.key)]) for n, s in zip(notes, samples, strict=True)])
        return [
            Scored(
                {"outcome": p.score},
                {
                    "outcome": p.score,
                    "outcome_with_notes": p.with_notes,
                    "outcome_without_notes": p.without_notes,
                    "outcome_failed": float(p.failed),
                },
            )
            for p in parts
        ]

    def batch_metrics(self, scored: Sequence[Scored]) -> dict[str, float]:
        return {FAILED_METRIC: sum(s.logged["outcome_failed"] or 0.0 for s in scored)}


def outcome_parts(ctx: PartContext) -> list[RewardPart]:
    """`outcome` where reward.outcome is set: its rows from `outcome.data`, else the stage's data."""
    cfg = ctx.cfg.outcome
    if cfg is None:
        return []
    data = cfg.data or ctx.data_dir
    if data is None:
        raise ConfigError("reward.outcome.data must name the reflection_data folder")
    scorer = ctx.shared("outcome", lambda: OutcomeScorer(build_scorer(cfg), load_rows(data)))
    return [RewardPart("outcome", cfg.weight, scorer)]
