"""A dead judge stops a GRPO run in a few steps, under verl's estimator and TRL's reward functions alike."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_rewards_trl import GOOD, call_all

from memrl.core.errors import BackendError, ConfigError
from memrl.rewards.config import JudgeConfig, RewardConfig, UnscoredStop
from memrl.rewards.registry import reflection_parts
from memrl.rewards.unscored import UNSCORED_ENV, UnscoredWatch, unscored_env
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.serve import free_port
from memrl.train.trl.rewards import reflection_funcs

SOURCE = "judge at http://judge.example/v1 (model m)"


def test_the_watch_stops_after_consecutive_mostly_unscored_steps() -> None:
    watch = UnscoredWatch(UnscoredStop(max_share=0.5, steps=2), [SOURCE])
    watch.observe(8, 8)
    watch.observe(1, 8)  # a good step breaks the streak
    watch.observe(4, 8)  # exactly the share: not over it
    watch.observe(7, 8)
    with pytest.raises(BackendError, match=r"2 steps in a row .*7/8, 8/8.*judge at http://judge.example/v1"):
        watch.observe(8, 8)


def test_max_share_one_never_stops() -> None:
    watch = UnscoredWatch(UnscoredStop(max_share=1.0, steps=1))
    for _ in range(5):
        watch.observe(8, 8)


def test_the_watch_travels_through_the_environment() -> None:
    env = unscored_env(UnscoredStop(max_share=0.25, steps=4), [SOURCE])
    watch = UnscoredWatch.from_env(env)
    assert watch.stop == UnscoredStop(max_share=0.25, steps=4) and watch.sources == [SOURCE]
    assert UnscoredWatch.from_env({}).stop == UnscoredStop()
    with pytest.raises(ConfigError, match=UNSCORED_ENV):
        UnscoredWatch.from_env({UNSCORED_ENV: "[1, 2]"})


def test_verl_estimator_stops_a_run_whose_judge_is_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    import memrl.train.verl.advantage as adv
    from memrl.train.verl.rewards import ADV_ESTIMATOR

    monkeypatch.setenv(UNSCORED_ENV, unscored_env(UnscoredStop(steps=3), [SOURCE])[UNSCORED_ENV])
    adv.reset_watch()
    estimator = core_algos.get_adv_estimator_fn(ADV_ESTIMATOR)
    rewards = torch.full((4, 3), math.nan)
    mask = torch.ones(4, 3)
    uids = np.array(list("aabb"), dtype=object)
    try:
        for _ in range(2):
            advantages, _ = estimator(token_level_rewards=rewards, response_mask=mask, config={}, index=uids)
            assert torch.equal(advantages, torch.zeros(4, 3))
        with pytest.raises(BackendError, match=r"3 steps in a row .*4/4.*judge at http://judge.example"):
            estimator(token_level_rewards=rewards, response_mask=mask, config={}, index=uids)
    finally:
        adv.reset_watch()


def test_trl_reward_functions_stop_a_run_whose_judge_is_unreachable(tmp_path: Path) -> None:
    model = OpenAIModelConfig(backend="openai", model="m", endpoint=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)
    cfg = RewardConfig(judge=JudgeConfig(kind="llm", model=model, cache_dir=str(tmp_path)))
    funcs = reflection_funcs(reflection_parts(cfg), watch=UnscoredWatch(UnscoredStop(steps=2), [SOURCE]))
    assert call_all(funcs, [GOOD], {}) == [[None], [None]]
    with pytest.raises(BackendError, match="2 steps in a row"):
        call_all(funcs, [GOOD + " "], {})  # a new batch: scored again, failed again
