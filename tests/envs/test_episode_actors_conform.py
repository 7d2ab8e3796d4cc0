"""The episode an online trainer plays on a Ray actor (`envs/episode_actors.RemoteEpisode`) keeps the protocol that
`check_episode` checks, as the in-process collab episode does (tests/envs/test_episode_checker.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from support import local_ray

from memrl.envs.checker import check_episode
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import AnswerKind, Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.rows import CollabEpisodes, policy_view, session_rows
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.envs.episode import PolicyReply
from memrl.envs.episode_actors import ActorEpisodes, RemoteEpisode
from memrl.rollout.base import Message

pytestmark = pytest.mark.slow  # starts a Ray actor


@pytest.fixture(scope="module", autouse=True)
def ray_up() -> Iterator[None]:

    with local_ray(num_cpus=1, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}):
        yield


def test_an_episode_played_on_an_actor_conforms() -> None:
    user = UserProfile("u1", "A baker", ("blunt", "no-suggestions", "three-sentences"))
    problem = Problem("arith-x", "arith", "A pen costs $3. How much do 4 pens cost?", "12", AnswerKind.MATH)
    (row,) = session_rows([user], {"u1": [problem]}, "none", "text")
    source = ActorEpisodes(
        lambda spec: policy_view(spec, 64), CollabEpisodes, (RuleUserSimulator(Grader()), Grader(), 3), workers=1
    )
    try:
        online = source(row)
        assert isinstance(online.episode, RemoteEpisode)

        async def policy(observation: list[Message]) -> PolicyReply:
            return online.read_reply("Sorry, is it 15?" if len(observation) < 3 else "It is 12.")

        asyncio.run(check_episode(online.episode, policy))
    finally:
        source.close()
