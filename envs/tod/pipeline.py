"""Memory-guided planning for one confirming session: what the user wants, what is still missing, what to recall.

intent query (schema | LLM) -> intent-aligned retrieval over the memory units of earlier sessions -> missing slots
(schema | LLM chain of thought) -> judger scores -> fused with the retrieval scores -> top K -> A_core (answers only).
LLM roles never stop a run: unusable output is counted and that session falls back to the offline schema role.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.envs.tod.formats import Session, Turn, as_dicts
from memrl.envs.tod.memory import MemoryUnit
from memrl.envs.tod.prompts import INTENT_KEYS, REASONER_KEYS, intent_messages, reasoner_messages
from memrl.envs.tod.reasoning import schema_intent_query, schema_missing_slots
from memrl.envs.tod.retrieval import DEFAULT_ALPHA, Candidate, Fusion, Retriever, fuse, retrieve
from memrl.envs.tod.schema import Schemas
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, field_text, parse_json_object
from memrl.rollout.judger import JudgerInput


@dataclass(frozen=True)
class SessionView:
    """What the pipeline works from for one held-out confirming session.

    `goal` (the confirmed values) only lets the offline roles find values stated in unannotated text, the way the
    judger data was labelled; no role reads it to decide what to say.
    """

    persona_id: int
    session: Session
    context: list[Turn]
    goal: dict[str, str]
    memory: list[MemoryUnit]  # units of the individual's earlier sessions only


@dataclass(frozen=True)
class Inference:
    """One role's output for a session; `failed` when the model's output was unusable and the fallback answered."""

    value: Any
    failed: bool = False
    reasoning: str = ""


# --- intent query -------------------------------------------------------------------------------------------------


class IntentExtractor(ABC):
    @abstractmethod
    async def extract(self, view: SessionView) -> Inference:
        """k_cur: a short phrase for the user's goal, used to find memory units of the same task."""


@dataclass(frozen=True)
class SchemaIntent(IntentExtractor):
    """Offline: the intent's schema description plus the values the context states."""

    schemas: Schemas

    async def extract(self, view: SessionView) -> Inference:
        s = view.session
        return Inference(schema_intent_query(view.context, s.service, s.intent, self.schemas, view.goal))


@dataclass(frozen=True)
class LLMIntent(IntentExtractor):
    backend: ChatBackend
    sampling: SamplingParams
    fallback: IntentExtractor

    async def extract(self, view: SessionView) -> Inference:
        raw = (await self.backend.achat(intent_messages(as_dicts(view.context)), self.sampling)).text
        parsed = parse_json_object(raw, required=INTENT_KEYS)
        phrase = "" if isinstance(parsed, JSONParseFailure) else field_text(parsed.data["intent"]).strip()
        if not phrase:
            return Inference((await self.fallback.extract(view)).value, failed=True)
        return Inference(phrase)


# --- missing slots ------------------------------------------------------------------------------------------------


class MissingSlotReasoner(ABC):
    @abstractmethod
    async def missing(self, view: SessionView) -> Inference:
        """L_miss: the intent's slots the context leaves unresolved, as schema slot names."""


@dataclass(frozen=True)
class SchemaReasoner(MissingSlotReasoner):
    """Offline: the intent's required and optional slots minus those the context fills."""

    schemas: Schemas

    async def missing(self, view: SessionView) -> Inference:
        spec = self.schemas.intent(view.session.service, view.session.intent)
        return Inference(schema_missing_slots(view.context, spec, view.goal))


@dataclass(frozen=True)
class LLMReasoner(MissingSlotReasoner):
    """Chain of thought over the intent's slots; the answer is kept only where it names schema slots."""

    schemas: Schemas
    backend: ChatBackend
    sampling: SamplingParams
    fallback: MissingSlotReasoner

    async def missing(self, view: SessionView) -> Inference:
        s = view.session
        spec = self.schemas.intent(s.service, s.intent)
        slots = {name: self.schemas.slot(s.service, name).description for name in spec.slots}
        messages = reasoner_messages(as_dicts(view.context), spec.name, spec.description, slots)
        raw = (await self.backend.achat(messages, self.sampling)).text
        parsed = parse_slot_list(raw, REASONER_KEYS[0], spec.slots)
        if parsed is None:
            return Inference((await self.fallback.missing(view)).value, failed=True)
        return Inference(parsed[0], reasoning=parsed[1])


def parse_slot_list(raw: str, key: str, allowed: Sequence[str]) -> tuple[list[str], str] | None:
    """The slot names a model listed under `key`, kept in `allowed` order, and its reasoning; None when unusable.

    Names outside `allowed` are dropped; a non-empty list with none of them left is as unusable as no list.
    """
    parsed = parse_json_object(raw, required=(key,))
    if isinstance(parsed, JSONParseFailure):
        return None
    named = parsed.data[key]
    named = [named] if isinstance(named, str) else named  # small models write one name as a bare string
    if not isinstance(named, list):
        return None
    wanted = {str(n).strip() for n in named}
    kept = [slot for slot in allowed if slot in wanted]
    if named and not kept:
        return None
    return kept, field_text(parsed.data.get("reasoning"))


# --- memory selection ---------------------------------------------------------------------------------------------


def candidate_key(persona_id: int, session_id: int, unit: MemoryUnit, slot: str) -> str:
    """The key the judger data gives a (query, QA pair) row: persona/session/memory session/slot."""
    return f"{persona_id}/{session_id}/{unit.session_id}/{slot}"


def candidates(persona_id: int, session_id: int, units: Sequence[MemoryUnit]) -> list[Candidate]:
    return [
        Candidate(
            key=candidate_key(persona_id, session_id, unit, qa.slot),
            unit=unit.session_id,
            intent_description=unit.intent_description,
            slot=qa.slot,
            question=qa.question,
            answer=qa.answer,
        )
        for unit in units
        for qa in unit.qa
    ]


@dataclass(frozen=True)
class Scored:
    candidate: Candidate
    retrieval: float  # s_pre, normalised to [0, 1] per query
    judger: float | None  # P(relevant), None without a judger
    final: float  # the fused score (`retrieval.fuse`, on the selector's scale); s_pre without a judger

    def to_record(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "key": c.key,
            "slot": c.slot,
            "answer": c.answer,
            "retrieval": round(self.retrieval, 4),
            "judger": None if self.judger is None else round(self.judger, 4),
            "final": round(self.final, 4),
        }


@dataclass(frozen=True)
class Selection:
    ranked: tuple[Scored, ...]  # every retrieved QA pair, best first
    top_k: int
    by_retrieval: tuple[str, ...] = ()  # the pair keys as retrieval alone ranks them
    by_judger: tuple[str, ...] | None = None  # the pair keys by judger score alone; None without a judger

    @property
    def selected(self) -> tuple[Scored, ...]:
        return self.ranked[: self.top_k]

    @property
    def a_core(self) -> list[str]:
        """The pruned memory the reader gets: answers of the top K pairs, questions dropped."""
        return [s.candidate.answer for s in self.selected]

    @property
    def keys(self) -> list[str]:
        return [s.candidate.key for s in self.ranked]

    @property
    def rankings(self) -> dict[str, list[str] | None]:
        """The orders recall is scored on beside the fused one (`keys`): retrieval alone, the judger alone."""
        return {
            "retrieval": list(self.by_retrieval),
            "judger": None if self.by_judger is None else list(self.by_judger),
        }


class Judger(Protocol):
    """Scores QA pairs for a context and its missing slots: P(relevant) each (B's `JudgerScorer`)."""

    def score(self, items: Sequence[JudgerInput], batch_size: int = ...) -> list[float]: ...


@dataclass(frozen=True)
class MemorySelector:
    retriever: Retriever
    judger: Judger | None  # None ranks by retrieval alone
    alpha: float = DEFAULT_ALPHA
    top_k: int = 5
    top_units: int | None = None
    fusion: Fusion = "rank"

    def select(
        self, query: str, pool: Sequence[Candidate], context: Sequence[Turn], missing: Sequence[str]
    ) -> Selection:
        hits = retrieve(query, pool, self.retriever, self.top_units)
        if not hits:
            return Selection((), self.top_k, (), None if self.judger is None else ())
        s_pre = [score for _, score in hits]
        s_judger: list[float] | None = None
        final = s_pre
        if self.judger is not None:
            turns = as_dicts(context)
            # `task` is the intent query retrieval used: the judger was trained reading the data's `intent_query`.
            items = [
                JudgerInput(turns, list(missing), c.question, c.answer, c.intent_description, c.slot, task=query)
                for c, _ in hits
            ]
            s_judger = self.judger.score(items)
            final = fuse(s_pre, s_judger, self.alpha, self.fusion)
        scored = [
            Scored(c, s_pre[i], None if s_judger is None else s_judger[i], final[i]) for i, (c, _) in enumerate(hits)
        ]
        order = sorted(range(len(scored)), key=lambda i: -scored[i].final)  # stable: ties keep retrieval order
        by_judger = None
        if s_judger is not None:  # stable: ties keep retrieval order
            judged = s_judger
            by_judger = tuple(hits[i][0].key for i in sorted(range(len(hits)), key=lambda i: -judged[i]))
        by_retrieval = tuple(c.key for c, _ in hits)
        return Selection(tuple(scored[i] for i in order), self.top_k, by_retrieval, by_judger)


# --- the planner --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    intent_query: str
    missing: list[str]
    reasoning: str
    selection: Selection
    failures: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryPlanner:
    intent: IntentExtractor
    reasoner: MissingSlotReasoner
    selector: MemorySelector

    async def plan(self, view: SessionView) -> Plan:
        query, missing = await asyncio.gather(self.intent.extract(view), self.reasoner.missing(view))
        pool = candidates(view.persona_id, view.session.session_id, view.memory)
        selection = self.selector.select(query.value, pool, view.context, missing.value)
        failures = {"intent": int(query.failed), "reasoner": int(missing.failed)}
        return Plan(query.value, list(missing.value), missing.reasoning, selection, failures)


# --- builders: a role's name -> how to build it -------------------------------------------------------------------


def require_backend(backend: ChatBackend | None, role: str) -> ChatBackend:
    if backend is None:
        raise ValueError(f"the llm {role} needs a model")
    return backend


INTENT_EXTRACTORS: Mapping[str, Callable[[Schemas, ChatBackend | None, SamplingParams], IntentExtractor]] = {
    "schema": lambda schemas, backend, sampling: SchemaIntent(schemas),
    "llm": lambda schemas, backend, sampling: LLMIntent(
        require_backend(backend, "intent extractor"), sampling, SchemaIntent(schemas)
    ),
}

REASONERS: Mapping[str, Callable[[Schemas, ChatBackend | None, SamplingParams], MissingSlotReasoner]] = {
    "schema": lambda schemas, backend, sampling: SchemaReasoner(schemas),
    "llm": lambda schemas, backend, sampling: LLMReasoner(
        schemas, require_backend(backend, "reasoner"), sampling, SchemaReasoner(schemas)
    ),
}


def build_intent(kind: str, schemas: Schemas, backend: ChatBackend | None, sampling: SamplingParams) -> IntentExtractor:
    return INTENT_EXTRACTORS[kind](schemas, backend, sampling)


def build_reasoner(
    kind: str, schemas: Schemas, backend: ChatBackend | None, sampling: SamplingParams
) -> MissingSlotReasoner:
    return REASONERS[kind](schemas, backend, sampling)
