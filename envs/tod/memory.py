"""Memory banks: one unit per session, an intent description (k_i) plus one QA pair per slot fact of that session.

The anchor of a task lives in the unit's intent description ("reserve a table at a restaurant; name of the restaurant
Sino"); the QA pairs carry the facts with generic, schema-derived questions. `TemplateMemoryBuilder` is offline and
deterministic: it reads a generated session's turn annotations, and an unannotated (released) session's words through
`extract.TextExtractor`, never the confirmation state. `LLMMemoryBuilder` asks a chat model for the same JSON (the
paper's memory writer) and falls back to the template, per session, whenever the reply is unusable. Access is causal:
a query at session t only sees `bank.before(t)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memrl.core.files import atomic_write_json
from memrl.envs.tod.extract import Lexicon, TextExtractor, lexicon_from_sgd
from memrl.envs.tod.formats import Individual, Session, Turn, read_json
from memrl.envs.tod.schema import Schemas, TodDataError, intent_phrase, slot_phrase, slot_question
from memrl.envs.tod.values import mentions, same_value
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import field_text, parse_json_object


@dataclass(frozen=True)
class QAPair:
    slot: str
    question: str
    answer: str


@dataclass(frozen=True)
class MemoryUnit:
    persona_id: int
    session_id: int
    reference_dialogue_id: str
    service: str
    intent: str
    intent_description: str
    qa: tuple[QAPair, ...]

    def to_record(self) -> dict[str, Any]:
        return {
            "persona_id": self.persona_id,
            "session_id": self.session_id,
            "reference_dialogue_id": self.reference_dialogue_id,
            "service": self.service,
            "intent": self.intent,
            "intent_description": self.intent_description,
            "qa": [{"slot": p.slot, "question": p.question, "answer": p.answer} for p in self.qa],
        }

    @classmethod
    def of_session(cls, persona_id: int, session: Session, description: str, qa: tuple[QAPair, ...]) -> MemoryUnit:
        return cls(
            persona_id=persona_id,
            session_id=session.session_id,
            reference_dialogue_id=session.reference_dialogue_id,
            service=session.service,
            intent=session.intent,
            intent_description=description,
            qa=qa,
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> MemoryUnit:
        return cls(
            persona_id=int(record["persona_id"]),
            session_id=int(record["session_id"]),
            reference_dialogue_id=str(record["reference_dialogue_id"]),
            service=str(record["service"]),
            intent=str(record["intent"]),
            intent_description=str(record["intent_description"]),
            qa=tuple(QAPair(str(p["slot"]), str(p["question"]), str(p["answer"])) for p in record["qa"]),
        )


@dataclass
class MemoryBank:
    persona_id: int
    units: list[MemoryUnit]  # time order

    def before(self, session_id: int) -> list[MemoryUnit]:
        """The units of sessions strictly earlier than `session_id`: all a query at that session may see."""
        return [u for u in self.units if u.session_id < session_id]

    def to_record(self) -> dict[str, Any]:
        return {"persona_id": self.persona_id, "units": [u.to_record() for u in self.units]}


# --- facts of a session ---------------------------------------------------------------------------------------------


def session_facts(session: Session, extractor: TextExtractor) -> dict[str, str]:
    """Slot -> last value stated in the session: the turns' annotations (generated data, whose confirmation state
    counts as stated), else what `extractor` reads in the words."""
    turns: Sequence[Turn] = session.turns
    if not any(t.slots for t in turns):
        return extractor.facts(session)
    facts: dict[str, str] = {}
    for turn in turns:
        facts.update(turn.slots)
    if session.confirmation_state is not None:
        facts.update(session.confirmation_state.slot_values)
    return facts


def template_intent_description(session: Session, facts: Mapping[str, str], schemas: Schemas) -> str:
    """The intent phrase and the session's first fact in schema order (the task's anchor when it was stated)."""
    text = intent_phrase(schemas.intent(session.service, session.intent))
    ordered = schemas.service(session.service).in_slot_order(session.intent, facts)
    if ordered:
        anchor = ordered[0]
        text += f"; {slot_phrase(schemas.slot(session.service, anchor))} {facts[anchor]}"
    return text


def ordered_qa(session: Session, facts: Mapping[str, str], schemas: Schemas) -> tuple[QAPair, ...]:
    slots = schemas.service(session.service).in_slot_order(session.intent, facts)
    return tuple(QAPair(s, slot_question(schemas.slot(session.service, s)), facts[s]) for s in slots)


class MemoryBuilder(Protocol):
    failures: int

    def build(self, ind: Individual, schemas: Schemas) -> list[MemoryUnit]: ...


@dataclass
class TemplateMemoryBuilder:
    """Offline units from slot annotations, or from what an unannotated session's words state; never fails.

    `lexicon` lists known values of free-text slots (`extract.lexicon_from_sgd`), which the extractor looks for."""

    failures: int = 0
    lexicon_from: Path | None = None  # an SGD schema file or folder; its dialogues give the lexicon, read when needed
    _lexicon: Lexicon | None = field(default=None, init=False, repr=False)

    @property
    def lexicon(self) -> Lexicon:
        if self._lexicon is None:
            self._lexicon = lexicon_from_sgd(self.lexicon_from) if self.lexicon_from is not None else {}
        return self._lexicon

    def unit(self, ind: Individual, session: Session, schemas: Schemas) -> MemoryUnit:
        annotated = any(t.slots for t in session.turns)
        facts = session_facts(session, TextExtractor(schemas, {} if annotated else self.lexicon))
        description = template_intent_description(session, facts, schemas)
        return MemoryUnit.of_session(ind.persona_id, session, description, ordered_qa(session, facts, schemas))

    def build(self, ind: Individual, schemas: Schemas) -> list[MemoryUnit]:
        return [self.unit(ind, s, schemas) for s in ind.sessions]


MEMORY_SYSTEM = "You turn a conversation into compact memory notes for a task assistant. Answer with one JSON object."


def memory_prompt(session: Session, schemas: Schemas) -> str:
    service = schemas.service(session.service)
    slots = "\n".join(f"- {s.name}: {s.description}" for s in service.slots.values())
    dialogue = "\n".join(f"{t.speaker}: {t.utterance}" for t in session.turns)
    return (
        f"Conversation about the task '{intent_phrase(schemas.intent(session.service, session.intent))}':\n"
        f"{dialogue}\n\n"
        f"Slots this service knows:\n{slots}\n\n"
        "Write a short command-like description of what the user wants, naming the place or item it is about, and "
        "one question-answer pair for every slot value the conversation settles (the latest value when it changes). "
        "Use only the slot names listed; copy each answer exactly as it appears in the conversation.\n"
        'Format: {"intent_description": "...", "qa_pairs": [{"slot": "...", "question": "...", "answer": "..."}]}'
    )


@dataclass
class LLMMemoryBuilder:
    """Units from a chat model; a session whose reply is malformed, names an unknown slot or an answer not in the
    conversation is counted in `failures` and built by the template instead."""

    backend: ChatBackend
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=384))
    failures: int = 0
    template: TemplateMemoryBuilder = field(default_factory=TemplateMemoryBuilder)

    def messages(self, session: Session, schemas: Schemas) -> list[Message]:
        return [
            {"role": "system", "content": MEMORY_SYSTEM},
            {"role": "user", "content": memory_prompt(session, schemas)},
        ]

    def build(self, ind: Individual, schemas: Schemas) -> list[MemoryUnit]:
        replies = self.backend.generate([self.messages(s, schemas) for s in ind.sessions], self.params)
        units = []
        for session, reply in zip(ind.sessions, replies, strict=True):
            unit = self.parse(ind, session, schemas, reply.text)
            if unit is None:
                self.failures += 1
                unit = self.template.unit(ind, session, schemas)
            units.append(unit)
        return units

    def parse(self, ind: Individual, session: Session, schemas: Schemas, text: str) -> MemoryUnit | None:
        parsed = parse_json_object(text, required=["intent_description", "qa_pairs"])
        if not parsed.ok:
            return None
        data: dict[str, Any] = parsed.data  # type: ignore[union-attr]
        description = field_text(data["intent_description"]).strip()
        pairs = data["qa_pairs"]
        if not description or not isinstance(pairs, list):
            return None
        said = " \n ".join(t.utterance for t in session.turns)
        latest: dict[str, QAPair] = {}
        for pair in pairs:
            if not isinstance(pair, dict) or not all(isinstance(pair.get(k), str) for k in ("slot", "answer")):
                return None
            slot, answer = pair["slot"].strip(), pair["answer"].strip()
            if not schemas.has_slot(session.service, slot) or not mentions(said, answer):
                return None
            question = str(pair.get("question") or "").strip() or slot_question(schemas.slot(session.service, slot))
            latest[slot] = QAPair(slot, question, answer)
        qa = tuple(latest[s] for s in schemas.service(session.service).in_slot_order(session.intent, latest))
        return MemoryUnit.of_session(ind.persona_id, session, description, qa)


def memory_coverage(individuals: Iterable[Individual], banks: Mapping[int, MemoryBank]) -> dict[str, Any]:
    """How many confirmed (slot, value) facts the memory holds before their confirmation, against all of them.

    `in_context` counts the facts the confirming session itself states before confirming (no memory needed); `held`
    counts those an earlier unit of the same task stores with the confirmed value; `superseded` the stored pairs of
    the same task and slot whose value the user later changed."""
    facts = held = in_context = superseded = 0
    for ind in individuals:
        for session in ind.sessions:
            if session.confirmation_state is None or not session.scored:
                continue
            goal = session.confirmation_state.slot_values
            said = " \n ".join(t.utterance for t in session.context())
            earlier = banks[ind.persona_id].before(session.session_id)
            stored = [p for u in earlier if u.reference_dialogue_id == session.reference_dialogue_id for p in u.qa]
            for slot, value in goal.items():
                facts += 1
                in_context += mentions(said, value)
                held += any(p.slot == slot and same_value(p.answer, value) for p in stored)
            superseded += sum(p.slot in goal and not same_value(p.answer, goal[p.slot]) for p in stored)
    return {
        "gold_facts": facts,
        "held": held,
        "held_rate": round(held / facts, 4) if facts else None,
        "in_context": in_context,
        "superseded_pairs": superseded,
    }


def build_memory_bank(ind: Individual, schemas: Schemas, builder: MemoryBuilder | None = None) -> MemoryBank:
    units = (builder or TemplateMemoryBuilder()).build(ind, schemas)
    return MemoryBank(ind.persona_id, sorted(units, key=lambda u: u.session_id))


# --- files --------------------------------------------------------------------------------------------------------


def memory_path(tod_dir: str | Path, persona_id: int) -> Path:
    return Path(tod_dir) / "memory" / f"persona_{persona_id}.json"


def write_memory_bank(bank: MemoryBank, tod_dir: str | Path) -> Path:
    """`tod_dir/memory/persona_<id>.json`, one atomic file per individual."""
    return atomic_write_json(memory_path(tod_dir, bank.persona_id), bank.to_record())


def read_memory_bank(path: Path) -> MemoryBank:
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("units"), list) or "persona_id" not in data:
        raise TodDataError(f"{path}: a memory bank is an object with persona_id and units")
    units = []
    for i, record in enumerate(data["units"]):
        try:
            units.append(MemoryUnit.from_record(record))
        except KeyError as exc:
            raise TodDataError(f"{path}: units[{i}].{exc.args[0]}: missing") from exc
        except (TypeError, ValueError) as exc:
            raise TodDataError(f"{path}: units[{i}]: malformed ({exc})") from exc
    return MemoryBank(int(data["persona_id"]), sorted(units, key=lambda u: u.session_id))


def load_memory_banks(
    tod_dir: str | Path, individuals: Iterable[Individual], schemas: Schemas, builder: MemoryBuilder | None = None
) -> dict[int, MemoryBank]:
    """Persona id -> bank: `tod_dir/memory/persona_<id>.json` when present, else built offline (released files)."""
    banks = {}
    for ind in individuals:
        path = memory_path(tod_dir, ind.persona_id)
        if path.exists():
            bank = read_memory_bank(path)
            if bank.persona_id != ind.persona_id:
                raise TodDataError(f"{path}: persona_id {bank.persona_id}, expected {ind.persona_id}")
            known = {s.session_id for s in ind.sessions}
            stray = [u.session_id for u in bank.units if u.session_id not in known]
            if stray:
                raise TodDataError(f"{path}: units name session {stray[0]}, which persona {ind.persona_id} lacks")
        else:
            bank = build_memory_bank(ind, schemas, builder)
        banks[ind.persona_id] = bank
    return banks
