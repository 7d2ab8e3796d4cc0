"""Online-RL episodes stepped on Ray actors (`envs/episode_actors.py`): the same trajectories as in-process, one call
per actor per round, an actor killed mid-rollout replayed once, killed twice failing its episodes only, and a
simulator that raises failing only its own episode."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import test_online_collab
from support import local_ray
from test_online_collab import _FailingSession

from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.rows import CollabEpisodes, CollabRLConfig, policy_view
from memrl.envs.collab.user_sim import RuleUserSimulator, UserSession, UserSimulator, UserTurn
from memrl.envs.episode_actors import ActorEpisodes
from memrl.envs.online import EpisodeSource
from memrl.train.online.chat_tokens import TurnTokens
from memrl.train.online.episodes import InProcess, episode_rows, in_process
from memrl.train.online.rollout import Generate, Player, Trajectory

pytestmark = pytest.mark.slow  # every test here starts Ray actors

REPLY_TOKENS = 64
ENV = CollabRLConfig(users=2, sessions=2, max_turns=3, agent="oracle", seed=0)
SPECS = [spec for spec in episode_rows(ENV) for _ in range(2)]  # 4 sessions x a GRPO group of 2
VIEW = partial(policy_view, reply_tokens=REPLY_TOKENS)


@pytest.fixture(scope="module", autouse=True)
def ray_up() -> Iterator[None]:
    import ray

    for module in (sys.modules[__name__], test_online_collab):  # actors need not import the tests folder
        ray.cloudpickle.register_pickle_by_value(module)
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with local_ray(num_cpus=2, runtime_env={"env_vars": env}):
        yield


@pytest.fixture(scope="module")
def turns(tiny_qwen2: str) -> TurnTokens:
    from transformers import AutoTokenizer

    return TurnTokens.of(AutoTokenizer.from_pretrained(tiny_qwen2))


def _reply(n: int) -> str:
    """The agent's JSON with a (wrong) number that depends on the context: a deterministic policy."""
    return json.dumps({"reasoning": "Answer it.", "response": f"- Add them.\n- The answer is {n}.\nTL;DR: {n}."})


def scripted(turns: TurnTokens, hook: Callable[[int], None] = lambda _: None) -> Generate:
    """Each context's reply is a function of its length; `hook(round)` runs before each round's replies."""
    rounds = 0

    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], None]:
        nonlocal rounds
        rounds += 1
        hook(rounds)
        return [
            [*turns.tokenizer.encode(_reply(len(c)), add_special_tokens=False), turns.end_of_turn] for c in contexts
        ], None

    return generate


def play(source: EpisodeSource, turns: TurnTokens, generate: Generate) -> list[Trajectory]:
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        return Player(source, turns, REPLY_TOKENS * 2, max_episode_tokens=1 << 16).play(SPECS, generate, loop)
    finally:
        loop.close()


def _episodes(cfg: CollabRLConfig) -> CollabEpisodes:
    return cfg.episodes()


def actors(factory: Callable[..., Any] = _episodes) -> ActorEpisodes:
    return ActorEpisodes(VIEW, factory, (ENV,), workers=2)


def same(t: Trajectory) -> tuple[Any, ...]:
    """What must not depend on where the episode ran (the record without its wall-clock times)."""
    record = None if t.record is None else {k: v for k, v in t.record.items() if k not in ("started_at", "finished_at")}
    return t.spec, t.prompt_ids, t.completion_ids, t.env_mask, t.status, record


@pytest.fixture(scope="module")
def reference(turns: TurnTokens) -> list[Trajectory]:
    """The batch played in-process."""
    return play(in_process(ENV, REPLY_TOKENS), turns, scripted(turns))


def replies(t: Trajectory) -> int:
    return sum(turn["role"] == "assistant" for turn in (t.record or {}).get("turns", []))


def kill(source: ActorEpisodes, actor: int) -> None:
    """Kill an actor as the OOM killer would, and wait until Ray has restarted it (a new process)."""
    import ray

    worker = source.pool.actors[actor]
    before = ray.get(worker.__ray_call__.remote(lambda _: os.getpid()))
    ray.kill(worker, no_restart=False)
    while True:
        try:
            if ray.get(worker.__ray_call__.remote(lambda _: os.getpid()), timeout=60) != before:
                return
        except ray.exceptions.RayActorError:  # restarting
            pass


def test_actors_play_the_same_trajectories_with_one_call_per_actor_per_round(
    turns: TurnTokens, reference: list[Trajectory]
) -> None:
    source = actors()
    marks: list[int] = []  # calls made before each round's replies
    try:
        played = play(source, turns, scripted(turns, lambda _: marks.append(len(source.calls))))
    finally:
        source.close()
    assert [t.status for t in reference] == ["done"] * len(SPECS)
    assert [same(t) for t in played] == [same(t) for t in reference]
    # Every round made one call per actor, carrying all that actor's live episodes (dealt round-robin).
    segments = [source.calls[a:b] for a, b in zip([0, *marks], [*marks, len(source.calls)], strict=True)]
    assert segments[0] == [("reset", 0, 4), ("reset", 1, 4)]
    for n, segment in enumerate(segments[1:], 1):
        live = [i for i, t in enumerate(reference) if replies(t) >= n]
        expected = [("step", a, sum(i % 2 == a for i in live)) for a in (0, 1) if any(i % 2 == a for i in live)]
        assert segment == expected, n
    assert source.replays == 0


@pytest.mark.parametrize("wait", [True, False], ids=["killed-between-calls", "killed-under-the-call"])
def test_an_actor_killed_mid_rollout_is_restarted_and_its_episodes_replayed_once(
    turns: TurnTokens, reference: list[Trajectory], wait: bool
) -> None:
    import ray

    def hook(n: int) -> None:
        if n == 2:  # waited for: the next call finds a new actor without the episodes; else Ray's error fails it
            kill(source, 0) if wait else ray.kill(source.pool.actors[0], no_restart=False)

    source = actors()
    try:
        played = play(source, turns, scripted(turns, hook))
    finally:
        source.close()
    assert [same(t) for t in played] == [same(t) for t in reference]
    on_actor_0 = [t for i, t in enumerate(reference) if i % 2 == 0 and replies(t) >= 2]
    assert source.replays == len(on_actor_0) > 0  # each live episode of the killed actor, once


def test_a_second_death_fails_those_episodes_and_nothing_else(turns: TurnTokens, reference: list[Trajectory]) -> None:
    source = actors()
    try:
        played = play(source, turns, scripted(turns, lambda n: kill(source, 0) if n in (2, 3) else None))
    finally:
        source.close()
    twice = {i for i, t in enumerate(reference) if i % 2 == 0 and replies(t) >= 3}
    assert twice  # some episodes of actor 0 were still playing at the second kill
    for i, (t, ref) in enumerate(zip(played, reference, strict=True)):
        if i in twice:
            assert t.status == "failed" and t.record is None
            assert t.error is not None and "EnvActorDied: env actor 0 died 2 times" in t.error, t.error
        else:
            assert same(t) == same(ref)


class _FirstUserFails(UserSimulator):
    def __init__(self, inner: UserSimulator, user: str) -> None:
        self.inner, self.user = inner, user

    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        session = self.inner.start(profile, problem, max_turns)
        return _FailingSession(session) if profile.id == self.user else session


class _PidUser(UserSimulator):
    """A user whose opening differs in every process, as a sampling LLM user's would: it cannot be replayed."""

    def __init__(self, inner: UserSimulator) -> None:
        self.inner = inner

    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        session = self.inner.start(profile, problem, max_turns)
        opening = session.open

        async def open_(greeting: str | None = None) -> UserTurn:
            turn = await opening(greeting)
            return dataclasses.replace(turn, response=f"{turn.response} (pid {os.getpid()})")

        session.open = open_  # type: ignore[method-assign]
        return session


def _pid_episodes(cfg: CollabRLConfig) -> CollabEpisodes:
    grader = Grader()
    return CollabEpisodes(_PidUser(RuleUserSimulator(grader, seed=cfg.seed)), grader, cfg.max_turns)


def test_an_episode_that_replays_differently_fails_saying_so(turns: TurnTokens, reference: list[Trajectory]) -> None:
    source = actors(_pid_episodes)
    try:
        played = play(source, turns, scripted(turns, lambda n: kill(source, 0) if n == 2 else None))
    finally:
        source.close()
    lost = {i for i, t in enumerate(reference) if i % 2 == 0 and replies(t) >= 2}
    assert source.replays == len(lost) > 0
    for i, t in enumerate(played):
        if i in lost:
            assert t.status == "failed" and t.error is not None
            assert t.error.startswith("ReplayDiverged: ") and "opened differently" in t.error, t.error
        else:
            assert t.status == "done"


def _failing_episodes(cfg: CollabRLConfig) -> CollabEpisodes:
    grader = Grader()
    user = json.loads(SPECS[0])["profile"]["id"]
    simulator = _FirstUserFails(RuleUserSimulator(grader, seed=cfg.seed), user)
    return CollabEpisodes(simulator, grader, cfg.max_turns)


def test_a_simulator_raising_on_its_actor_fails_only_its_episode(turns: TurnTokens) -> None:
    expected = play(InProcess(_failing_episodes(ENV), VIEW), turns, scripted(turns))
    source = actors(_failing_episodes)
    try:
        played = play(source, turns, scripted(turns))
    finally:
        source.close()
    failed = [i for i, t in enumerate(expected) if t.status == "failed"]
    assert failed and len(failed) < len(SPECS)
    for t, ref in zip(played, expected, strict=True):
        if ref.status == "failed":
            assert t.status == "failed" and t.error == f"RemoteEnvError: {ref.error}"
            assert (t.completion_ids, t.env_mask) == (ref.completion_ids, ref.env_mask)
        else:
            assert same(t) == same(ref)
    assert source.replays == 0
