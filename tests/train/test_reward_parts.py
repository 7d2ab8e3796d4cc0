"""Adding a reward part is one function and one registry entry: a toy part, registered, is scored, logged and
weighted by the TRL adapter with no code of its own there."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_rewards_trl import GOOD, TRUTH, call_all

from memrl.rewards.config import RewardConfig
from memrl.rewards.parts import PartContext, RewardPart, Sample, Scored, score_parts
from memrl.rewards.registry import REWARDS, RewardEntry, reflection_parts
from memrl.train.curves import eval_reward
from memrl.train.trl.rewards import grpo_rewards

BREVITY_WEIGHT = 0.25


class BrevityScorer:
    """Minus the reply's words over 100: a toy part."""

    async def ascore(self, samples: Sequence[Sample]) -> list[Scored]:
        return [Scored({"brevity": -len(s.completion.split()) / 100}) for s in samples]

    def batch_metrics(self, scored: Sequence[Scored]) -> dict[str, float]:
        return {"reward/brevity_scored": float(len(scored))}


def brevity_parts(ctx: PartContext) -> list[RewardPart]:
    return [RewardPart("brevity", BREVITY_WEIGHT, BrevityScorer())]


@pytest.fixture
def brevity(monkeypatch: pytest.MonkeyPatch) -> RewardEntry:
    entry = RewardEntry("brevity", ("brevity",), "the reply text", brevity_parts, "fewer words", brevity_parts)
    monkeypatch.setitem(REWARDS, entry.name, entry)  # the registry as it was after the test
    return entry


def test_a_registered_part_is_scored_logged_and_weighted_by_trl(
    brevity: RewardEntry, model_cache: object, tmp_path: Path
) -> None:
    funcs, weights = grpo_rewards(RewardConfig(format_weight=0.5), tmp_path)
    assert [f.__name__ for f in funcs] == ["coverage", "format", "brevity"]
    assert weights == [1.0, 0.5, BREVITY_WEIGHT]
    metrics: dict[str, list[float]] = {}
    coverage, fmt, words = call_all(funcs, [GOOD, "no json at all"], metrics)
    assert words == [-len(GOOD.split()) / 100, -0.04]
    assert metrics["reward/brevity_scored"] == [2.0] and metrics["reward/judge_failed"] == [0.0]
    assert coverage == [1.0, 0.0] and fmt == [1.0, 0.0]


def test_the_total_applies_every_part_weight(brevity: RewardEntry, model_cache: object) -> None:
    parts = reflection_parts(RewardConfig(coverage_weight=2.0))
    batch = asyncio.run(score_parts(parts, [Sample(GOOD, TRUTH)]))
    (values,) = batch.values
    assert values["brevity"] is not None and values["brevity"] < 0
    assert batch.totals == [round(2.0 * 1.0 + 1.0 * 1.0 + BREVITY_WEIGHT * values["brevity"], 6)]


def test_an_outcome_reward_nobody_registered_is_an_error_not_a_missing_part() -> None:
    """The next-session reward registers itself when memrl.train.rewards is imported: code that builds the reflection
    reward without that import must not train silently without the outcome part its config asks for."""
    import subprocess
    import sys

    code = (
        "from memrl.rewards.config import NextSessionRewardConfig, RewardConfig\n"
        "from memrl.rewards.registry import reflection_parts\n"
        "reflection_parts(RewardConfig(outcome=NextSessionRewardConfig(agent='scripted')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("reward.outcome is set but the next-session reward is not registered: import memrl.train.rewards")
    ), done.stderr[-2000:]


def test_a_part_registered_after_the_charts_were_imported_is_charted(brevity: RewardEntry) -> None:
    """verl logs a part only on the validation set; the chart reads the registry when it draws, not when imported."""
    steps = {
        2: {"val-core/memrl/brevity/mean@1": -0.3, "val-core/memrl/brevity/mean@4": -0.2, "val-core/x/y/mean@1": 1}
    }
    assert eval_reward(steps) == {"eval brevity": [(2, -0.2)]}
