"""The judge interface and the one place that builds a judge from its config."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from memrl.core import models
from memrl.rewards.config import JudgeConfig
from memrl.rewards.types import JudgeItem, JudgeVerdict


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
