"""The reflection reward: coverage (judge 0-3, normalised) + format - an optional length penalty, every part kept.

A sample whose judge failed after its retries has no reward (`score` None, `judge_failed` True); the scorer
counts such samples per batch and in total so trainers can log them instead of training on a made-up number.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from memrl.core.asyncs import run_sync
from memrl.rewards.config import JudgeConfig, LengthPenaltyConfig, RewardConfig
from memrl.rewards.format import UNUSABLE, FormatResult, format_reward
from memrl.rewards.judge import Judge, build_judge
from memrl.rewards.text import count_tokens
from memrl.rewards.types import GroundTruth, JudgeItem, JudgeVerdict, RewardParts

__all__ = ["JudgeConfig", "LengthPenaltyConfig", "RewardConfig", "RewardScorer", "length_penalty"]

log = logging.getLogger(__name__)
TruthLike = GroundTruth | dict[str, Any] | str


def length_penalty(tokens: int, cfg: LengthPenaltyConfig | None) -> float:
    if cfg is None:
        return 0.0
    return min(cfg.max_penalty, cfg.per_token * max(0, tokens - cfg.budget))


class RewardScorer:
    """Scores batches of reflection replies; build once per process and reuse (the judge holds a model)."""

    def __init__(self, cfg: RewardConfig | None = None, judge: Judge | None = None) -> None:
        self.cfg = cfg or RewardConfig()
        self.judge = judge if judge is not None else build_judge(self.cfg.judge)
        self.last_batch_failures = 0  # judge failures in the latest batch
        self.failures = 0  # judge failures since the scorer was built
        self.format_failures = 0  # replies with format credit 0 (no usable notes, or cut) since the scorer was built
        self.scored = 0  # samples scored since the scorer was built
        self.batches = 0  # judge calls (one per scored batch)
        self._lock = threading.Lock()

    def _notes(self, completion: str, fmt: FormatResult) -> str:
        if fmt.notes is not None:
            return fmt.notes
        return completion.strip() if self.cfg.plain_text_notes else ""

    def _combine(self, completion: str, notes: str, fmt: FormatResult, verdict: JudgeVerdict | None) -> RewardParts:
        lp = self.cfg.length_penalty
        notes_tokens = count_tokens(notes)
        penalty = length_penalty(notes_tokens if lp is None or lp.target == "notes" else count_tokens(completion), lp)
        if verdict is None:
            return RewardParts(
                score=None,
                coverage=None,
                format=fmt.score,
                judge_score=None,
                length_penalty=penalty,
                notes_tokens=notes_tokens,
                n_hallucinated=None,
                judge_failed=True,
                reasoning="the judge gave no valid verdict after its retries",
                format_reason=fmt.reason,
            )
        coverage = verdict.score / 3.0
        total = self.cfg.coverage_weight * coverage + self.cfg.format_weight * fmt.score - penalty
        return RewardParts(
            score=round(total, 6),
            coverage=coverage,
            format=fmt.score,
            judge_score=verdict.score,
            length_penalty=penalty,
            notes_tokens=notes_tokens,
            n_hallucinated=len(verdict.hallucinated) if self.judge.reports_ids else None,
            judge_failed=False,
            reasoning=verdict.reasoning,
            format_reason=fmt.reason,
            covered=verdict.covered,
            missing=verdict.missing,
            hallucinated=verdict.hallucinated,
        )

    async def ascore(self, completions: Sequence[str], truths: Sequence[TruthLike]) -> list[RewardParts]:
        """One RewardParts per completion; the judge sees the whole batch at once."""
        if len(completions) != len(truths):
            raise ValueError(f"{len(completions)} completions but {len(truths)} ground truths")
        formats = [format_reward(c) for c in completions]
        notes = [self._notes(c, f) for c, f in zip(completions, formats, strict=True)]
        items = [JudgeItem(n, GroundTruth.from_obj(t)) for n, t in zip(notes, truths, strict=True)]
        verdicts = await self.judge.score_many(items) if items else []
        parts = [self._combine(*args) for args in zip(completions, notes, formats, verdicts, strict=True)]
        failed = sum(p.judge_failed for p in parts)
        with self._lock:
            self.last_batch_failures = failed
            self.failures += failed
            self.format_failures += sum(f.score == UNUSABLE for f in formats)
            self.scored += len(parts)
            self.batches += 1
            total = self.failures
        if failed:
            log.warning(
                "judge failed on %d of %d samples (%d so far): their reward is missing", failed, len(parts), total
            )
        return parts

    def score(self, completions: Sequence[str], truths: Sequence[TruthLike]) -> list[RewardParts]:
        return run_sync(self.ascore(completions, truths))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "scored": self.scored,
                "batches": self.batches,
                "judge_failures": self.failures,
                "last_batch_failures": self.last_batch_failures,
            }
