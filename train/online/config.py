"""The recipe stage `collab_grpo`: multi-turn GRPO of the agent inside the collab environment (TRL on one node, or
verl on GPU clusters through its agent loop)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from memrl.core.schema import StrictModel
from memrl.envs.collab.rl import CollabRLConfig
from memrl.rewards.collab_outcome import OutcomeWeights
from memrl.train.config import ClusterConfig, LoggingTarget, LoraConfig
from memrl.train.placement import Placement


class CollabGRPOStage(StrictModel):
    """The policy is the agent: each GRPO group plays one session (user, problem, knowledge) `rollouts` times."""

    kind: Literal["collab_grpo"]
    trainer: Literal["trl", "verl"] = Field(
        default="trl",
        description="trl: in-process on CPU or one GPU, accelerate on several; verl: its agent loop on vLLM",
    )
    model: str = Field(description="a key of the recipe's `models`: the base model")
    init: str | None = Field(default=None, description="an sft stage of this recipe (or a checkpoint) to start from")
    env: CollabRLConfig = Field(default_factory=CollabRLConfig, description="the sessions and the simulated user")
    reward: OutcomeWeights = Field(default_factory=OutcomeWeights, description="weights of the reward parts")
    lora: LoraConfig | None = Field(default_factory=LoraConfig, description="null: full fine-tuning")
    lr: PositiveFloat = 1e-5
    max_steps: PositiveInt = 50
    batch_size: PositiveInt = Field(default=2, description="sessions per step")
    micro_batch_size: PositiveInt = Field(default=1, description="per device, in episodes")
    rollouts: PositiveInt = Field(default=4, description="episodes per session (the GRPO group)")
    kl_coef: NonNegativeFloat = Field(default=0.0, description="KL loss coefficient; 0 drops the reference model")
    loss: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    max_turn_tokens: PositiveInt = Field(default=128, description="tokens of one agent reply")
    max_episode_tokens: PositiveInt = Field(
        default=1024,
        description="tokens of a whole episode after its prompt; an episode that would overrun it is "
        "stopped and gets no reward (counted as episode/over_budget)",
    )
    max_prompt_length: PositiveInt = Field(
        default=2048, description="trainer verl: the policy's context and the user's opening (verl left-cuts longer)"
    )
    temperature: PositiveFloat = 1.0
    checkpoints: LoggingTarget = LoggingTarget()
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig, description="where it runs (TRL: launch size; verl: Ray)"
    )
    placement: Placement = Field(
        default_factory=Placement, description="trainer verl: the user model on reserved GPUs of this node or elsewhere"
    )
    overrides: list[str] = Field(
        default_factory=list, description="extra GRPOConfig fields (trl) or Hydra overrides (verl), name=value"
    )

    @model_validator(mode="after")
    def _one_reply_fits(self) -> CollabGRPOStage:
        if self.max_episode_tokens <= self.max_turn_tokens:
            raise ValueError("max_episode_tokens must exceed max_turn_tokens: no reply would fit")
        return self

    @model_validator(mode="after")
    def _actors_for_trl(self) -> CollabGRPOStage:
        if self.trainer == "verl" and self.env.workers is not None:
            raise ValueError(
                "env.workers is for trainer trl: verl already runs each episode inside its own AgentLoopWorker Ray "
                "actors; remove env.workers"
            )
        return self
