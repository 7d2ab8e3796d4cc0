"""Fault: malformed model output at every parse site is counted and never fatal.

Each site gets the same set of real malformed replies (truncated JSON, wrong keys, prose, empty, wrong types, NaN and
overflowing numbers, nesting past any real reply, megabytes of text) through its public function, and real
generations of the tiny random model where the site is reached through a model call (garbage, which is the point).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from support import FIXTURES

from memrl.rollout.base import ChatBackend, Completion, Message, SamplingParams

SGD = FIXTURES / "sgd"

# The keys every site reads, with values of the wrong type.
_WRONG_TYPES = {
    "response": None,
    "agent_notes": None,
    "relevant_notes": 7,
    "user_preferences_reasoning": 3,
    "score": [1],
    "correct": {"a": 1},
    "turns": "user: hi",
    "intent": None,
    "intent_description": None,
    "qa_pairs": 3,
    "missing_slots": {"a": 1},
    "resolved_slots": 5,
}

MALFORMED: dict[str, str] = {
    "empty": "",
    "whitespace": "  \n\t ",
    "prose": "Sure! The user seems to like short answers, so I would keep things brief.",
    "truncated": '{"user_preferences_reasoning": "The user asked for short replies", "agent_no',
    "truncated-fence": '```json\n{"score": ',
    "wrong-keys": '{"foo": 1, "bar": [2, 3], "baz": {"q": "x"}}',
    "wrong-types": json.dumps(_WRONG_TYPES),
    "array": '["score", 2, "agent_notes", "response"]',
    "nan": '{"score": NaN, "correct": NaN, "agent_notes": NaN, "response": NaN}',
    "overflow": '{"score": 1e999, "correct": -1e999}',
    "deep": "{" * 20_000,
    "deep-valid": '{"agent_notes": ' + "[" * 3000 + "]" * 3000 + "}",
    "huge": '{"agent_notes": "' + "y" * 1_000_000,
    "control-chars": "\x00\x01\x1b[31m\ud800 ]]}} \x7f",
}
CASES = pytest.mark.parametrize("text", list(MALFORMED.values()), ids=list(MALFORMED))
SLOW = 10.0  # seconds: no site may hang on a degenerate reply either


class _HashEmbedder:
    """Deterministic unit vectors from a text hash (the PAHF store needs some embedder; the model is not the point)."""

    def encode(self, texts: list[str]) -> Any:
        import numpy as np

        out = np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=16) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


class Scripted(ChatBackend):
    """Replies with the same text to every request (the fault to inject), counting requests."""

    name = "scripted"

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def generate(
        self, conversations: Sequence[Sequence[Message]], params: SamplingParams | None = None
    ) -> list[Completion]:
        out = []
        for _ in conversations:
            completion = Completion(self.text, 1, 1, "stop")
            self.usage.record(completion)
            out.append(completion)
        return out


@pytest.fixture(scope="module")
def tiny(tiny_qwen2: str) -> ChatBackend:
    from memrl.rollout.hf_local import HFBackend

    return HFBackend(tiny_qwen2)


GARBAGE = SamplingParams(temperature=1.0, max_tokens=24, seed=0)


def run(coro: Any) -> Any:
    start = time.monotonic()
    out = asyncio.run(coro)
    assert time.monotonic() - start < SLOW
    return out


# --- rollout/json_output.py: the parser every JSON site shares ----------------------------------------------------


@CASES
def test_parse_json_object_returns_a_typed_failure(text: str) -> None:
    from memrl.rollout.json_output import JSONParseFailure, parse_json_object

    start = time.monotonic()
    result = parse_json_object(text, required=("agent_notes",))
    assert time.monotonic() - start < SLOW
    if text is MALFORMED["wrong-types"]:
        assert result.ok  # the key is there; the sites check its type
    else:
        assert isinstance(result, JSONParseFailure) and result.reason and result.raw == text


# --- rewards: format reward, LLM judge, the scorer, the reflector evaluation --------------------------------------


@CASES
def test_format_reward_grades_malformed_replies_unusable(text: str) -> None:
    from memrl.rewards.format import UNUSABLE, format_reward

    start = time.monotonic()
    result = format_reward(text)
    assert time.monotonic() - start < SLOW
    assert result.score == UNUSABLE and result.notes is None and result.reason.startswith("unusable")


@CASES
def test_llm_judge_counts_malformed_verdicts(text: str) -> None:
    from memrl.rewards.llm_judge import LLMJudge, parse_verdict
    from memrl.rewards.types import GroundTruth, JudgeItem

    assert isinstance(parse_verdict(text), str)  # the reason there is no verdict
    judge = LLMJudge(Scripted(text), "scripted", retries=1)
    items = [JudgeItem("- be brief", GroundTruth(("Shorter, please.",)))] * 2
    assert run(judge.score_many(items)) == [None, None]
    assert (judge.stats.malformed, judge.stats.failed, judge.stats.requests) == (4, 2, 4)


def test_llm_judge_on_real_garbage_from_the_tiny_model(tiny: ChatBackend) -> None:
    from memrl.rewards.llm_judge import LLMJudge
    from memrl.rewards.types import GroundTruth, JudgeItem

    judge = LLMJudge(tiny, "tiny-qwen2", sampling=GARBAGE, retries=0)
    items = [JudgeItem(f"- note {i}", GroundTruth(("Shorter, please.",))) for i in range(3)]
    verdicts = asyncio.run(judge.score_many(items))
    assert judge.stats.failed == sum(v is None for v in verdicts) > 0
    assert judge.stats.malformed == judge.stats.failed  # every failed item had a reply, and it was malformed


def test_reward_scorer_and_evaluation_count_format_failures() -> None:
    from memrl.rewards.reward import RewardScorer
    from memrl.train.evaluate import summarize

    scorer = RewardScorer()  # the offline judge
    texts = list(MALFORMED.values())
    truths = [{"enforcements": ["Shorter, please."]}] * len(texts)
    parts = scorer.score(texts, truths)
    assert scorer.format_failures == len(texts)
    assert all(p.format == 0.0 and p.format_reason.startswith("unusable") for p in parts)
    metrics = summarize([{"key": str(i), **p.to_dict()} for i, p in enumerate(parts)])
    assert metrics["n"] == metrics["format_failures"] == len(texts)


# --- envs/collab: the agent (reply, retrieval, reflection), the LLM user, the LLM grader --------------------------


def _agent(backend: ChatBackend) -> Any:
    from memrl.envs.collab.agents import AgentKind, CollabAgent, Reflector

    params = SamplingParams(temperature=0.0, max_tokens=24)
    return CollabAgent(AgentKind.MEMORY, backend, params, Reflector(backend, params), retrieval_sampling=params)


def _profile() -> Any:
    from memrl.envs.collab.profiles import UserProfile

    return UserProfile("u1", "A baker", ("blunt", "no-suggestions", "three-sentences"))


TURNS: list[Message] = [{"role": "user", "content": "What is 3 times 4?"}, {"role": "assistant", "content": "12"}]


@CASES
def test_collab_agent_counts_malformed_replies_retrievals_and_reflections(text: str) -> None:
    from memrl.envs.collab.agents import AgentMemory

    agent = _agent(Scripted(text))
    reply = run(agent.reply(_profile(), AgentMemory("- be brief"), TURNS[:1]))
    assert reply.parse_failed and reply.retrieval_failed
    assert reply.retrieved == "- be brief"  # unusable retrieval falls back to all notes
    memory, reflection = run(agent.end_session(AgentMemory("- be brief"), TURNS))
    assert reflection is not None and reflection.parse_failed
    assert memory.notes == "- be brief"  # the old notes are kept, not lost


def test_collab_agent_on_real_garbage_from_the_tiny_model(tiny: ChatBackend) -> None:
    from memrl.envs.collab.agents import AgentKind, AgentMemory, CollabAgent, Reflector

    agent = CollabAgent(AgentKind.MEMORY, tiny, GARBAGE, Reflector(tiny, GARBAGE), retrieval_sampling=GARBAGE)
    reply = asyncio.run(agent.reply(_profile(), AgentMemory("- be brief"), TURNS[:1]))
    assert reply.parse_failed and reply.retrieval_failed
    _, reflection = asyncio.run(agent.end_session(AgentMemory("- be brief"), TURNS))
    assert reflection is not None and reflection.parse_failed


def _user_session(backend: ChatBackend) -> Any:
    from memrl.envs.collab.problems import AnswerKind, Problem
    from memrl.envs.collab.user_sim import LLMUserSimulator

    problem = Problem("arith-x", "arith", "A pen costs $3. How much do 4 pens cost?", "12", AnswerKind.MATH)
    return LLMUserSimulator(backend, SamplingParams(temperature=0.0, max_tokens=24)).start(_profile(), problem, 10)


@CASES
def test_llm_user_counts_malformed_turns(text: str) -> None:
    session = _user_session(Scripted(text))
    opened = run(session.open())
    replied = run(session.reply(TURNS))
    for turn in (opened, replied):
        assert turn.parse_failed and turn.response.strip()  # the session goes on with some user message
        assert not turn.enforce and not turn.terminate


def test_llm_user_on_real_garbage_from_the_tiny_model(tiny: ChatBackend) -> None:
    session = _user_session(tiny)
    assert asyncio.run(session.open()).parse_failed


@CASES
def test_llm_grader_counts_malformed_verdicts(text: str) -> None:
    from memrl.envs.collab.grading import read_judge_output

    grade = read_judge_output(text)
    assert grade.failed and not grade.correct


# --- envs/tod: reader, writer, user simulator, supervisor, intent, reasoner, memory builder, quality judge --------


def test_llm_reader_counts_empty_replies_and_keeps_any_other_text() -> None:
    from memrl.envs.tod.reader import LLMReader

    request = SimpleNamespace(
        conversation=[], missing=["date"], phrases={}, selection=SimpleNamespace(a_core=[]), context=[], followup=[]
    )
    for text in ("", "  \n", "Assistant:   "):
        assert run(LLMReader(Scripted(text), SamplingParams()).respond(request)).failed
    for name in ("prose", "truncated", "huge", "control-chars"):
        reply = run(LLMReader(Scripted(MALFORMED[name]), SamplingParams()).respond(request))
        assert not reply.failed and reply.text  # free text: whatever it says is what the user reads


@pytest.fixture(scope="module")
def tod_plans() -> tuple[Any, list[Any]]:
    from memrl.data_gen.config import TodDataConfig
    from memrl.data_gen.tod.dataset import load_source, plan_from
    from memrl.envs.tod.schema import load_schemas

    plans = plan_from(load_source(SGD), TodDataConfig(sgd_dir=SGD, individuals=6))
    confirming = next(s for s in plans[0].sessions if s.stage == "confirming")
    return load_schemas(SGD), [plans[0].sessions[0], confirming]


@CASES
def test_llm_writer_counts_malformed_sessions_and_templates_them(text: str, tod_plans: tuple[Any, list[Any]]) -> None:
    from memrl.data_gen.tod.session_writers import LLMWriter, TemplateWriter

    schemas, chosen = tod_plans
    writer = LLMWriter(Scripted(text), schemas)
    written = list(writer.write_many(chosen))
    assert writer.fallbacks == 2 and sum(writer.failure_reasons.values()) == 4  # two tries per session, counted
    assert written == [(TemplateWriter(schemas).write(p), True) for p in chosen]


GOAL = {"date": "March 10th", "time": "6 pm"}


@CASES
def test_llm_supervisor_and_user_count_unusable_output(text: str) -> None:
    from memrl.envs.tod.formats import Turn
    from memrl.envs.tod.proactive import LLMSupervisor, LLMUser

    conversation = [Turn(speaker="assistant", utterance="Booked for 6 pm.")]
    verdict = run(LLMSupervisor(Scripted(text), SamplingParams()).resolved(conversation, GOAL, ["date", "time"]))
    assert verdict.failed and verdict.value == ["time"]  # the rule supervisor decided instead
    answer = run(LLMUser(Scripted(text), SamplingParams()).reply(conversation, GOAL, ["date"]))
    assert answer.failed == (not text.strip())  # free text; only an empty answer is unusable
    assert answer.turn.utterance.strip()


@CASES
def test_llm_intent_and_reasoner_count_unusable_output(text: str) -> None:
    from memrl.envs.tod.pipeline import Inference, LLMIntent, parse_slot_list

    class Fallback:
        async def extract(self, view: Any) -> Inference:
            return Inference("fallback intent")

    view = SimpleNamespace(context=[])
    intent = run(LLMIntent(Scripted(text), SamplingParams(), Fallback()).extract(view))
    assert intent.failed and intent.value == "fallback intent"
    assert parse_slot_list(text, "missing_slots", ["date", "time"]) is None  # the reasoner's and supervisor's parse


@CASES
def test_llm_memory_builder_counts_malformed_units(text: str) -> None:
    from memrl.envs.tod.memory import LLMMemoryBuilder

    builder = LLMMemoryBuilder(Scripted(text))
    assert builder.parse(None, None, None, text) is None


@CASES
def test_quality_judge_gives_no_score_for_malformed_output(text: str) -> None:
    from memrl.envs.tod.metrics import parse_quality

    assert parse_quality(text) is None  # `overflow` raised OverflowError (round(inf)) before the parser refused it
    assert parse_quality('{"score": "inf"}') is None and parse_quality('{"score": "7"}') == 7


# --- envs/pahf/agent.py: decision, summary, salience, note and merge --------------------------------------------


@CASES
def test_pahf_agent_counts_every_unusable_reply(text: str) -> None:
    from memrl.envs.pahf.agent import AgentKind, MemoryWriter, PahfAgent, Task, parse_decision, parse_salient
    from memrl.envs.pahf.config import PahfSampling
    from memrl.envs.pahf.memory import SQLiteMemory

    assert parse_decision(text, "ABCD", may_ask=True).action is None and parse_salient(text) is None
    sampling = PahfSampling().agent(seed=0)
    backend = Scripted(text)
    agent = PahfAgent(AgentKind.PAHF, backend, MemoryWriter(backend, sampling, tau=-1.0), sampling)
    task = Task(
        "shopping", "Mira", "Pick a lamp", {"A": "lamp with LED", "B": "lamp with halogen", "D": "buy nothing"}, "A"
    )

    class Minimal:
        async def answer(self, question: str) -> str:
            return "I like LED."

        async def feedback(self, choice: str) -> str | None:
            return "I don't like halogen."

    with SQLiteMemory(None, _HashEmbedder()) as store:
        store.add("Mira", "Mira likes LED lamps")
        outcome = run(agent.run(task, Minimal(), store, learning=True))
        failures = outcome.failures
        assert failures["summary"] == 1 and failures["decision"] == 1 and outcome.choice is None
        write = run(agent.writer.write(store, task, "feedback", "I don't like halogen.", failures))
    # Unusable salience: stored anyway; unusable note: the words; unusable merge (tau -1 always merges): the new note.
    assert failures["salience"] == 1 and failures["note"] == 1 and failures["merge"] == 1
    assert write.action == "merge" and write.note == "Mira: I don't like halogen."


# --- data_gen/reflection.py: teacher gold ------------------------------------------------------------------------


def test_teacher_gold_counts_unusable_reflections() -> None:
    from memrl.data_gen.reflection import build_records
    from memrl.envs.collab.records import SessionRecord

    rows = [
        {
            "user_id": "u1",
            "session": i,
            "problem_id": f"p{i}",
            "task": "arith",
            "preferences": ["blunt"],
            "turns": [
                {"role": "user", "content": "Be blunt, please.", "enforce": True},
                {"role": "assistant", "content": "Fine."},
            ],
            "reflection_raw": text,
        }
        for i, text in enumerate(MALFORMED.values())
    ]
    sessions = [SessionRecord.from_dict(row, f"session {i}") for i, row in enumerate(rows)]
    records, skipped = build_records(sessions, gold="teacher")
    assert records == [] and skipped.teacher_unparsed == len(MALFORMED)
