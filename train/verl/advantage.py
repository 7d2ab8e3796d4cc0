"""verl advantage estimator `memrl_grpo`: verl's GRPO over the judged samples only, as TRL 1.16 does it.

    algorithm.adv_estimator=memrl_grpo
    +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=memrl.train.verl.advantage

verl needs a float reward per sample, and its reward loop scores samples one at a time, streamed, so no reward
function sees a sample's group. A sample whose judge failed therefore gets the score NaN from
`memrl.train.verl.rewards`, and this estimator, which does see the groups, leaves it out: the other samples of its
group get verl's own GRPO advantage computed without it (`compute_grpo_outcome_advantage` on the judged rows), and
it gets advantage 0. A group with fewer than two judged samples has no baseline and gets 0 throughout. That is
what TRL 1.16 does with a sample whose reward functions all return None (nan-aware group mean and std, advantage
0), so both trainers treat a failed judge the same: as if the sample were absent.

verl imports the modules named in `VERL_USE_EXTERNAL_MODULES` on `import verl` in every process, the trainer's
included, which registers the estimator there.

verl calls the estimator once per training step, in its trainer process: it also stops a run whose samples stay
mostly unscored (`memrl.rewards.unscored`, limits and endpoints from MEMRL_UNSCORED in the job's runtime env), so a
dead judge fails the job in a few steps instead of training on advantage 0 to the end.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from memrl.rewards.unscored import UnscoredWatch
from memrl.train.verl.rewards import ADV_ESTIMATOR

log = logging.getLogger(__name__)
_WATCH: list[UnscoredWatch] = []  # this process's watch, built from the environment on the first step


def watch() -> UnscoredWatch:
    """The process's unscored-step watch (what MEMRL_UNSCORED describes, read once)."""
    if not _WATCH:
        _WATCH.append(UnscoredWatch.from_env())
    return _WATCH[0]


def reset_watch() -> None:
    """Forget the streak and re-read MEMRL_UNSCORED on the next step (a new run in this process)."""
    _WATCH.clear()


@register_adv_est(ADV_ESTIMATOR)
def compute_judged_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    epsilon: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) as verl's GRPO computes them, with NaN-scored (judge failed) samples excluded."""
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.sum(dim=-1)
    judged = ~torch.isnan(scores)
    groups = np.asarray(index, dtype=object)
    judged_np = judged.cpu().numpy()
    # verl gives a lone sample the raw score as its advantage; without a second judged sample there is no baseline.
    counts: dict[Any, int] = {}
    for group in groups[judged_np]:
        counts[group] = counts.get(group, 0) + 1
    usable = torch.tensor([ok and counts.get(g, 0) > 1 for g, ok in zip(groups, judged_np, strict=True)])
    advantages = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    if usable.any():
        rows = usable.nonzero(as_tuple=True)[0]
        sub, _ = compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=groups[rows.numpy()],
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_by_std,
        )
        advantages[rows] = sub.to(advantages.dtype)
    failed = int((~judged).sum())
    if failed:
        log.warning("memrl_grpo: %d of %d samples had no judge verdict: advantage 0", failed, len(scores))
    watch().observe(failed, len(scores))  # raises after too many mostly-unscored steps in a row
    return advantages, advantages
