"""Online GRPO on TRL (`collab_grpo`, `tod_grpo`): the policy trained on whole episodes of a world with its simulated
user, on one node (CPU ok)."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

from memrl.core import interrupts
from memrl.core.checkpoints import tokenizer_source
from memrl.train.distributed import world_size
from memrl.train.endpoints import per_process
from memrl.train.hf_trainer import TrainContext, apply_overrides, resume_point
from memrl.train.online.charts import outcome_chart
from memrl.train.online.chat_tokens import TurnTokens
from memrl.train.online.config import OnlineGRPOStage
from memrl.train.online.episodes import episode_rows, episode_source
from memrl.train.online.rollout import Player
from memrl.train.stage_run import CURVES_FILE
from memrl.train.trl.common import StepLog, cheap_dropout_masks, project_labelled_tokens_only, save_final
from memrl.train.trl.grpo import grpo_args, policy_model, policy_sampling_trainer_class
from memrl.train.trl.online_rollout import EPISODES_FILE, EpisodeRollout
from memrl.train.trl.rewards import episode_funcs


def online_args(stage: OnlineGRPOStage, ctx: TrainContext) -> dict[str, Any]:
    """The GRPO fields every stage shares, plus TRL's generation cap: one agent reply (max_completion_length is the
    whole episode's budget)."""
    return grpo_args(stage, ctx, stage.reward.as_list()) | {
        "generation_kwargs": {"max_new_tokens": stage.max_turn_tokens}
    }


def train_online_grpo(stage: OnlineGRPOStage, base_model: str, ctx: TrainContext) -> Path:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    rows = episode_rows(stage.env)  # a bad task, problem file or data folder fails here, before any model loads
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(stage.init or base_model))
    config = GRPOConfig(**apply_overrides(GRPOConfig, online_args(stage, ctx), stage.overrides, ctx.stage))
    model, lora, base = policy_model(stage, base_model)
    project_labelled_tokens_only()
    with contextlib.ExitStack() as stack:  # the episodes' actors (env.workers) and clients end with the run
        # each of the launch's processes plays its own sessions: the user model's bound is shared among them
        episodes = episode_source(per_process(stage.env, world_size(), "env"), stage.max_turn_tokens)
        stack.callback(episodes.close)
        player = Player(episodes, TurnTokens.of(tokenizer), stage.max_turn_tokens, stage.max_episode_tokens)
        resumed = resume_point(ctx.out_dir)
        rollout = EpisodeRollout(player, StepLog(ctx.out_dir / EPISODES_FILE, resumed))
        stack.callback(rollout.close)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
            trainer = policy_sampling_trainer_class()(
                model=model,
                reward_funcs=[*episode_funcs(type(stage.reward))],
                args=config,
                train_dataset=Dataset.from_dict({"prompt": rows}),
                processing_class=tokenizer,
                peft_config=lora,
                rollout_func=rollout,
            )
        cheap_dropout_masks(trainer)
        try:
            trainer.train(resume_from_checkpoint=resumed)
        finally:  # a failed run's curves are worth seeing too; a stopped one's are drawn when it resumes
            if trainer.is_world_process_zero() and not interrupts.stopping():
                title, parts = f"{ctx.run_name}: reward parts", stage.reward.names()
                outcome_chart(trainer.state.log_history, ctx.out_dir / CURVES_FILE, title, parts)
    return save_final(trainer, tokenizer, ctx, base=base, trainer_name=f"trl-{stage.world}-grpo")
