"""A user's sessions as one episode (`MultiSessionEpisode`): the protocol, the notes carried, the later reward."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from memrl.envs.checker import check_episode
from memrl.envs.collab.agents import oracle_notes
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.multi_session import MultiSessionEpisode
from memrl.envs.collab.problems import load_problems
from memrl.envs.collab.profiles import sample_profiles
from memrl.envs.collab.scripted_reader import ScriptedReader
from memrl.envs.collab.session import SessionSpec
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.envs.episode import play

PROFILE = sample_profiles(1, 7)[0]
PROBLEMS = load_problems("arith")[:3]
NOTES = "The user wants bullet points. Be blunt."


def _episode(reflector: Any, sessions: int = 3) -> MultiSessionEpisode:
    grader = Grader()
    specs = [SessionSpec(PROFILE, problem, i) for i, problem in enumerate(PROBLEMS[:sessions])]
    return MultiSessionEpisode(specs, RuleUserSimulator(grader), grader, reflector=reflector, max_turns=3)


def _reader() -> Any:
    """The scripted note reader, reading the notes from the system prompt the episode shows; a reflection prompt
    (one user message) gets fixed notes as JSON."""
    reader = ScriptedReader()

    async def policy(observation: list[Any]) -> str:
        if observation[0]["role"] == "user":  # the reflection prompt
            return json.dumps({"user_preferences_reasoning": "seen", "agent_notes": NOTES})
        system = observation[0]["content"]
        notes = next((n for n in (NOTES, oracle_notes(PROFILE.preferences)) if n in system), "")
        [reply] = await reader.replies([(notes, observation[1:])])
        return reply

    return policy


@pytest.mark.parametrize("reflector", ["policy", "oracle", "empty"])
def test_multi_session_episodes_conform(reflector: str) -> None:
    asyncio.run(check_episode(_episode(reflector), _reader(), seed=3))


def test_the_notes_carry_between_sessions() -> None:
    episode = _episode("policy")
    final = asyncio.run(play(episode, _reader(), seed=3))
    record = episode.record()
    assert [s["notes_before"] for s in record["sessions"]] == ["", NOTES, NOTES]
    assert record["notes"] == NOTES and final.done
    assert final.reward["first_preference"] == record["sessions"][0]["preference"]
    later = [s["preference"] for s in record["sessions"][1:]]
    assert final.reward["preference"] == pytest.approx(sum(later) / len(later))

    oracle = _episode("oracle")
    asyncio.run(play(oracle, _reader(), seed=3))
    assert oracle.record()["sessions"][2]["notes_before"] == oracle_notes(PROFILE.preferences)


def test_a_reflection_takes_no_annotation_and_unreadable_notes_keep_the_old() -> None:
    async def go() -> None:
        episode = _episode("policy", sessions=2)
        observation = await episode.reset(seed=1)
        step = None
        while step is None or step.info["phase"] != "reflect":
            step = await episode.step("Fine.")
        assert step.observation[0]["role"] == "user" and not step.done
        with pytest.raises(TypeError, match="annotation"):
            await episode.step("notes", retrieved="x")
        step = await episode.step("not json at all")
        assert step.info["notes"] == "" and step.info["session"] == 1
        assert observation[0]["role"] == "system"

    asyncio.run(go())


def test_a_multi_session_episode_is_one_user() -> None:
    other = sample_profiles(2, 8)[1]
    grader = Grader()
    specs = [SessionSpec(PROFILE, PROBLEMS[0], 0), SessionSpec(other, PROBLEMS[1], 1)]
    with pytest.raises(ValueError, match="one user"):
        MultiSessionEpisode(specs, RuleUserSimulator(grader), grader)
    with pytest.raises(ValueError, match="reflector"):
        MultiSessionEpisode(specs[:1], RuleUserSimulator(grader), grader, reflector="psychic")  # type: ignore[arg-type]
