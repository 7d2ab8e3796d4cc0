"""The conformance checker on a toy environment, correct and broken one rule at a time, and the registry of worlds.

The checker's runs on the real worlds (collab with the rule user, TOD's proactive loop, a PAHF task) are beside
their other protocol tests, in test_episode.py and test_episode_worlds.py.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from memrl.core.errors import MemrlError
from memrl.envs.checker import NonConforming, check_episode
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.rows import CollabEpisodes, CollabRLConfig, session_rows
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.envs.episode import PolicyReply, Step, check_step
from memrl.envs.registry import WORLDS, Online, online, online_worlds, world
from memrl.rollout.base import Message


class Countdown:
    """A correct toy world: the user opens with a number drawn from the seed; three replies, then time is up."""

    turns = 3

    def __init__(self) -> None:
        self._said: list[Message] | None = None
        self._replies = 0
        self._rng = random.Random()

    def _over(self) -> bool:
        return self._replies >= self.turns

    def _refused(self) -> bool:
        """What `step` refuses: any step once the episode is over."""
        return self._over()

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        self._rng = random.Random(seed)
        self._said, self._replies = [{"role": "user", "content": f"count from {self._rng.random()}"}], 0
        return list(self._said)

    async def step(self, reply: str, *, loud: bool = False, **unknown: Any) -> Step:
        said = check_step(self, unknown, self._said, over=self._refused())
        said.append({"role": "assistant", "content": reply.upper() if loud else reply})
        self._replies += 1
        if self._over():
            return Step(list(said), {"replies": float(self._replies)}, truncated=True, info={"ended_by": "time"})
        said.append({"role": "user", "content": f"then {self._rng.random()}"})
        return Step(list(said))

    def record(self) -> dict[str, Any]:
        if self._said is None or not self._over():
            raise RuntimeError("no record before the last step")
        return {"turns": list(self._said), "replies": self._replies}


async def _count(observation: list[Message]) -> PolicyReply:
    return str(len(observation)), {"loud": len(observation) > 1}


def _check(episode: Any) -> None:
    asyncio.run(check_episode(episode, _count, seed=3))


def test_a_correct_toy_world_passes() -> None:
    _check(Countdown())


class BothEnds(Countdown):
    async def step(self, reply: str, **annotations: Any) -> Step:
        step = await super().step(reply, **annotations)
        return Step(step.observation, step.reward, step.done, step.done, step.info)


class Endless(Countdown):
    turns = 10**6


class StepsAfterTheEnd(Countdown):
    def _refused(self) -> bool:
        return False


class TakesAnything(Countdown):
    async def step(self, reply: str, **annotations: Any) -> Step:
        return await super().step(reply, loud=bool(annotations.get("loud")))


class TupleRecord(Countdown):
    def record(self) -> dict[str, Any]:
        return super().record() | {"turns": tuple(super().record()["turns"])}


class RecordsEarly(Countdown):
    def record(self) -> dict[str, Any]:
        return {"turns": list(self._said or []), "replies": self._replies}


class Unseeded(Countdown):
    async def reset(self, *, seed: int | None = None) -> list[Message]:
        return await super().reset(seed=None)


class Drifts(Countdown):
    """Opens alike under one seed, then draws from a source the seed does not reach."""

    async def step(self, reply: str, **annotations: Any) -> Step:
        self._rng = random.Random()
        return await super().step(reply, **annotations)


class StepsBeforeReset(Countdown):
    def __init__(self) -> None:
        super().__init__()
        self._said = []


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (BothEnds, "step 3 is both terminated and truncated"),
        (Endless, "no step was done in 1000 steps"),
        (StepsAfterTheEnd, r"step\(\) after the done step did not raise"),
        (TakesAnything, r"step\(\) took the unknown annotation"),
        (TupleRecord, "does not survive a JSON round trip"),
        (RecordsEarly, r"record\(\) answered before the episode was done"),
        (Unseeded, "two resets with seed 3 opened differently"),
        (Drifts, "step 1 differed when replayed"),
        (StepsBeforeReset, r"step\(\) before reset\(\) did not raise"),
    ],
)
def test_each_broken_rule_fails_the_check_saying_which(broken: type[Countdown], says: str) -> None:
    with pytest.raises(NonConforming, match=says):
        _check(broken())


def test_a_step_that_is_not_a_step_or_an_observation_that_is_not_messages_fails() -> None:
    class Untyped(Countdown):
        async def step(self, reply: str, **annotations: Any) -> Step:
            step = await super().step(reply, **annotations)
            return Step([{"role": "narrator", "content": 1}], step.reward, step.terminated, step.truncated)  # type: ignore[list-item]

    with pytest.raises(NonConforming, match="step 1's observation is not a list of messages"):
        _check(Untyped())


# --- the registry -----------------------------------------------------------------------------------------------


def test_the_registry_builds_collab_episodes_from_rows_and_they_conform() -> None:
    from memrl.envs.collab.problems import AnswerKind, Problem
    from memrl.envs.collab.profiles import UserProfile

    collab = online("collab")
    assert collab is WORLDS["collab"].online and collab.config is CollabRLConfig
    user = UserProfile("u1", "A baker", ("blunt", "no-suggestions", "three-sentences"))
    problem = Problem("arith-x", "arith", "A pen costs $3. How much do 4 pens cost?", "12", AnswerKind.MATH)
    (row,) = session_rows([user], {"u1": [problem]}, "none", "text")
    episodes = CollabEpisodes(RuleUserSimulator(Grader()), Grader(), 3)
    view = collab.view(row, 64)
    assert view.context[0]["role"] == "system" and view.read_reply("12") == ("12", {"parse_failed": False})

    async def policy(observation: list[Message]) -> PolicyReply:
        return view.read_reply("Sorry, is it 15?" if len(observation) < 3 else "It is 12.")

    asyncio.run(check_episode(episodes.episode(row), policy))
    assert json.loads(row)["key"] == "u1/0"


@pytest.mark.parametrize("name", sorted(set(WORLDS) - set(online_worlds())))
def test_worlds_not_yet_trainable_online_say_why(name: str) -> None:
    assert not isinstance(WORLDS[name].online, Online)
    with pytest.raises(MemrlError, match=f"{name}' cannot be trained online: .+ \\(trainable: collab, tod\\)"):
        online(name)
    with pytest.raises(MemrlError, match=r"unknown world 'chess' \(worlds: collab, tod, pahf\)"):
        world("chess")
