"""The episode protocol on a collab session: the rule user and the grader are real, the agent's replies scripted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from memrl.envs.checker import check_episode
from memrl.envs.collab.agents import AgentKind, AgentMemory, AgentReply
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import AnswerKind, Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.session import GREETING, CollabEpisode, SessionSpec, run_session
from memrl.envs.collab.user_sim import LLMUserSimulator, RuleUserSimulator, UserSession, UserSimulator, UserTurn
from memrl.envs.episode import PolicyReply, Step, play
from memrl.rollout.base import Message, SamplingParams

PROBLEM = Problem("arith-x", "arith", "A pen costs $3. How much do 4 pens cost?", "12", AnswerKind.MATH)
# blunt and three-sentences are checkable: apologies and long replies are violations the rule user enforces.
USER = UserProfile("u1", "A baker", ("blunt", "no-suggestions", "three-sentences"))
SPEC = SessionSpec(USER, PROBLEM, 0)

VIOLATING = "Sorry for the wait! Each pen is $3. Four pens is 4 times 3. That makes 12. Hope this helps. Thanks!"
WRONG, RIGHT = "Four pens cost 4 x 3 = 15.", "Four pens cost 4 x 3 = 12."
# (reply, retrieved, parse_failed, retrieval_failed): the user enforces, takes a wrong draft, then ends on the answer
ENDED_BY_USER = [(VIOLATING, "likes bullets", False, False), (WRONG, None, True, False), (RIGHT, "notes", False, True)]
# never a new answer the user accepts: ends at max_turns (the rule user's patience is raised so it never gives up)
RUNS_OUT = [
    (VIOLATING, None, False, False),
    ("How many pens do you need?", None, True, True),
    (WRONG, "x", False, False),
]
TIMINGS = ("started_at", "finished_at")


def _simulator(patience: int = 3) -> RuleUserSimulator:
    return RuleUserSimulator(Grader(), seed=0, patience=patience)


class ScriptedAgent:
    """A CollabAgent stand-in: replies from a script, remembers what it was shown, reflects by noting the length."""

    kind = AgentKind.MEMORY

    def __init__(self, script: Sequence[tuple[str, str | None, bool, bool]]) -> None:
        self.script = list(script)
        self.seen: list[list[Message]] = []
        self.ended_with: list[Message] = []

    async def reply(self, profile: UserProfile, memory: AgentMemory, turns: Sequence[Message]) -> AgentReply:
        self.seen.append(list(turns))
        text, retrieved, parse_failed, retrieval_failed = self.script[len(self.seen) - 1]
        return AgentReply(text, parse_failed, retrieved, retrieval_failed)

    async def end_session(self, memory: AgentMemory, turns: Sequence[Message]) -> tuple[AgentMemory, None]:
        self.ended_with = list(turns)
        return AgentMemory(f"{memory.notes} +{len(turns)}"), None


async def _step_by_hand(
    episode: CollabEpisode, script: Sequence[tuple[str, str | None, bool, bool]]
) -> tuple[list[Message], list[Step]]:
    first = await episode.reset()
    steps = []
    for text, retrieved, parse_failed, retrieval_failed in script:
        steps.append(
            await episode.step(text, retrieved=retrieved, parse_failed=parse_failed, retrieval_failed=retrieval_failed)
        )
        if steps[-1].done:
            break
    return first, steps


@pytest.mark.parametrize(
    ("script", "max_turns", "patience", "ended_by"),
    [(ENDED_BY_USER, 10, 3, "user"), (RUNS_OUT, 3, 99, "max_turns")],
)
def test_stepping_by_hand_gives_the_record_run_session_writes(
    script: list[tuple[str, str | None, bool, bool]], max_turns: int, patience: int, ended_by: str
) -> None:
    agent = ScriptedAgent(script)
    memory = AgentMemory("- bakes at night")
    played, new_memory = asyncio.run(
        run_session(SPEC, agent, _simulator(patience), Grader(), memory, max_turns)  # type: ignore[arg-type]
    )
    record = played.to_dict()  # the line of sessions.jsonl
    episode = CollabEpisode(SPEC, _simulator(patience), Grader(), max_turns)
    first, steps = asyncio.run(_step_by_hand(episode, script))
    by_hand = episode.record()

    assert record["ended_by"] == by_hand["ended_by"] == ended_by
    for key, value in by_hand.items():
        if key == "parse_failures":
            assert record[key] == value | {"reflection": 0}
        elif key not in TIMINGS:
            assert record[key] == value, key
    assert set(record) - set(by_hand) == {"agent", "notes_before", "notes_after", "reflection_reasoning"} | {
        "reflection_raw",
        "memory",
        "node",
    }
    assert (record["notes_before"], record["notes_after"]) == ("- bakes at night", new_memory.notes)
    # the agent was shown exactly the observations stepping by hand gives, and reflected on the final one
    assert agent.seen == [first] + [s.observation for s in steps[:-1]]
    assert agent.ended_with == steps[-1].observation
    # the annotations land in the record
    assert [t["retrieved"] for t in record["turns"] if t["role"] == "assistant"] == [s[1] for s in script]
    failures = record["parse_failures"]
    assert (failures["agent"], failures["retrieval"]) == (sum(s[2] for s in script), sum(s[3] for s in script))
    assert failures["user"] == 0


@pytest.mark.parametrize(("script", "max_turns", "patience"), [(ENDED_BY_USER, 10, 3), (RUNS_OUT, 3, 99)])
def test_turns_alternate_and_only_the_last_step_is_done_and_rewarded(
    script: list[tuple[str, str | None, bool, bool]], max_turns: int, patience: int
) -> None:
    episode = CollabEpisode(SPEC, _simulator(patience), Grader(), max_turns)
    with pytest.raises(RuntimeError):
        asyncio.run(episode.step("too early"))
    first, steps = asyncio.run(_step_by_hand(episode, script))
    assert len(steps) == len(script)

    assert [m["role"] for m in first] == ["user"] and PROBLEM.question in first[0]["content"]
    previous = first
    for step, (text, *_) in zip(steps, script, strict=True):
        assert step.observation[: len(previous)] == previous  # the conversation only grows
        assert step.observation[len(previous)] == {"role": "assistant", "content": text}
        previous = step.observation
    final = steps[-1]
    roles = [m["role"] for m in final.observation]
    assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2)
    assert [s.done for s in steps] == [False] * (len(steps) - 1) + [True]
    assert all(s.reward == {} for s in steps[:-1])

    record = episode.record()
    # the user ending the session is termination, running out of turns truncation
    assert (final.terminated, final.truncated) == (record["ended_by"] == "user", record["ended_by"] == "max_turns")
    assert final.reward == {name: record[name] for name in ("task_success", "user_effort", "length")}
    assert final.reward["length"] == len(final.observation) == len(record["turns"])
    assert final.info["ended_by"] == record["ended_by"]
    if record["ended_by"] == "user":  # the user's closing words end the observation
        assert roles[-1] == "user" and len(steps) < max_turns
        assert final.reward == {"task_success": 1.0, "user_effort": 1.0, "length": 7.0}
    else:  # time ran out: the user's last reaction is never said
        assert roles[-1] == "assistant" and len(steps) == max_turns
        assert final.reward == {"task_success": 0.0, "user_effort": 1.0, "length": 2.0 * max_turns}
    with pytest.raises(RuntimeError):
        asyncio.run(episode.step("one more"))


def test_reset_starts_again_and_unknown_annotations_are_refused() -> None:
    episode = CollabEpisode(SPEC, _simulator(), Grader(), 2)
    with pytest.raises(RuntimeError):
        episode.record()  # nothing finished yet
    first = asyncio.run(episode.reset())
    asyncio.run(episode.step(RIGHT))
    assert asyncio.run(episode.reset()) == first
    with pytest.raises(RuntimeError):
        episode.record()
    with pytest.raises(TypeError, match="retreived"):
        asyncio.run(episode.step(RIGHT, retreived="typo"))
    with pytest.raises(ValueError, match="at least one exchange"):
        CollabEpisode(SPEC, _simulator(), Grader(), 0)


def _policy(replies: Sequence[str], annotate: bool) -> Any:
    async def policy(observation: list[Message]) -> PolicyReply:
        text = replies[min(sum(m["role"] == "assistant" for m in observation), len(replies) - 1)]
        return (text, {"retrieved": "notes"}) if annotate else text

    return policy


def test_a_policy_that_keeps_the_preferences_costs_the_user_less_effort() -> None:
    def play_with(replies: Sequence[str], annotate: bool) -> tuple[Step, dict[str, Any]]:
        episode = CollabEpisode(SPEC, _simulator(), Grader(), 4)
        final = asyncio.run(play(episode, _policy(replies, annotate)))
        return final, episode.record()

    kept, kept_record = play_with([WRONG, RIGHT], annotate=True)
    broken, broken_record = play_with([VIOLATING, "Sorry, I mean 12. " * 4], annotate=False)
    assert kept.done and broken.done
    # every reply is enforced; the fourth enforcement is the user's unsaid last reaction, so it costs no effort
    assert kept.reward["user_effort"] == 0 < broken.reward["user_effort"] == 3
    assert (kept.reward["task_success"], broken.reward["task_success"]) == (1.0, 0.0)
    assert kept.reward["length"] < broken.reward["length"]
    assert {t["retrieved"] for t in kept_record["turns"] if t["role"] == "assistant"} == {"notes"}
    assert {t["retrieved"] for t in broken_record["turns"] if t["role"] == "assistant"} == {None}
    assert all(set(t["checker_violated"]) >= {"blunt"} for t in broken_record["turns"][2::2])  # the checkers agree


class _ScriptedUser(UserSession):
    """The one thing the rule user never does: write unparsable output (as an LLM user may)."""

    def __init__(self, profile: UserProfile, problem: Problem, max_turns: int) -> None:
        super().__init__(profile, problem, max_turns)
        self.reactions = iter([("go on", "7"), ("?", "12")])  # (what the user says, the draft)

    async def open(self, greeting: str | None = None) -> UserTurn:
        return UserTurn("help", parse_failed=True)

    async def reply(self, turns: Sequence[Message]) -> UserTurn:
        response, draft = next(self.reactions)
        return UserTurn(response, draft_answer=draft, parse_failed=not turns[-1]["content"])


class _ScriptedUsers(UserSimulator):
    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        return _ScriptedUser(profile, problem, max_turns)


def test_the_unsaid_last_reaction_at_max_turns_is_graded_and_its_parse_failure_counted() -> None:
    episode = CollabEpisode(SPEC, _ScriptedUsers(), Grader(), 2)
    final = asyncio.run(play(episode, _policy(["thinking", ""], annotate=False)))  # the user fails to parse ""
    record = episode.record()
    assert [m["content"] for m in final.observation] == ["help", "thinking", "go on", ""]  # "?" is never said
    assert record["draft_answer"] == "12" and record["task_success"] == 1
    assert record["parse_failures"]["user"] == 2  # the opening and the unsaid last reaction
    assert record["ended_by"] == "max_turns"


def test_the_original_harness_greets_first_and_grades_the_last_said_draft() -> None:
    episode = CollabEpisode(SPEC, _ScriptedUsers(), Grader(), 2, original=True)
    # The policy picks its reply by the number of assistant turns so far, and the greeting is one of them.
    final = asyncio.run(play(episode, _policy(["-", "thinking", "the answer is 12"], annotate=False)))
    record = episode.record()
    # The agent greets; the user never reads the last reply, so the draft of "go on" ("7") is graded, not "12".
    assert [m["content"] for m in final.observation] == [GREETING, "help", "thinking", "go on", "the answer is 12"]
    assert record["draft_answer"] == "7" and record["task_success"] == 0
    assert record["length"] == 5 and record["ended_by"] == "max_turns"
    assert final.truncated and not final.terminated
    assert record["parse_failures"]["user"] == 1  # only the opening: the last reaction is never asked for


# --- conformance and seeds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("replies", "max_turns", "original"), [([WRONG, RIGHT], 4, False), ([VIOLATING], 2, True)])
def test_collab_episodes_with_the_rule_user_conform(replies: list[str], max_turns: int, original: bool) -> None:
    for seed in (0, 7):
        episode = CollabEpisode(SPEC, _simulator(), Grader(), max_turns, original)
        asyncio.run(check_episode(episode, _policy(replies, annotate=True), seed=seed))


def _opening(seed: int | None, simulator_seed: int = 0) -> str:
    episode = CollabEpisode(SPEC, RuleUserSimulator(Grader(), seed=simulator_seed), Grader())
    return asyncio.run(episode.reset(seed=seed))[0]["content"]


def test_a_reset_seed_seeds_the_user_and_none_keeps_the_simulators_seed() -> None:
    # None plays as before seeds existed: the simulator's own seed (what existing records were written with).
    assert _opening(None, simulator_seed=5) == _opening(5) == _opening(5, simulator_seed=9)
    assert len({_opening(seed) for seed in range(12)}) > 1  # the seed reaches the user's phrasing
    # an LLM user samples with the seed
    sampling = SamplingParams(temperature=1.0, seed=0)
    llm = LLMUserSimulator(None, sampling)  # type: ignore[arg-type]  # never asked here
    assert llm.seeded(11).sampling == SamplingParams(temperature=1.0, seed=11) and llm.sampling.seed == 0
    scripted = _ScriptedUsers()
    assert scripted.seeded(3) is scripted  # a simulator that draws nothing plays alike under any seed
