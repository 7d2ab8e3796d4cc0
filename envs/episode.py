"""The one way to drive an environment: a conversation stepped reply by reply, gymnasium's reset/step for dialogue.

Evaluation, data generation and online RL all run an episode the same way:

    observation = await episode.reset()                  # the environment speaks first
    while not (step := await episode.step(reply_to(observation))).done:
        observation = step.observation
    episode.record()                                     # what the environment writes to disk

`play` is that loop. The policy only ever sees `Message` lists; whatever it knows beyond the text it writes
(what it retrieved, whether its output parsed) it hands to `step` as keyword annotations for the record.
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
    earned; the final step carries the episode's outcome parts. `done` is true exactly once, on the last step.
    `info` is diagnostics the environment chooses to expose (never needed to drive the loop).
    """

    observation: list[Message]
    reward: dict[str, float] = field(default_factory=dict)
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Episode(Protocol):
    """One episode of a conversational environment.

    `reset` starts (or restarts) it and returns the first observation; `step` takes the policy's reply and any
    annotations the environment documents (unknown ones are an error), and may be called until a step comes back
    `done`, never after; `record` is the finished episode's record, plain JSON, available once done.
    """

    async def reset(self) -> list[Message]: ...

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


async def play(episode: Episode, policy: Policy) -> Step:
    """Reset `episode`, then step it with `policy`'s replies until done; returns the final step."""
    observation = await episode.reset()
    while True:
        out = await policy(observation)
        text, annotations = (out, {}) if isinstance(out, str) else out
        step = await episode.step(text, **annotations)
        if step.done:
            return step
        observation = step.observation
