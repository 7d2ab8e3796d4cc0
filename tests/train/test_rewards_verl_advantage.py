"""A failed judge under verl: NaN score, left out of its group by `memrl_grpo`, as TRL leaves out a None reward."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from memrl.rewards.config import RewardConfig
from memrl.rewards.judge import JudgedScorer, judge_scored
from memrl.rewards.parts import RewardPart
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import RewardParts
from memrl.train.verl.rewards import ADV_ESTIMATOR, ADV_MODULE, to_verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
import memrl.train.verl.advantage  # noqa: E402,F401  registers the estimator, as VERL_USE_EXTERNAL_MODULES does

NAN = math.nan
# Two groups of four rollouts (uid a, uid b); the second sample of group a had no judge verdict.
SCORES = [1.0, NAN, 0.0, 2.0, 0.5, 0.5, 1.5, 0.0]
UIDS = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
LENGTH = 5


def token_rewards(scores: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores at each response's last token, as verl's reward managers place them; responses of 3 tokens."""
    rewards = torch.zeros(len(scores), LENGTH)
    rewards[:, 2] = torch.tensor(scores)
    mask = torch.zeros(len(scores), LENGTH)
    mask[:, :3] = 1
    return rewards, mask


def memrl_grpo(scores: list[float], uids: np.ndarray, norm: bool) -> torch.Tensor:
    """Called as verl's compute_advantage calls a registered estimator: rewards, mask, config and the uids."""
    rewards, mask = token_rewards(scores)
    estimator = core_algos.get_adv_estimator_fn(ADV_ESTIMATOR)
    advantages, returns = estimator(
        token_level_rewards=rewards, response_mask=mask, config={"norm_adv_by_std_in_grpo": norm}, index=uids
    )
    assert torch.equal(advantages, returns)
    return advantages[:, 0]


def verl_grpo(scores: list[float], uids: np.ndarray, norm: bool) -> torch.Tensor:
    rewards, mask = token_rewards(scores)
    advantages, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
    return advantages[:, 0]


@pytest.mark.parametrize("norm", [True, False])
def test_failed_sample_gets_zero_and_the_rest_as_if_it_were_absent(norm: bool) -> None:
    got = memrl_grpo(SCORES, UIDS, norm)
    assert got[1] == 0.0
    kept = [i for i in range(len(SCORES)) if i != 1]
    without = verl_grpo([SCORES[i] for i in kept], UIDS[kept], norm)  # verl's own GRPO, the sample removed
    assert torch.allclose(got[kept], without)
    assert torch.allclose(got[4:], verl_grpo(SCORES[4:], UIDS[4:], norm))  # the other group is untouched


def test_plain_grpo_would_punish_a_failed_judge() -> None:
    # What a float failure score (the old 0.0) did under verl's grpo: a negative advantage inside its group.
    assert verl_grpo([1.0, 0.0, 0.0, 2.0], UIDS[:4], norm=False)[1] < 0
    assert torch.isnan(verl_grpo(SCORES, UIDS, norm=False)[:4]).all()  # and NaN spreads: memrl_grpo is required


def test_groups_without_a_baseline_get_zero() -> None:
    got = memrl_grpo([NAN, NAN, 1.0, 2.0, NAN, 3.0], np.array(list("aabbcc"), dtype=object), norm=True)
    assert got[[0, 1, 4, 5]].tolist() == [0.0, 0.0, 0.0, 0.0]  # all failed / one judged sample left
    assert got[2] < 0 < got[3]


def test_the_reward_adapter_scores_a_failed_judge_nan() -> None:
    failed = RewardParts(None, None, 1.0, None, 0.0, 4, None, judge_failed=True)
    judged = JudgedScorer(RewardScorer(RewardConfig()))
    parts = [RewardPart("coverage", 1.0, judged), RewardPart("format", 1.0, judged)]
    out = to_verl(parts, [judge_scored(failed)])
    assert math.isnan(out["score"]) and out["judge_failed"] == 1.0  # type: ignore[arg-type]


def test_verl_registers_the_estimator_from_the_environment() -> None:
    # What every verl process (driver, TaskRunner, workers) does with the launcher's runtime env.
    code = "import verl.trainer.ppo.core_algos as c; c.get_adv_estimator_fn('memrl_grpo'); print('ok')"
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": ADV_MODULE}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
