"""One collaborative session: the user opens, the agent and the user alternate, the draft is graded, the agent reflects.

The record keeps every turn, the simulator's enforcement flag, the enforcing utterances (epsilon, what the
reflection reward needs), the notes before and after, and the parse failures of every model call.

`CollabEpisode` is the session as an `Episode` (memrl.envs.episode), stepped one agent reply at a time, for
evaluation, data generation and RL alike; `run_session` is a `CollabAgent` playing it, then reflecting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memrl.envs.collab.agents import AgentMemory, CollabAgent
from memrl.envs.collab.checkers import TurnContext, Verdict, is_clarifying_question
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import Problem
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.records import PlayedSession, SessionRecord, session_key
from memrl.envs.collab.user_sim import UserSession, UserSimulator, UserTurn, checker_verdicts
from memrl.envs.episode import PolicyReply, Step, check_step, play
from memrl.rollout.base import Message

MAX_TURNS = 10  # user-agent exchanges per session, as in the paper
GREETING = "How can I help you?"  # the original harness's first turn, said by the agent before the user opens


@dataclass(frozen=True)
class SessionSpec:
    profile: UserProfile
    problem: Problem
    index: int  # 0-based position of this session in the user's sequence


def failed_record(spec: SessionSpec, agent: str, reason: str) -> dict[str, Any]:
    """A session a model endpoint could not serve (after the client's own retries): why, and nothing else.

    It goes to the run's failure log, never to `sessions.jsonl`: it has no metrics, and a rerun runs it again.
    """
    return {
        "key": session_key(spec.profile.id, spec.index),
        "user_id": spec.profile.id,
        "session": spec.index,
        "task": spec.problem.task,
        "problem_id": spec.problem.id,
        "agent": agent,
        "status": "failed",
        "error": reason,
        "finished_at": time.time(),
    }


def _checker_view(spec: SessionSpec, agent_text: str, turn: UserTurn) -> dict[str, Any]:
    """What the programmatic checkers say about the reply the user just reacted to (for the fidelity report)."""
    context = TurnContext(winding_down=turn.terminate, clarifying=is_clarifying_question(agent_text))
    verdicts = checker_verdicts(spec.profile, agent_text, context)
    decided = [v for v in verdicts.values() if v is not Verdict.UNDECIDABLE]
    return {
        "checker_violated": [pid for pid, v in verdicts.items() if v is Verdict.VIOLATED],
        "checker_decided": bool(decided),
    }


class CollabEpisode:
    """One session as an `Episode`: the simulated user opens, each step is one agent reply and the user's answer.

    `step(reply, retrieved=None, parse_failed=False, retrieval_failed=False)`: `retrieved` is what the agent
    retrieved for the reply (kept in the turn log); the flags count the agent's parse failures in the record.
    The episode ends when the user terminates (the user's last turn closes the observation) or after `max_turns`
    replies (time runs out: the user's last reaction is never said, but its draft is what gets graded, its parse
    failure is counted, and what it found wrong with the last reply is kept as the record's `unsaid_reaction`, so
    every reply has its verdict). The user ending it is termination, running out of turns truncation. The last
    step grades the draft and carries the reward parts `task_success` (0/1), `user_effort` (enforcing utterances)
    and `length` (turns); earlier steps carry none. `info` has the user's reaction (`enforce`, `violated`,
    `draft_answer`), and on the last step `ended_by` ("user" or "max_turns"). `reset(seed=...)` seeds the user (its
    phrasing, or an LLM user's sampling). The record is the environment's side of the session record: `run_session`
    adds the agent's.

    `original=True` plays the original harness's rules (docs/collab.md lists them): the agent greets first and the
    greeting counts in `length`; when time runs out the user never reads the last reply, so the graded draft is the
    one of the user's last said turn.
    """

    def __init__(
        self,
        spec: SessionSpec,
        simulator: UserSimulator,
        grader: Grader,
        max_turns: int = MAX_TURNS,
        original: bool = False,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"a session needs at least one exchange, got max_turns={max_turns}")
        self.spec = spec
        self.max_turns = max_turns
        self.original = original
        self._simulator = simulator
        self._grader = grader
        self._user: UserSession | None = None  # None until reset
        self._outcome: PlayedSession | None = None  # set by the last step
        self._started = 0.0
        self._turns: list[Message] = []  # what the agent sees
        self._log: list[dict[str, Any]] = []  # the same turns with the user's flags and the agent's retrieval
        self._failures = {"agent": 0, "user": 0, "retrieval": 0}
        self._truncations = {"user": 0}
        self._replies = 0
        self._said_draft = ""
        self._unsaid: dict[str, Any] | None = None  # the user's reaction to a last reply that time cut off

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        """Start the session afresh (a new user session, seeded with `seed` when given) and return its opening."""
        self._started = time.time()
        simulator = self._simulator if seed is None else self._simulator.seeded(seed)
        self._user = simulator.start(self.spec.profile, self.spec.problem, self.max_turns)
        self._outcome = None
        self._turns, self._log = [], []
        self._failures = {"agent": 0, "user": 0, "retrieval": 0}
        self._truncations = {"user": 0}
        self._replies = 0
        self._unsaid = None
        if self.original:
            self._turns.append({"role": "assistant", "content": GREETING})
            self._log.append({"role": "assistant", "content": GREETING, "retrieved": None})
        self._said_draft = (opening := await self._user.open(GREETING if self.original else None)).draft_answer
        self._say(opening, {})
        return list(self._turns)

    def _say(self, turn: UserTurn, view: dict[str, Any]) -> None:
        self._turns.append({"role": "user", "content": turn.response})
        entry = {"role": "user", "content": turn.response, "enforce": turn.enforce, "violated": list(turn.violated)}
        self._log.append(entry | view)
        self._failures["user"] += turn.parse_failed
        self._truncations["user"] += turn.truncated

    async def step(
        self,
        reply: str,
        *,
        retrieved: str | None = None,
        parse_failed: bool = False,
        retrieval_failed: bool = False,
        **unknown: Any,
    ) -> Step:
        user = check_step(self, unknown, self._user, over=self._outcome is not None)
        self._turns.append({"role": "assistant", "content": reply})
        self._log.append({"role": "assistant", "content": reply, "retrieved": retrieved})
        self._failures["agent"] += parse_failed
        self._failures["retrieval"] += retrieval_failed
        self._replies += 1
        if self.original and self._replies >= self.max_turns:  # the original loop ends before the user reads it
            outcome = await self._finish(self._said_draft, "max_turns")
            return Step(list(self._turns), self._reward(outcome), truncated=True, info={"ended_by": "max_turns"})
        turn = await user.reply(self._turns)
        view = _checker_view(self.spec, reply, turn)
        info: dict[str, Any] = {
            "enforce": turn.enforce,
            "violated": list(turn.violated),
            "draft_answer": turn.draft_answer,
        }
        if turn.terminate:
            self._say(turn, view)
            ended_by = "user"
        elif self._replies >= self.max_turns:
            self._failures["user"] += turn.parse_failed  # the user read the last reply and updated the draft
            self._truncations["user"] += turn.truncated
            self._unsaid = {"enforce": turn.enforce, "violated": list(turn.violated)} | view
            ended_by = "max_turns"
        else:
            self._say(turn, view)
            self._said_draft = turn.draft_answer
            return Step(list(self._turns), info=info)
        outcome = await self._finish(turn.draft_answer, ended_by)
        ending = {"terminated": ended_by == "user", "truncated": ended_by == "max_turns"}
        return Step(list(self._turns), self._reward(outcome), **ending, info=info | {"ended_by": ended_by})

    @staticmethod
    def _reward(outcome: PlayedSession) -> dict[str, float]:
        return {
            "task_success": float(outcome.task_success),
            "user_effort": float(outcome.user_effort),
            "length": float(outcome.length),
        }

    async def _finish(self, draft: str, ended_by: str) -> PlayedSession:
        spec = self.spec
        grade = await self._grader.grade(spec.problem, draft)
        enforcing = tuple(t["content"] for t in self._log if t["role"] == "user" and t.get("enforce"))
        self._outcome = PlayedSession(
            key=session_key(spec.profile.id, spec.index),
            user_id=spec.profile.id,
            session=spec.index,
            task=spec.problem.task,
            problem_id=spec.problem.id,
            preferences=tuple(spec.profile.preferences),
            turns=tuple(self._log),
            unsaid_reaction=self._unsaid,
            enforcing_utterances=enforcing,
            draft_answer=draft,
            gold_answer=spec.problem.answer,
            grade={"correct": grade.correct, "method": grade.method, "reasoning": grade.reasoning},
            task_success=int(grade.correct),
            user_effort=len(enforcing),
            length=len(self._turns),
            ended_by=ended_by,
            parse_failures=self._failures,
            truncations=self._truncations,
            started_at=self._started,
            finished_at=time.time(),
        )
        return self._outcome

    def outcome(self) -> PlayedSession:
        """The environment's side of the session record (no agent kind, notes or memory); only once done."""
        if self._outcome is None:
            raise RuntimeError("the episode has no record before its last step")
        return self._outcome

    def record(self) -> dict[str, Any]:
        """`outcome()` as plain JSON, what an `Episode` records."""
        return self.outcome().to_dict()


async def run_session(
    spec: SessionSpec,
    agent: CollabAgent,
    simulator: UserSimulator,
    grader: Grader,
    memory: AgentMemory,
    max_turns: int = MAX_TURNS,
    original: bool = False,
) -> tuple[SessionRecord, AgentMemory]:
    """Run the session (the agent plays a `CollabEpisode`, then reflects); return its record and the agent's memory
    for the user's next session."""
    episode = CollabEpisode(spec, simulator, grader, max_turns, original)

    async def policy(observation: list[Message]) -> PolicyReply:
        reply = await agent.reply(spec.profile, memory, observation)
        flags = {"parse_failed": reply.parse_failed, "retrieval_failed": reply.retrieval_failed}
        return reply.text, {"retrieved": reply.retrieved, **flags}

    final = await play(episode, policy)
    new_memory, reflection = await agent.end_session(memory, final.observation)
    outcome = episode.outcome()
    record = SessionRecord.of(
        outcome,
        agent=agent.kind.value,
        notes_before=memory.notes,
        notes_after=new_memory.notes,
        reflection_reasoning=reflection.reasoning if reflection else "",
        reflection_raw=reflection.raw if reflection else "",
        parse_failures=outcome.parse_failures | {"reflection": int(bool(reflection and reflection.parse_failed))},
        memory=new_memory.to_record(),
        finished_at=time.time(),
    )
    return record, new_memory
