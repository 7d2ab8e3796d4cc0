"""The judge: its interface, the one place that builds a judge from its config, and the judged parts of the
reflection reward (coverage, format, the length penalty): one RewardScorer, one judge call per batch, whatever the
number of parts read from it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from memrl.core import models
from memrl.rewards.config import JudgeConfig
from memrl.rewards.parts import PartContext, RewardPart, Sample, Scored
from memrl.rewards.types import JudgeItem, JudgeVerdict, RewardParts

if TYPE_CHECKING:  # reward.py imports this module (its judge): the scorer is imported where a judged one is built
    from memrl.rewards.reward import RewardScorer

JUDGE_FAILED_METRIC = "reward/judge_failed"
NOTES_TOKENS_METRIC = "reward/notes_tokens"


class Judge(Protocol):
    name: str  # what produced the verdicts (the cache key's model part for LLM judges)
    reports_ids: bool  # whether verdicts list covered / missing / hallucinated taxonomy ids

    async def score_many(self, items: Sequence[JudgeItem]) -> list[JudgeVerdict | None]:
        """One verdict per item, in order; None where the judge failed after its retries."""
        ...


def build_judge(cfg: JudgeConfig) -> Judge:
    """An `OfflineJudge` or an `LLMJudge` over the configured backend, with the disk cache unless turned off."""
    if cfg.kind == "offline":
        from memrl.rewards.offline_judge import OfflineJudge

        return OfflineJudge(cfg.embedding_model)
    from memrl.rewards.judge_cache import JudgeCache
    from memrl.rewards.llm_judge import LLMJudge
    from memrl.rollout.builder import build_backend

    assert cfg.model is not None  # JudgeConfig refuses kind llm without a model
    embedded = models.lookup(cfg.model.model)
    name = embedded.name if embedded else cfg.model.model
    cache = JudgeCache(cfg.cache_path() / "verdicts.sqlite") if cfg.cache else None
    return LLMJudge(
        build_backend(cfg.model),
        name,
        sampling=cfg.sampling.params(),
        retries=cfg.retries,
        cache=cache,
        few_shot=cfg.few_shot,
    )


def judge_logged(parts: RewardParts) -> dict[str, float | None]:
    """What trainers log of a judged sample (verl: the keys of its reward dict, the same for every sample)."""
    return {
        "coverage": parts.coverage,
        "format": parts.format,
        "judge_score": parts.judge_score,
        "length_penalty": parts.length_penalty,
        "notes_tokens": float(parts.notes_tokens),
        "n_hallucinated": None if parts.n_hallucinated is None else float(parts.n_hallucinated),
        "judge_failed": float(parts.judge_failed),
    }


def judge_scored(parts: RewardParts) -> Scored:
    """A judged sample's part values (None where the judge failed) and what trainers log of it."""
    failed = parts.judge_failed
    values = {
        "coverage": parts.coverage,
        "format": None if failed else parts.format,
        "length_penalty": None if failed else -parts.length_penalty,
    }
    return Scored(values, judge_logged(parts))


class JudgedScorer:
    """coverage, format and length_penalty (minus the penalty: every weight stays positive) of each sample; all
    three None where the judge failed, so the sample has no reward."""

    def __init__(self, scorer: RewardScorer) -> None:
        self.scorer = scorer

    async def ascore(self, samples: Sequence[Sample]) -> list[Scored]:
        parts = await self.scorer.ascore([s.completion for s in samples], [s.truth for s in samples])
        return [judge_scored(p) for p in parts]

    def batch_metrics(self, scored: Sequence[Scored]) -> dict[str, float]:
        tokens = [s.logged["notes_tokens"] or 0.0 for s in scored]
        return {
            JUDGE_FAILED_METRIC: sum(s.logged["judge_failed"] or 0.0 for s in scored),
            NOTES_TOKENS_METRIC: sum(tokens) / max(1, len(tokens)),
        }


def judged(ctx: PartContext) -> JudgedScorer:
    """The one judged scorer of a reward (the context may hold one already built: `shared={"judge": ...}`)."""
    from memrl.rewards.reward import RewardScorer

    scorer: JudgedScorer = ctx.shared("judge", lambda: JudgedScorer(RewardScorer(ctx.cfg)))
    return scorer


def coverage_parts(ctx: PartContext) -> list[RewardPart]:
    return [RewardPart("coverage", ctx.cfg.coverage_weight, judged(ctx))]


def format_parts(ctx: PartContext) -> list[RewardPart]:
    return [RewardPart("format", ctx.cfg.format_weight, judged(ctx))]


def length_parts(ctx: PartContext) -> list[RewardPart]:
    """The length penalty, where configured: weight 1, its value already negative."""
    return [] if ctx.cfg.length_penalty is None else [RewardPart("length_penalty", 1.0, judged(ctx))]
