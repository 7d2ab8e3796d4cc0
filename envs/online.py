"""What an environment hands an online RL trainer: one episode per dataset row, and how the policy sees it.

A trainer's dataset holds one `spec` string per row (JSON the environment wrote); `EpisodeSource(spec)` builds a
fresh `OnlineEpisode` for every rollout of that row. The trainer renders `context + observation` as the policy's
prompt, turns each sampled reply into a step with `read_reply`, and appends the environment's turns itself.

The two halves can live apart: `PolicyView` (context and `read_reply`) is cheap and stays with the trainer, while
the `Episode` itself (a user simulator, maybe an LLM client) may run on a Ray actor (`envs/episode_actors.py`),
built there by the world's `Episodes`. `envs/registry.py` names the worlds that have both halves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from memrl.envs.episode import Episode, PolicyReply
from memrl.rollout.base import Message


@dataclass(frozen=True)
class PolicyView:
    """How the policy sees a row's episode, built without the environment."""

    context: list[Message]  # what the policy sees before the episode's first observation (its system prompt)
    read_reply: Callable[[str], PolicyReply]  # the policy's raw text -> the reply and annotations `step` takes


@dataclass(frozen=True)
class OnlineEpisode:
    episode: Episode
    context: list[Message]  # what the policy sees before the episode's first observation (its system prompt)
    read_reply: Callable[[str], PolicyReply]  # the policy's raw text -> the reply and annotations `step` takes


class Episodes(Protocol):
    """A world's fresh episodes by spec, built with its resources (a user simulator, a grader): the half an actor
    runs (an in-process source such as `CollabEpisodes`)."""

    def episode(self, spec: str) -> Episode: ...

    def close(self) -> None: ...


EpisodeSource = Callable[[str], OnlineEpisode]
ViewSource = Callable[[str], PolicyView]  # spec -> how the policy sees it: the half the trainer keeps
