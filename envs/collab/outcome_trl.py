"""The next-session outcome reward as a TRL GRPOTrainer reward function (async, one value per completion).

    funcs = [*judge_funcs, outcome_reward_func(scorer, rows)]       # rows: load_rows(<reflection data folder>)
    GRPOConfig(..., reward_weights=[*judge_weights, cfg.outcome.weight])

It reads each completion's notes as the agent would store them (the reflection JSON's `agent_notes`; none: "") and the
row's user from the dataset's `key` column, which TRL forwards to reward functions. TRL logs it as
`rewards/outcome/mean`; a sample whose next session failed gets None (TRL leaves it out of its group) and is counted
as `reward/outcome_failed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memrl.core.errors import ConfigError
from memrl.envs.collab.next_session import NextSessionRow, NextSessionScorer
from memrl.rewards.format import extract_notes
from memrl.rewards.trl_reward import RewardFunc, completion_text

FAILED_METRIC = "reward/outcome_failed"


def outcome_reward_func(scorer: NextSessionScorer, rows: Mapping[str, NextSessionRow]) -> RewardFunc:
    async def outcome(
        prompts: Sequence[Any], completions: Sequence[Any], key: Sequence[str] | None = None, **kwargs: Any
    ) -> list[float | None]:
        if key is None:
            raise ConfigError("the outcome reward needs the dataset's `key` column (the reflection row's key)")
        missing = [k for k in key if k not in rows]
        if missing:
            raise ConfigError(f"outcome reward: row {missing[0]!r} is not in the reflection data it was built from")
        notes = [extract_notes(completion_text(c)) or "" for c in completions]
        parts = await scorer.ascore([(n, rows[k]) for n, k in zip(notes, key, strict=True)])
        if callable(log_metric := kwargs.get("log_metric")):
            log_metric(FAILED_METRIC, float(sum(p.failed for p in parts)))
        return [p.score for p in parts]

    return outcome
