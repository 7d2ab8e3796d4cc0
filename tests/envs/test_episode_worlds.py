"""The episode protocol on the TOD proactive loop and a PAHF task: rule users and supervisors, scripted replies.

Each world's whole-episode runner is rebuilt on its episode: stepping the episode by hand with the runner's replies
must give the runner's outcome, with `done` exactly once and the reward parts only on the last step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from support import FIXTURES

from memrl.envs.checker import check_episode
from memrl.envs.episode import Step
from memrl.envs.pahf.agent import AgentKind, MemoryWriter, PahfAgent, PahfEpisode, Task
from memrl.envs.pahf.config import PahfSampling
from memrl.envs.pahf.formats import load_shopping_dir
from memrl.envs.pahf.memory import SQLiteMemory
from memrl.envs.pahf.protocol import ShoppingUser, shopping_options
from memrl.envs.pahf.shopping import gold
from memrl.envs.tod.formats import Turn
from memrl.envs.tod.proactive import ProactiveEpisode, RuleSupervisor, RuleUser, as_messages, as_turns, run_proactive
from memrl.envs.tod.reader import Reply
from memrl.rollout.base import ChatBackend, Completion, Conversation, SamplingParams


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def _steps(episode: Any, replies: Sequence[tuple[str, dict[str, Any]]]) -> list[Step]:
    """Reset `episode` and step it with `replies` until done (every reply must be used)."""

    async def go() -> list[Step]:
        await episode.reset()
        steps = []
        for text, notes in replies:
            steps.append(await episode.step(text, **notes))
            if steps[-1].done:
                break
        return steps

    steps = _run(go())
    assert len(steps) == len(replies), "the episode ended before (or after) the last scripted reply"
    return steps


def _done_once(steps: Sequence[Step]) -> Step:
    """`done` on the last step only (terminated or truncated, never both), reward parts on the last step only;
    returns it."""
    assert [s.done for s in steps] == [False] * (len(steps) - 1) + [True]
    assert not any(s.terminated or s.truncated for s in steps[:-1])
    assert steps[-1].terminated != steps[-1].truncated
    assert all(s.reward == {} for s in steps[:-1])
    return steps[-1]


# --- TOD: the proactive loop ---------------------------------------------------------------------------------------

GOAL = {"restaurant_name": "Ariake", "city": "San Jose", "time": "6 pm", "date": "March 10th", "party_size": "2"}
CONTEXT = [
    Turn(speaker="user", utterance="Hi, it's about my table at Ariake in San Jose.", slots={"city": "San Jose"}),
    Turn(speaker="assistant", utterance="Sure, let me pull that up."),
]
# The confirmation misses the date and the party size; the rule user names one a turn and the replies fix them.
FIXES = [
    Reply("Ariake in San Jose at 6 pm, right?", {"time": "6 pm"}),
    Reply("Ariake in San Jose at 6 pm on March 10th.", failed=True),
    Reply("Ariake in San Jose at 6 pm on March 10th for 2 people."),
]
# Never states the date: the loop runs out of turns.
STUCK = [Reply("Ariake at 6 pm for 2?"), Reply("Ariake in San Jose at 6 pm for 2?")]


def _tod_annotations(reply: Reply) -> dict[str, Any]:
    return {"slots": reply.slots, "parse_failed": reply.failed}


def _tod_runner(script: Sequence[Reply], max_turns: int) -> tuple[Any, list[list[Turn]]]:
    seen: list[list[Turn]] = []

    async def respond(followup: Sequence[Turn]) -> Reply:
        seen.append(list(followup))
        return script[len(seen) - 1]

    return _run(run_proactive(respond, CONTEXT, GOAL, RuleUser(), RuleSupervisor(), max_turns)), seen


@pytest.mark.parametrize(("script", "max_turns"), [(FIXES, 10), (STUCK, 2), (FIXES[:1], 1)])
def test_proactive_episode_stepped_by_hand_is_the_runner(script: list[Reply], max_turns: int) -> None:
    outcome, seen = _tod_runner(script, max_turns)
    assert len(seen) == len(script)
    episode = ProactiveEpisode(CONTEXT, GOAL, RuleUser(), RuleSupervisor(), max_turns)
    steps = _steps(episode, [(r.text, _tod_annotations(r)) for r in script])
    last = _done_once(steps)
    assert episode.outcome() == outcome
    assert last.reward == {"success": float(outcome.success), "dte": float(outcome.dte)}
    assert [s.info["outstanding"] for s in steps] == outcome.outstanding
    # The observation is the context and the loop's turns; the reader saw each step's turns before replying.
    everything = [*CONTEXT, *outcome.turns]
    assert last.observation == as_messages(everything) and as_turns(last.observation) == everything
    assert [m["content"] for m in last.observation] == [t.utterance for t in everything]
    # ... each message with its turn's annotation, which the reader reads back from the observation
    assert [m.get("slots", {}) for m in last.observation] == [t.slots for t in everything]
    assert last.terminated == outcome.success and last.truncated == (not outcome.success)
    assert all(s.observation[-1]["role"] == "user" for s in steps[:-1])
    assert seen[1:] == [[t for t in outcome.turns[: 2 * i]] for i in range(1, len(script))]
    assert episode.record()["turns"] == [t.model_dump(exclude_defaults=True) for t in outcome.turns]


def test_proactive_episode_outcomes() -> None:
    fixed, _ = _tod_runner(FIXES, 10)
    assert fixed.success and fixed.dte == 3 and fixed.outstanding == [["date", "party_size"], ["party_size"], []]
    assert fixed.confirmation == FIXES[0] and fixed.turns[0].slots == {"time": "6 pm"}
    assert fixed.failures == {"reader": 1, "user": 0, "supervisor": 0}
    assert fixed.turns[1].slots == {"date": "March 10th"}  # the rule user's annotation, kept on its turn
    stuck, _ = _tod_runner(STUCK, 2)
    assert not stuck.success and stuck.dte == 2 and stuck.outstanding[-1] == ["date"]
    episode = ProactiveEpisode(CONTEXT, GOAL, RuleUser(), RuleSupervisor(), 2)
    last = _steps(episode, [(r.text, {}) for r in STUCK])[-1]
    assert last.info["ended_by"] == "max_turns" and last.reward == {"success": 0.0, "dte": 2.0}
    assert last.truncated and not last.terminated  # the turn limit cut it


def test_proactive_episode_is_strict() -> None:
    episode = ProactiveEpisode(CONTEXT, GOAL, RuleUser(), RuleSupervisor(), 1)
    with pytest.raises(RuntimeError, match="reset"):
        _run(episode.step("hello"))
    assert _run(episode.reset()) == [
        {"role": "user", "content": CONTEXT[0].utterance, "slots": {"city": "San Jose"}},
        {"role": "assistant", "content": CONTEXT[1].utterance},
    ]
    with pytest.raises(TypeError, match="retrieved"):
        _run(episode.step("hello", retrieved="x"))
    with pytest.raises(RuntimeError, match="outcome"):
        episode.outcome()
    assert _run(episode.step("hello")).done
    with pytest.raises(RuntimeError, match="over"):
        _run(episode.step("again"))


# --- PAHF: one shopping task ---------------------------------------------------------------------------------------

SHOPPING = FIXTURES / "pahf" / "shopping"
SAMPLING = PahfSampling().agent(seed=0)


class Queue(ChatBackend):
    """Replies from a script in order (the agent's decisions and its memory writer's answers), keeping the prompts."""

    name = "queue"

    def __init__(self, replies: Sequence[str]) -> None:
        super().__init__()
        self.replies = list(replies)
        self.prompts: list[str] = []

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        out = []
        for conversation in conversations:
            self.prompts.append(conversation[-1]["content"])
            out.append(Completion(self.replies.pop(0), 1, 1, "stop"))
        return out


class LetterCounts:
    """A deterministic embedder for the note store: letter counts, L2-normalised."""

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.array([[text.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for text in texts], np.float32)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _shopping() -> tuple[Task, ShoppingUser]:
    data = load_shopping_dir(SHOPPING)
    scenario = data.phases[1][0]
    table = data.original[scenario.user]
    task = Task("shopping", scenario.user, scenario.task, shopping_options(scenario), gold(table, scenario))
    return task, ShoppingUser(scenario, table, None, data.personas_original[scenario.user], "minimal", None)


TASK, USER = _shopping()
RIGHT = TASK.gold
WRONG = next(x for x in TASK.options if x != RIGHT)
FEATURE = next(iter(USER.table.products[USER.scenario.product]))
ASK = f"ASK: Which {FEATURE} do you like?"
NOTE = '{"note": "likes it"}'


def _pahf_runner(decisions: Sequence[str], learning: bool, kind: AgentKind = AgentKind.PAHF) -> Any:
    """`PahfAgent.run` on an empty store: the memory writer's salience says yes and its note is fixed."""
    replies = []
    for decision in decisions:
        replies.append(decision)
        if decision.startswith("ASK") and learning and kind in (AgentKind.PRE, AgentKind.PAHF):
            replies += ["yes", NOTE]  # the answer is written before the second decision
    replies += ["yes", NOTE, NOTE]  # a feedback write and its merge, when there is one (left unused otherwise)
    backend = Queue(replies)
    agent = PahfAgent(kind, backend, MemoryWriter(backend, SAMPLING), SAMPLING)
    with SQLiteMemory(None, LetterCounts()) as store:
        return _run(agent.run(TASK, USER, store, learning))


CASES = [
    ([RIGHT], True, AgentKind.PAHF),
    ([WRONG], True, AgentKind.PAHF),
    ([WRONG], False, AgentKind.PAHF),
    ([WRONG], True, AgentKind.PRE),  # listens to no feedback
    ([ASK, WRONG], True, AgentKind.PAHF),
    ([ASK, ASK], True, AgentKind.PAHF),  # one question only: the second is unusable
    ([ASK], False, AgentKind.PAHF),  # no questions in a test phase: unusable
    (["I would buy it."], True, AgentKind.POST),
]


@pytest.mark.parametrize(("decisions", "learning", "kind"), CASES)
def test_pahf_episode_stepped_by_hand_is_the_runner(decisions: list[str], learning: bool, kind: AgentKind) -> None:
    outcome = _pahf_runner(decisions, learning, kind)
    can = {AgentKind.PRE: (True, False), AgentKind.POST: (False, True), AgentKind.PAHF: (True, True)}[kind]
    episode = PahfEpisode(TASK, USER, learning, may_ask=can[0], wants_feedback=can[1])
    steps = _steps(episode, [(d, {}) for d in decisions])
    last = _done_once(steps)
    assert last.reward == {"correct": float(outcome.correct)}
    acted = {k: last.info[k] for k in ("choice", "thought", "correct", "feedback", "unusable")}
    assert acted == {
        "choice": outcome.choice,
        "thought": outcome.thought,
        "correct": outcome.correct,
        "feedback": outcome.feedback,
        "unusable": outcome.unusable,
    }
    if len(steps) == 2:
        assert (steps[0].info["question"], steps[0].info["answer"]) == (outcome.question, outcome.answer)
    assert outcome.failures["decision"] == int(outcome.choice is None)
    record = episode.record()
    assert (record["question"], record["answer"], record["feedback"]) == (
        outcome.question,
        outcome.answer,
        outcome.feedback,
    )
    assert [w.source for w in outcome.writes] == ["answer"] * (outcome.answer is not None) + ["feedback"] * bool(
        outcome.feedback
    )


def test_pahf_episode_asks_acts_and_hears_feedback() -> None:
    episode = PahfEpisode(TASK, USER, learning=True)
    first = _run(episode.reset())
    assert len(first) == 1 and TASK.instruction in first[0]["content"]
    assert all(f"{letter}) {text}" in first[0]["content"] for letter, text in TASK.options.items())
    asked = _run(episode.step(ASK))
    answer = _run(USER.answer(ASK.removeprefix("ASK: ")))
    assert not asked.done and asked.reward == {}
    assert asked.observation[-1] == {"role": "user", "content": answer}
    assert USER.table.products[USER.scenario.product][FEATURE].like_most in answer
    right = _run(episode.step(RIGHT))
    assert right.done and right.reward == {"correct": 1.0} and right.info["feedback"] is None
    assert right.observation[-1] == {"role": "assistant", "content": RIGHT}

    _run(episode.reset())
    wrong = _run(episode.step(WRONG))
    feedback = _run(USER.feedback(WRONG))
    assert feedback and wrong.done and wrong.reward == {"correct": 0.0}
    assert wrong.info["feedback"] == feedback and wrong.observation[-1] == {"role": "user", "content": feedback}

    test_phase = PahfEpisode(TASK, USER, learning=False)
    _run(test_phase.reset())
    quiet = _run(test_phase.step(WRONG))
    assert quiet.done and quiet.reward == {"correct": 0.0} and quiet.info["feedback"] is None


def test_pahf_episode_is_strict() -> None:
    episode = PahfEpisode(TASK, USER, learning=True)
    with pytest.raises(RuntimeError, match="reset"):
        _run(episode.step(RIGHT))
    _run(episode.reset())
    with pytest.raises(TypeError, match="parse_failed"):
        _run(episode.step(RIGHT, parse_failed=True))
    with pytest.raises(RuntimeError, match="record"):
        episode.record()
    assert _run(episode.step(RIGHT)).done
    with pytest.raises(RuntimeError, match="over"):
        _run(episode.step(RIGHT))


# --- conformance -------------------------------------------------------------------------------------------------


def _scripted_reader(script: Sequence[Reply]) -> Any:
    """A policy of the observation: the reply of the script for the number of assistant turns after the context."""

    async def policy(observation: list[Any]) -> Any:
        said = sum(m["role"] == "assistant" for m in observation[len(CONTEXT) :])
        reply = script[min(said, len(script) - 1)]
        return reply.text, _tod_annotations(reply)

    return policy


@pytest.mark.parametrize(("script", "max_turns"), [(FIXES, 10), (STUCK, 2)])
def test_proactive_episodes_conform(script: list[Reply], max_turns: int) -> None:
    episode = ProactiveEpisode(CONTEXT, GOAL, RuleUser(), RuleSupervisor(), max_turns)
    _run(check_episode(episode, _scripted_reader(script)))


@pytest.mark.parametrize(("decisions", "learning"), [([ASK, RIGHT], True), ([WRONG], True), ([ASK], False)])
def test_pahf_episodes_conform(decisions: list[str], learning: bool) -> None:
    async def policy(observation: list[Any]) -> str:
        return decisions[min(sum(m["role"] == "assistant" for m in observation), len(decisions) - 1)]

    _run(check_episode(PahfEpisode(TASK, USER, learning), policy))
