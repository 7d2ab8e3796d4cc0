"""One collaborative session: the user opens, the agent and the user alternate, the draft is graded, the agent reflects.

The record keeps every turn, the simulator's enforcement flag, the enforcing utterances (epsilon, what the
reflection reward needs), the notes before and after, and the parse failures of every model call.
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
from memrl.envs.collab.user_sim import UserSimulator, UserTurn, checker_verdicts
from memrl.rollout.base import Message

MAX_TURNS = 10  # user-agent exchanges per session, as in the paper


@dataclass(frozen=True)
class SessionSpec:
    profile: UserProfile
    problem: Problem
    index: int  # 0-based position of this session in the user's sequence


def session_key(user_id: str, index: int) -> str:
    return f"{user_id}/{index}"


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


async def run_session(
    spec: SessionSpec,
    agent: CollabAgent,
    simulator: UserSimulator,
    grader: Grader,
    memory: AgentMemory,
    max_turns: int = MAX_TURNS,
) -> tuple[dict[str, Any], AgentMemory]:
    """Run the session; return its record and the agent's memory for the user's next session."""
    started = time.time()
    user = simulator.start(spec.profile, spec.problem, max_turns)
    turns: list[Message] = []
    log: list[dict[str, Any]] = []
    failures = {"agent": 0, "user": 0, "retrieval": 0, "reflection": 0}
    ended_by = "max_turns"

    def say(turn: UserTurn, view: dict[str, Any]) -> None:
        turns.append({"role": "user", "content": turn.response})
        log.append({"role": "user", "content": turn.response, "enforce": turn.enforce, "violated": list(turn.violated)})
        log[-1].update(view)
        failures["user"] += turn.parse_failed

    turn, view = await user.open(), dict[str, Any]()
    for _ in range(max_turns):
        say(turn, view)
        reply = await agent.reply(spec.profile, memory, turns)
        turns.append({"role": "assistant", "content": reply.text})
        log.append({"role": "assistant", "content": reply.text, "retrieved": reply.retrieved})
        failures["agent"] += reply.parse_failed
        failures["retrieval"] += reply.retrieval_failed
        turn = await user.reply(turns)
        view = _checker_view(spec, reply.text, turn)
        if turn.terminate:
            say(turn, view)
            ended_by = "user"
            break
    else:
        failures["user"] += turn.parse_failed  # the user read the last reply and updated the draft, then time ran out

    draft = turn.draft_answer
    grade = await grader.grade(spec.problem, draft)
    new_memory, reflection = await agent.end_session(memory, turns)
    failures["reflection"] += bool(reflection and reflection.parse_failed)
    enforcing = [t["content"] for t in log if t["role"] == "user" and t.get("enforce")]
    record = {
        "key": session_key(spec.profile.id, spec.index),
        "user_id": spec.profile.id,
        "session": spec.index,
        "task": spec.problem.task,
        "problem_id": spec.problem.id,
        "agent": agent.kind.value,
        "preferences": list(spec.profile.preferences),
        "turns": log,
        "enforcing_utterances": enforcing,
        "draft_answer": draft,
        "gold_answer": spec.problem.answer,
        "grade": {"correct": grade.correct, "method": grade.method, "reasoning": grade.reasoning},
        "task_success": int(grade.correct),
        "user_effort": len(enforcing),
        "length": len(turns),
        "ended_by": ended_by,
        "notes_before": memory.notes,
        "notes_after": new_memory.notes,
        "reflection_reasoning": reflection.reasoning if reflection else "",
        "reflection_raw": reflection.raw if reflection else "",
        "parse_failures": failures,
        "memory": new_memory.to_record(),
        "started_at": started,
        "finished_at": time.time(),
    }
    return record, new_memory
