"""One session end to end with a real (tiny) model, the agents' knowledge, and the metrics over records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from memrl.core.preferences import TAXONOMY
from memrl.envs.collab.agents import AgentKind, AgentMemory, CollabAgent, Reflector
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.metrics import compute_metrics, session_deltas, write_comparison, write_report
from memrl.envs.collab.problems import load_problems
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.records import SessionRecord
from memrl.envs.collab.session import SessionSpec, run_session
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.rollout.base import Conversation, SamplingParams

USER = UserProfile("u1", "A night-shift nurse", ("direct", "incremental", "bullets"))


@pytest.fixture(scope="module")
def tiny_backend(tiny_qwen2: str):  # type: ignore[no-untyped-def]
    from memrl.rollout.hf_local import HFBackend

    return HFBackend(tiny_qwen2)


def test_session_with_a_real_tiny_model_records_everything(tiny_backend: Any) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, seed=0)
    agent = CollabAgent(AgentKind.MEMORY, tiny_backend, params, Reflector(tiny_backend, params), params)
    grader = Grader()
    problems = load_problems("arith", limit=2, seed=0)
    memory = AgentMemory(notes="- The user likes bullet points.")
    spec = SessionSpec(USER, problems[0], 0)
    record, new_memory = asyncio.run(run_session(spec, agent, RuleUserSimulator(grader), grader, memory, 4))

    turns = record.turns
    assert [t["role"] for t in turns[:4]] == ["user", "assistant", "user", "assistant"]
    assert record.length == len(turns) <= 2 * 4 + 1
    assert record.user_effort == sum(bool(t.get("enforce")) for t in turns) == len(record.enforcing_utterances)
    assert record.notes_before == "- The user likes bullet points."
    assert record.notes_after == new_memory.notes
    # A random tiny model writes no JSON: every agent call is a counted parse failure, and the run goes on.
    failures = record.parse_failures
    assert failures["agent"] == sum(t["role"] == "assistant" for t in turns)
    assert failures["retrieval"] == failures["agent"]  # notes exist, so every turn retrieved
    assert failures["reflection"] == 1
    assert new_memory.notes == memory.notes  # an unusable reflection keeps the old notes
    assert record.task_success in (0, 1)
    assert record.ended_by in ("user", "max_turns")
    line = json.dumps(record.to_dict())  # the record is plain JSON, and reads back as it was
    assert SessionRecord.from_dict(json.loads(line), "sessions.jsonl:1") == record
    assert json.dumps(SessionRecord.from_dict(json.loads(line), "sessions.jsonl:1").to_dict()) == line


class _Capture:
    """A backend wrapper that keeps the prompts it was sent (the model still answers)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.sent = inner, []
        self.usage = inner.usage

    async def achat(self, messages: Conversation, params: SamplingParams | None = None) -> Any:
        self.sent.append(list(messages))
        return await self.inner.achat(messages, params)


@pytest.mark.parametrize(
    ("kind", "expected", "absent"),
    [
        (AgentKind.ORACLE, TAXONOMY["bullets"].description, "Session 1"),
        (AgentKind.NONE, "new user", TAXONOMY["bullets"].description),
        (AgentKind.HISTORY_3, "Session 3", "first-session-text"),
    ],
)
def test_agent_knowledge_per_kind(tiny_backend: Any, kind: AgentKind, expected: str, absent: str) -> None:
    capture = _Capture(tiny_backend)
    agent = CollabAgent(kind, capture, SamplingParams(max_tokens=4))  # type: ignore[arg-type]
    transcripts = [[{"role": "user", "content": f"{name}-session-text"}] for name in ("first", "b", "c", "d")]
    memory = AgentMemory("", transcripts)  # type: ignore[arg-type]
    asyncio.run(agent.reply(USER, memory, [{"role": "user", "content": "hi"}]))
    system = capture.sent[0][0]["content"]
    assert expected in system
    assert absent not in system


def _record(user: str, session: int, ts: int, ue: int, length: int, enforce_ok: bool = True) -> SessionRecord:
    turns = [
        {"role": "user", "content": "a b c", "enforce": False, "violated": []},
        {"role": "assistant", "content": "d e"},
        {"role": "user", "content": "f", "enforce": True, "checker_violated": ["x"] if enforce_ok else []},
    ]
    for t in turns[2:]:
        t["checker_decided"] = True
    row = {
        "user_id": user,
        "session": session,
        "task": "arith",
        "problem_id": f"p{session}",
        "preferences": ["x"],
        "task_success": ts,
        "user_effort": ue,
        "length": length,
        "turns": turns,
        "notes_after": "likes bullets",
        "parse_failures": {"agent": 1, "user": 0, "retrieval": 0, "reflection": 0},
    }
    return SessionRecord.from_dict(row, "test")


def test_metrics_average_per_user_first_and_report_fidelity(tmp_path: Path) -> None:
    records = [
        _record("a", 0, 1, 2, 10),
        _record("a", 1, 1, 0, 6),
        _record("a", 2, 1, 0, 6),
        _record("b", 0, 0, 4, 20, enforce_ok=False),
    ]
    m = compute_metrics(records)
    assert m["task_success"] == pytest.approx(0.5)  # mean of user means (1.0, 0.0), not of sessions (0.75)
    assert m["user_effort"] == pytest.approx((2 / 3 + 4) / 2, abs=1e-4)
    assert [p["session"] for p in m["per_session"]] == [0, 1, 2]
    assert m["per_session"][0]["length"] == 15
    assert m["simulator_fidelity"] == {"agree": 3, "turns": 4, "rate": 0.75}
    assert m["parse_failures"]["agent"] == 4
    assert 0 < m["memory_tokens"] < m["history_tokens"]

    with_memory, without = tmp_path / "mem", tmp_path / "none"
    for d, recs in ((with_memory, records), (without, [_record("a", 0, 0, 5, 20), _record("a", 1, 0, 5, 20)])):
        d.mkdir()
        write_report(recs, d)
        assert (d / "sessions.png").stat().st_size > 1000
    deltas = session_deltas(compute_metrics(records), compute_metrics([_record("a", 0, 0, 5, 20)]))
    assert deltas == [{"session": 0, "task_success": 0.5, "user_effort": -2.0, "length": -5.0}]
    assert len(write_comparison(with_memory, without, tmp_path / "cmp")) == 2
    assert (tmp_path / "cmp" / "deltas.png").exists()
