"""verl custom reward functions: the judge reward (memrl.rewards.verl_reward) plus the next-session outcome.

    reward.custom_reward_function.path=pkg://memrl.envs.collab.outcome_verl
    reward.custom_reward_function.name=compute_score_async        # or compute_score (sync)
    +reward.custom_reward_function.reward_kwargs.reward_config='<RewardConfig JSON with outcome.data set>'

`score` = the judge reward's score + outcome.weight * outcome; the dict keeps the judge's parts and adds `outcome`,
`outcome_with_notes`, `outcome_without_notes` and `outcome_failed`. A sample whose next session failed (or whose
judge failed) scores NaN, which the `memrl_grpo` advantage estimator leaves out of its group. The row's user comes
from `extra_info.key` looked up in `outcome.data` (the reflection_data folder). Concurrent calls of the async
function are played as one lock-step batch of sessions.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from memrl.core.errors import ConfigError
from memrl.envs.collab.next_session import NextSessionRow, NextSessionScorer, OutcomeParts, build_scorer, load_rows
from memrl.rewards.config import OutcomeRewardConfig
from memrl.rewards.format import extract_notes
from memrl.rewards.reward import MicroBatcher, run_sync
from memrl.rewards.verl_reward import compute_score_async as judge_score_async
from memrl.rewards.verl_reward import reward_config

_LOCK = threading.Lock()
_SCORERS: dict[str, tuple[NextSessionScorer, dict[str, NextSessionRow]]] = {}
# One batcher per (event loop, scorer): the (notes, row) pairs of concurrent calls are played as one lock-step batch.
_BATCHERS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[NextSessionScorer, MicroBatcher[tuple[str, NextSessionRow], OutcomeParts]]
] = weakref.WeakKeyDictionary()


def outcome_scorer(cfg: OutcomeRewardConfig) -> tuple[NextSessionScorer, dict[str, NextSessionRow]]:
    """The process-wide scorer and rows for this configuration (built on first use)."""
    if cfg.data is None:
        raise ConfigError("reward_kwargs: reward_config.outcome.data must name the reflection_data folder (verl)")
    key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
    with _LOCK:
        if key not in _SCORERS:
            _SCORERS[key] = (build_scorer(cfg), load_rows(cfg.data))
        return _SCORERS[key]


def to_verl(judge: Mapping[str, Any], outcome: OutcomeParts, weight: float) -> dict[str, float | None]:
    """The same keys for every sample (verl stacks them); `score` is always a float, NaN where a part failed."""
    total = judge["score"] + weight * outcome.score if outcome.score is not None else math.nan
    return dict(judge) | {
        "score": total,
        "outcome": outcome.score,
        "outcome_with_notes": outcome.with_notes,
        "outcome_without_notes": outcome.without_notes,
        "outcome_failed": float(outcome.failed),
    }


async def compute_score_async(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, float | None]:
    cfg = reward_config(kwargs).outcome
    if cfg is None:
        raise ConfigError("reward_kwargs: reward_config has no `outcome` block (use memrl.rewards.verl_reward)")
    scorer, rows = outcome_scorer(cfg)
    row_key = str((extra_info or {}).get("key", ""))
    if row_key not in rows:
        raise ConfigError(f"outcome reward: extra_info.key {row_key!r} is not a row of {cfg.data}")
    loop = asyncio.get_running_loop()
    with _LOCK:
        held = _BATCHERS.get(loop)
        if held is None or held[0] is not scorer:
            held = _BATCHERS[loop] = (scorer, MicroBatcher(scorer.ascore, wait_s=0.02))
        batcher = held[1]
    judge, outcome = await asyncio.gather(
        judge_score_async(data_source, solution_str, ground_truth, extra_info, **kwargs),
        batcher.submit((extract_notes(solution_str) or "", rows[row_key])),
    )
    return to_verl(judge, outcome, cfg.weight)


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, float | None]:
    """Sync reward function (verl runs it in a thread pool, one sample per call)."""
    return run_sync(compute_score_async(data_source, solution_str, ground_truth, extra_info, **kwargs))
