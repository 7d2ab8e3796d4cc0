"""A world served to outside trainers through the registry alone (docs/online-rl.md, "Adding a world"): a toy world
whose entry has a served half, and nothing in memrl.integrations or the CLI naming it, is built by name
(`world_config`, `build_world`, `system_prompt`), played as an OpenEnv environment, loaded as a verifiers environment
with its own metrics, and gets its `memrl world serve` command."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from support.echo import Echo

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.checker import check_episode
from memrl.envs.episode import PolicyReply, play
from memrl.envs.registry import WORLDS, World, register, served_worlds
from memrl.envs.served import Served, no_options
from memrl.integrations.worlds import build_world, system_prompt, world_config
from memrl.rollout.base import Message

WORDS = ("apple", "river", "stone")


class ToyWorldConfig(StrictModel):
    """The toy world's flags."""

    max_turns: int = Field(default=2, ge=1, le=10, description="replies per episode")


class ToyWorld:
    name = "toy"

    def __init__(self, cfg: ToyWorldConfig) -> None:
        self.cfg = cfg
        self.closed = False

    def episode(self, seed: int, **unknown: Any) -> Echo:
        no_options(self.name, unknown)
        return Echo(random.Random(seed).choice(WORDS), self.cfg.max_turns)

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float:
        return parts["hit"]

    def close(self) -> None:
        self.closed = True


TOY = Served(
    ToyWorldConfig,
    ToyWorld,
    help="A toy: the user asks for a word until the agent says it.",
    metrics=("hit", "replies"),
    system=lambda reply_tokens: f"Say what the user asks for, in at most {reply_tokens} tokens.",
)


@pytest.fixture
def toy() -> Iterator[World]:
    entry = register(World("toy", "a toy served to outside trainers only", served=TOY))
    try:
        yield entry
    finally:
        del WORLDS["toy"]


async def _say_it(observation: list[Message]) -> PolicyReply:
    """A policy that gets it right the second time."""
    if len(observation) == 1:
        return "Pear?"
    return observation[0]["content"].removeprefix("Say the word ").removesuffix(".")


def test_a_registered_world_is_served_by_name(toy: World) -> None:
    assert list(served_worlds()) == ["collab", "tod", "pahf", "toy"]  # table order
    assert world_config("toy") is ToyWorldConfig
    assert system_prompt("toy", 32) == "Say what the user asks for, in at most 32 tokens."
    world = build_world("toy", {"max_turns": 3})
    assert isinstance(world, ToyWorld) and world.cfg == ToyWorldConfig(max_turns=3)
    assert build_world("toy", ToyWorldConfig()).cfg.max_turns == 2  # a model is taken as it is
    episode = world.episode(7)
    asyncio.run(check_episode(episode, _say_it))
    step = asyncio.run(play(world.episode(7), _say_it, seed=7))
    assert step.terminated and world.reward(episode.record(), step.reward) == 1.0
    with pytest.raises(ValueError, match="world toy: an episode takes no option colour"):
        world.episode(7, colour="red")
    with pytest.raises(ConfigError, match=r"^world toy: .*max_turns") as bad:
        build_world("toy", {"max_turns": 0})
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match=r"^unknown world 'chess' \(worlds: collab, tod, pahf, toy\)$"):
        build_world("chess")


def test_a_world_without_a_served_half_is_not_served() -> None:
    entry = register(World("quiet", "not trained online"))
    try:
        assert "quiet" not in served_worlds()
        with pytest.raises(ConfigError, match=r"^unknown world 'quiet' \(worlds: collab, tod, pahf\)$"):
            world_config("quiet")
    finally:
        del WORLDS[entry.name]


def test_a_registered_world_is_an_openenv_environment(toy: World) -> None:
    pytest.importorskip("openenv")
    from memrl.integrations.openenv import WorldAction, WorldEnvironment

    env = WorldEnvironment(build_world("toy"))
    first = env.reset(seed=7)
    word = first.messages[0]["content"].removeprefix("Say the word ").removesuffix(".")
    assert not env.step(WorldAction(reply="Pear?")).done
    last = env.step(WorldAction(reply=word))
    assert last.done and last.reward == 1.0 and last.reward_parts == {"hit": 1.0, "replies": 2.0}
    assert last.record == {"word": word, "replies": ["Pear?", word]}


def test_a_registered_world_is_a_verifiers_environment(toy: World) -> None:
    pytest.importorskip("verifiers")
    from memrl.integrations.verifiers import load_environment

    env = load_environment(world="toy", num_examples=2, seed=7, max_turns=3)
    rows = env.get_dataset().to_list()
    assert [json.loads(r["info"]) for r in rows] == [{"seed": 7, "world": "toy"}, {"seed": 8, "world": "toy"}]
    assert rows[0]["prompt"][0] == {"role": "system", "content": system_prompt("toy")}
    names = env.rubric._get_reward_func_names()  # the reward, the served half's metrics, and verifiers' own
    assert names[:3] == ["reward", "hit", "replies"]


def test_a_registered_world_gets_its_serve_command(toy: World) -> None:
    """`memrl world serve` lists a world registered before the CLI reads the table, with its help and flags."""
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]  # the test, tests/support
        import {Path(__file__).stem} as toy
        from memrl.envs.registry import World, register
        register(World("toy", "served only", served=toy.TOY))
        from memrl.app.cli.main import main
        for argv in (["world", "serve", "--help"], ["world", "serve", "toy", "--help"], ["world", "play", "--help"]):
            try:
                main(argv)
            except SystemExit:
                pass
    """)
    env = {"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=300, check=True
    )
    out = done.stdout
    assert "A toy: the user asks for a word until the agent says it." in out
    assert "--max-turns" in out and "replies per episode" in out
    assert "the world served: collab | tod | pahf | toy" in out
