"""What an environment hands an online RL trainer: one episode per dataset row, and how the policy sees it.

A trainer's dataset holds one `spec` string per row (JSON the environment wrote); `EpisodeSource(spec)` builds a
fresh `OnlineEpisode` for every rollout of that row. The trainer renders `context + observation` as the policy's
prompt, turns each sampled reply into a step with `read_reply`, and appends the environment's turns itself.

The two halves can live apart: `PolicyView` (context and `read_reply`) is cheap and stays with the trainer, while
the `Episode` itself (a user simulator, maybe an LLM client) may run on a Ray actor (`envs/episode_actors.py`),
built there by the world's `Episodes`. A world's `OnlineConfig` says which rows a policy trains on and builds its
`Episodes`; `envs/registry.py` names the worlds that have both halves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from memrl.core.schema import StrictModel
from memrl.envs.episode import Episode, PolicyReply
from memrl.rollout.base import Message

if TYPE_CHECKING:
    from memrl.rollout.config import ModelConfig


@dataclass(frozen=True)
class PolicyView:
    """How the policy sees a row's episode, built without the environment."""

    context: list[Message]  # what the policy sees before the episode's first observation (its system prompt)
    read_reply: Callable[[str], PolicyReply]  # the policy's raw text -> the reply and annotations `step` takes
    # The first observation as far as the row tells it (a user simulator may phrase it otherwise): what a trainer
    # measures a prompt by before any episode runs (verl drops over-long prompts from its dataset).
    opening: list[Message]


@dataclass(frozen=True)
class OnlineEpisode:
    episode: Episode
    context: list[Message]  # what the policy sees before the episode's first observation (its system prompt)
    read_reply: Callable[[str], PolicyReply]  # the policy's raw text -> the reply and annotations `step` takes


class Episodes(Protocol):
    """A world's fresh episodes by spec, built with its resources (a user simulator, a grader): the half an actor
    runs (`CollabEpisodes`, `TodEpisodes`)."""

    def episode(self, spec: str) -> Episode: ...

    def close(self) -> None: ...


class OnlineConfig(StrictModel):
    """A world's online section (the `env` of its `<world>_grpo` stage): the rows a policy trains on and the
    resources their episodes are played with. Each world declares the fields below in its own order."""

    if TYPE_CHECKING:  # fields of every world's config; pydantic reads only the subclass's own
        seed: int
        workers: int | None  # step the episodes on this many Ray actors; None: in-process
        ray_address: str | None
        user_model: ModelConfig | None  # the LLM behind the simulated user, if any (its key never lands in data)

    refs: ClassVar[tuple[str, ...]] = ()  # path fields a recipe may fill with the name of an earlier stage

    def rows(self) -> list[str]:
        """One JSON spec per episode to train on, in order."""
        raise NotImplementedError

    def episodes(self) -> Episodes:
        """These rows' episodes, built with their resources (a user simulator, a grader, an LLM client)."""
        raise NotImplementedError

    def plays(self) -> str:
        """What the episodes are, in words (a stage's description): `... episodes per session {plays}`."""
        raise NotImplementedError


EpisodeSource = Callable[[str], OnlineEpisode]
ViewSource = Callable[[str], PolicyView]  # spec -> how the policy sees it: the half the trainer keeps
