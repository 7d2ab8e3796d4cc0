"""The recipe stages of online RL: `<world>_grpo` for every world the registry says trains online (`collab_grpo`,
`tod_grpo`): multi-turn GRPO of the policy inside the world (TRL on one node, or verl on GPU clusters through its
agent loop). One schema, `OnlineGRPOStage`; each world's stage adds its kind and the types of its `env` (the rows
and their episodes) and `reward` (the parts and their weights), both from `memrl.envs.registry`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, create_model, model_validator

from memrl.envs.online import OnlineConfig
from memrl.envs.registry import online, online_worlds
from memrl.rewards.episode import PartWeights
from memrl.train.config import OnlineTrainer, PolicyOptimStage, trainers_help

ENV_HELP, REWARD_HELP = "the sessions and the simulated user", "weights of the reward parts"


class OnlineGRPOStage(PolicyOptimStage):
    """The policy plays the world: each GRPO group plays one row (a session) `rollouts` times."""

    layout_kind: ClassVar[str] = "online_grpo"  # its kind to the trainer backends (train/registry.py)

    trainer: OnlineTrainer = Field(default="trl", description=trainers_help("online_grpo"))
    kind: str
    env: OnlineConfig = Field(description=ENV_HELP)
    reward: PartWeights = Field(description=REWARD_HELP)
    lr: PositiveFloat = 1e-5
    max_steps: PositiveInt = 50
    batch_size: PositiveInt = Field(default=2, description="sessions per step")
    rollouts: PositiveInt = Field(default=4, description="episodes per session (the GRPO group)")
    kl_coef: NonNegativeFloat = Field(default=0.0, description="KL loss coefficient; 0 drops the reference model")
    max_turn_tokens: PositiveInt = Field(default=128, description="tokens of one agent reply")
    max_episode_tokens: PositiveInt = Field(
        default=1024,
        description="tokens of a whole episode after its prompt; an episode that would overrun it is "
        "stopped and gets no reward (counted as episode/over_budget)",
    )

    @property
    def world(self) -> str:
        """The world the stage plays (its kind is `<world>_grpo`)."""
        return self.kind.removesuffix("_grpo")

    @property
    def response_budget(self) -> int:
        return self.max_episode_tokens

    @model_validator(mode="after")
    def _one_reply_fits(self) -> OnlineGRPOStage:
        if self.max_episode_tokens <= self.max_turn_tokens:
            raise ValueError("max_episode_tokens must exceed max_turn_tokens: no reply would fit")
        return self

    @model_validator(mode="after")
    def _actors_for_trl(self) -> OnlineGRPOStage:
        if self.trainer == "verl" and self.env.workers is not None:
            raise ValueError(
                "env.workers is for trainer trl: verl already runs each episode inside its own AgentLoopWorker Ray "
                "actors; remove env.workers"
            )
        return self


def online_stage(world: str) -> type[OnlineGRPOStage]:
    """The schema of world `world`'s stage, `<world>_grpo`: its `env` and `reward` are the world's own types."""
    entry = online(world)
    config, reward = entry.config, entry.reward
    kind = f"{world}_grpo"
    required = any(field.is_required() for field in config.model_fields.values())  # no default env to fall back on
    env = Field(description=ENV_HELP) if required else Field(default_factory=config, description=ENV_HELP)
    schema = create_model(
        f"{world.title()}GRPOStage",
        __base__=OnlineGRPOStage,
        __doc__=OnlineGRPOStage.__doc__,
        kind=(Literal[kind], ...),
        env=(config, env),
        reward=(reward, Field(default_factory=reward, description=REWARD_HELP)),
    )
    return schema


# world -> its stage's schema
STAGES: dict[str, type[OnlineGRPOStage]] = {name: online_stage(name) for name in online_worlds()}
