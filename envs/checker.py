"""Does an environment keep the episode protocol (memrl.envs.episode)? `check_episode`, as Gymnasium's check_env.

It plays one episode with a policy and replays it, and raises `NonConforming` at the first rule broken: reset
returns messages; stepping before reset, after the last step, or with an annotation the environment does not
document raises; exactly the last step is done, never both terminated and truncated; the record exists only once
done and is plain JSON; two resets with one seed open alike and play alike under the same replies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from memrl.envs.episode import Episode, Policy, Step, split_reply

MAX_STEPS = 1000  # an episode still running after this many replies never ends
_UNKNOWN = "not_an_annotation_of_any_environment"
_ROLES = ("system", "user", "assistant")


class NonConforming(AssertionError):
    """The environment breaks the episode protocol; the message says which rule."""


def _messages(value: object, what: str) -> None:
    ok = isinstance(value, list) and all(
        isinstance(m, Mapping) and m.get("role") in _ROLES and isinstance(m.get("content"), str) for m in value
    )
    if not ok:
        raise NonConforming(f"{what} is not a list of messages ({{'role', 'content'}}): {value!r:.200}")


async def _raises(call: Any, rule: str, kind: type[BaseException] = Exception) -> None:
    try:
        await call
    except kind:
        return
    except Exception as exc:
        raise NonConforming(f"{rule}, but it raised {type(exc).__name__} instead of {kind.__name__}") from exc
    raise NonConforming(rule)


def _step(step: object, n: int) -> Step:
    if not isinstance(step, Step):
        raise NonConforming(f"step {n} returned {type(step).__name__}, not a Step")
    _messages(step.observation, f"step {n}'s observation")
    if not all(isinstance(k, str) and isinstance(v, int | float) for k, v in step.reward.items()):
        raise NonConforming(f"step {n}'s reward is not named numbers: {step.reward!r:.200}")
    if not isinstance(step.terminated, bool) or not isinstance(step.truncated, bool):
        raise NonConforming(f"step {n}'s terminated and truncated are not booleans")
    if step.terminated and step.truncated:
        raise NonConforming(f"step {n} is both terminated and truncated: an episode ends one way")
    return step


def _record(episode: Episode) -> None:
    try:
        record = episode.record()
    except Exception as exc:
        raise NonConforming(f"record() failed once the episode was done: {type(exc).__name__}: {exc}") from exc
    try:
        plain = json.loads(json.dumps(record, allow_nan=False)) == record
    except (TypeError, ValueError) as exc:
        raise NonConforming(f"record() is not plain JSON: {exc}") from exc
    if not plain:
        raise NonConforming("record() does not survive a JSON round trip (tuples, non-string keys?)")


Replies = list[tuple[str, Mapping[str, Any]]]


async def _play(episode: Episode, policy: Policy, seed: int) -> tuple[list[Any], Replies]:
    """One episode checked step by step: (the opening and every step, the replies given)."""
    opening = await episode.reset(seed=seed)
    _messages(opening, "reset()")
    await _raises(episode.step("", **{_UNKNOWN: True}), f"step() took the unknown annotation {_UNKNOWN}", TypeError)
    await _raises(_no_record(episode), "record() answered before the episode was done")
    seen: list[Any] = [opening]
    replies: Replies = []
    observation = opening
    for n in range(1, MAX_STEPS + 1):
        replies.append(split_reply(await policy(list(observation))))
        step = _step(await episode.step(replies[-1][0], **replies[-1][1]), n)
        seen.append(step)
        if step.done:
            return seen, replies
        observation = step.observation
    raise NonConforming(f"no step was done in {MAX_STEPS} steps")


async def _no_record(episode: Episode) -> None:
    episode.record()


def _facts(step: Step) -> tuple[Any, ...]:
    return step.observation, step.reward, step.terminated, step.truncated, step.info


async def check_episode(episode: Episode, policy: Policy, seed: int = 0) -> None:
    """Raise `NonConforming` unless `episode`, played by `policy`, keeps the protocol. `episode` must be fresh (the
    first check steps it before any reset); the replay gives it the replies `policy` gave, without asking again."""
    await _raises(episode.step(""), "step() before reset() did not raise")
    seen, replies = await _play(episode, policy, seed)
    _record(episode)
    await _raises(episode.step(replies[-1][0], **replies[-1][1]), "step() after the done step did not raise")
    if await episode.reset(seed=seed) != seen[0]:
        raise NonConforming(f"two resets with seed {seed} opened differently")
    for n, (text, notes) in enumerate(replies, 1):
        if _facts(_step(await episode.step(text, **notes), n)) != _facts(seen[n]):
            raise NonConforming(f"step {n} differed when replayed after a second reset with seed {seed}")
