"""The one way to drive an environment: a conversation stepped reply by reply, gymnasium's reset/step for dialogue.

Evaluation, data generation and online RL all run an episode the same way:

    observation = await episode.reset(seed=seed)         # the environment speaks first
    while not (step := await episode.step(reply_to(observation))).done:
        observation = step.observation
    episode.record()                                     # what the environment writes to disk

`play` is that loop. The policy only ever sees `Message` lists; whatever it knows beyond the text it writes
(what it retrieved, whether its output parsed) it hands to `step` as keyword annotations for the record.
As in Gymnasium, a step ends the episode by `terminated` (the environment reached an end of its own: the user
ended the session, the task was resolved or acted on) or by `truncated` (a limit cut it: the turn limit); `done` is
either. `envs/checker.py` checks an environment against this contract.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from memrl.rollout.base import Message

T = TypeVar("T")

# What a policy returns: the reply's text, or the text and the annotations `step` takes with it.
PolicyReply = str | tuple[str, Mapping[str, Any]]
Policy = Callable[[list[Message]], Awaitable[PolicyReply]]


@dataclass(frozen=True)
class Step:
    """What one reply earned.

    `observation` is the conversation so far (a fresh list the caller may keep or change), ending with the
    environment's answer to the reply unless the episode is over. `reward` holds the reward parts this step
    earned; the final step carries the episode's outcome parts. The last step, and only it, is `terminated` (the
    episode reached its own end) or `truncated` (a limit cut it short), never both; `done` is either. `info` is
    diagnostics the environment chooses to expose (never needed to drive the loop).
    """

    observation: list[Message]
    reward: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The episode is over: what a driver reads to stop stepping."""
        return self.terminated or self.truncated


class Episode(Protocol):
    """One episode of a conversational environment.

    `reset` starts (or restarts) it and returns the first observation; with a `seed`, whatever the environment
    draws itself (a rule user's phrasing, an LLM user's sampling) is drawn from it, so two resets with one seed play
    alike under the same replies; None draws as the environment was built to. `step` takes the policy's reply and
    any annotations the environment documents (unknown ones are an error), and may be called until a step comes
    back `done`, never after; `record` is the finished episode's record, plain JSON, available once done.
    """

    async def reset(self, *, seed: int | None = None) -> list[Message]: ...

    async def step(self, reply: str, **annotations: Any) -> Step: ...

    def record(self) -> dict[str, Any]: ...


def check_step(episode: object, unknown: Mapping[str, Any], live: T | None, *, over: bool) -> T:
    """What every `step` refuses: annotations the environment does not document, a step before `reset` (`live`,
    what reset set up, is still None), and a step after the one that was done. Returns `live`."""
    if unknown:
        raise TypeError(f"{type(episode).__name__}.step takes no annotation {', '.join(sorted(unknown))}")
    if live is None:
        raise RuntimeError("reset the episode before stepping it")
    if over:
        raise RuntimeError("the episode is over: reset it to start again")
    return live


def split_reply(reply: PolicyReply) -> tuple[str, Mapping[str, Any]]:
    """A policy's reply as the text and the annotations `step` takes."""
    return (reply, {}) if isinstance(reply, str) else reply


async def play(episode: Episode, policy: Policy, *, seed: int | None = None) -> Step:
    """Reset `episode` (with `seed`), then step it with `policy`'s replies until done; returns the final step."""
    observation = await episode.reset(seed=seed)
    while True:
        text, annotations = split_reply(await policy(observation))
        step = await episode.step(text, **annotations)
        if step.done:
            return step
        observation = step.observation
