"""One GRPO: the reflector's `grpo` and the agent's `collab_grpo` share one schema, one TRL-arguments builder and one
verl-overrides builder; each stage kind adds only its data, reward and defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from memrl.train.config import GRPOStage, PolicyOptimStage
from memrl.train.hf_trainer import TrainContext
from memrl.train.online.config import STAGES, OnlineGRPOStage
from memrl.train.trl.grpo import grpo_args
from memrl.train.trl.online import online_args
from memrl.train.verl.online_overrides import online_overrides
from memrl.train.verl.overrides import grpo_overrides

# The same policy-optimisation knobs in both kinds, none of them a default; the response budget is the same too.
SHARED = {
    "lr": 3e-4,
    "max_steps": 7,
    "batch_size": 4,
    "micro_batch_size": 2,
    "rollouts": 3,
    "kl_coef": 0.01,
    "loss": "dr_grpo",
    "max_prompt_length": 512,
    "temperature": 0.7,
}


def reflector() -> GRPOStage:
    return GRPOStage(kind="grpo", model="m", data="d", max_response_length=600, **SHARED)


def agent() -> OnlineGRPOStage:
    return STAGES["collab"](kind="collab_grpo", model="m", max_episode_tokens=600, **SHARED)


def test_both_kinds_extend_one_schema_and_keep_their_defaults() -> None:
    for kind in (GRPOStage, STAGES["collab"]):
        assert issubclass(kind, PolicyOptimStage)
        assert set(PolicyOptimStage.model_fields) <= set(kind.model_fields)
    grpo, collab = GRPOStage(kind="grpo", model="m", data="d"), STAGES["collab"](kind="collab_grpo", model="m")
    assert (grpo.lr, grpo.max_steps, grpo.batch_size, grpo.rollouts, grpo.kl_coef) == (1e-6, 200, 64, 8, 0.003)
    assert (collab.lr, collab.max_steps, collab.batch_size, collab.rollouts, collab.kl_coef) == (1e-5, 50, 2, 4, 0.0)
    assert (grpo.response_budget, collab.response_budget) == (1024, 1024)
    assert reflector().response_budget == agent().response_budget == 600


def test_one_trl_builder_gives_both_kinds_the_same_grpo_arguments(tmp_path: Path) -> None:
    ctx = TrainContext(tmp_path, "s", 0, "none", "run")
    shared = grpo_args(reflector(), ctx, [1.0])
    mine = online_args(agent(), ctx)
    assert mine.pop("generation_kwargs") == {"max_new_tokens": agent().max_turn_tokens}  # the agent's reply cap
    assert mine.pop("reward_weights") == agent().reward.as_list()
    assert shared.pop("reward_weights") == [1.0]
    assert mine == shared
    assert shared["max_completion_length"] == 600 and shared["scale_rewards"] == "none"  # dr_grpo's divisor
    assert shared["gradient_accumulation_steps"] == 4 * 3 // 2


def test_one_verl_builder_gives_both_kinds_the_same_policy_overrides(tmp_path: Path) -> None:
    where = {"model_path": "m", "out_dir": tmp_path, "experiment": "x"}
    reflector_keys = dict(o.split("=", 1) for o in grpo_overrides(reflector(), data_dir=tmp_path / "d", **where))
    agent_keys = dict(o.split("=", 1) for o in online_overrides(agent(), **where))
    policy = [k for k in reflector_keys if k.startswith(("algorithm.", "actor_rollout_ref.", "trainer."))]
    assert "actor_rollout_ref.actor.loss_scale_factor" in policy and len(policy) > 25
    differ = {k for k in policy if reflector_keys[k] != agent_keys.get(k)}
    assert differ == set()
    assert agent_keys["actor_rollout_ref.rollout.mode"] == "async"  # what the agent loop adds on top
    assert "trainer.rollout_data_dir" in agent_keys and "trainer.rollout_data_dir" not in reflector_keys
    assert not any(k.startswith("reward.") for k in agent_keys)  # the agent's reward comes from its loop


@pytest.mark.parametrize("stage", [reflector, agent])
def test_a_stage_override_comes_last(stage, tmp_path: Path) -> None:
    chosen = stage().model_copy(update={"overrides": ["trainer.save_freq=3"]})
    where = {"model_path": "m", "out_dir": tmp_path, "experiment": "x"}
    out = (
        grpo_overrides(chosen, data_dir=tmp_path, **where)
        if isinstance(chosen, GRPOStage)
        else online_overrides(chosen, **where)
    )
    assert out[-1] == "trainer.save_freq=3"
