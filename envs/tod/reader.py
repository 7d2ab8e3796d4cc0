"""Readers: write the assistant's turns from the conversation, the pruned memory (A_core) and the missing slots.

The first reply is the confirmation response r = Reader(c, A_core, L_miss); the proactive loop then asks the same
reader for each later turn, with the user's corrections in the conversation.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from memrl.envs.tod.formats import Turn, as_dicts
from memrl.envs.tod.pipeline import Selection, require_backend
from memrl.envs.tod.prompts import reader_messages
from memrl.envs.tod.schema import Schemas, boolean_clause, is_boolean, slot_phrase
from memrl.rollout.base import ChatBackend, SamplingParams


def humanise(slot: str) -> str:
    return slot.replace("_", " ")


def phrases(schemas: Schemas, service: str, intent: str) -> dict[str, str]:
    """The intent's slots (schema order) as the reader names them: a noun phrase without its article ('date for the
    reservation'), a True/False slot by its condition ('whether the hotel has wifi'). Only `schemas` is read."""
    out = {}
    for name in schemas.intent(service, intent).slots:
        spec = schemas.slot(service, name)
        clause = boolean_clause(spec) if is_boolean(spec) else None
        out[name] = f"whether {clause}" if clause else slot_phrase(spec)
    return out


_DETERMINED = re.compile(r"^(the|a|an|whether|if|which|what|how|your|its|their)\b", re.IGNORECASE)


def asked(phrase: str) -> str:
    """The phrase as the object of 'tell me ...': 'the' before a bare noun phrase, nothing before one that already
    has its determiner or is a clause ('whether the hotel has wifi'), so no article is ever doubled."""
    return phrase if _DETERMINED.match(phrase) else f"the {phrase}"


@dataclass(frozen=True)
class ReaderRequest:
    context: Sequence[Turn]  # the session's turns before the confirmation
    followup: Sequence[Turn]  # turns of the proactive loop so far (empty for the confirmation response)
    selection: Selection
    missing: Sequence[str]  # L_miss from the reasoner
    known: Mapping[str, str]  # slot values the context states
    phrases: Mapping[str, str]  # the intent's slots in schema order -> how the reader names them (`phrases`)

    @property
    def conversation(self) -> list[Turn]:
        return [*self.context, *self.followup]


@dataclass(frozen=True)
class Reply:
    text: str
    slots: dict[str, str] = field(default_factory=dict)  # the values the reply states, when the reader knows them
    failed: bool = False  # the model returned nothing usable


class Reader(ABC):
    @abstractmethod
    async def respond(self, request: ReaderRequest) -> Reply: ...


def _name(request: ReaderRequest, slot: str) -> str:
    return request.phrases.get(slot) or humanise(slot)


@dataclass(frozen=True)
class TemplateReader(Reader):
    """Deterministic: states every value it holds and asks for missing slots that memory cannot fill.

    It holds the values the context states, then for each missing slot the answer of the best-ranked selected QA
    pair of that slot, then the values the user gives in the loop (read from the turn's slot annotations; a user
    turn without annotations is quoted back, so its values still reach the conversation). Slots are named as
    `request.phrases` names them, and one name is stated once and asked at most once: two schema versions' slots
    may share a name ('location of the hotel'), and what the context just gave is neither overridden from memory
    nor asked again.
    """

    def state(self, request: ReaderRequest) -> dict[str, str]:
        state = dict(request.known)
        for scored in request.selection.selected:
            slot = scored.candidate.slot
            named = {_name(request, s) for s in state}
            if slot in request.missing and slot not in state and _name(request, slot) not in named:
                state[slot] = scored.candidate.answer
        for turn in request.followup:
            if turn.speaker == "user":
                state.update(turn.slots)
        order = {slot: i for i, slot in enumerate(request.phrases)}
        return dict(sorted(state.items(), key=lambda kv: order.get(kv[0], len(order))))

    async def respond(self, request: ReaderRequest) -> Reply:
        state = self.state(request)
        summary = "; ".join(dict.fromkeys(f"{_name(request, s)}: {v}" for s, v in state.items()))
        stated = {_name(request, s) for s in state}
        unknown = dict.fromkeys(_name(request, s) for s in request.missing if s not in state)
        ask_for = [asked(n) for n in unknown if n not in stated]
        ask = f" Could you also tell me {' and '.join(ask_for)}?" if ask_for else ""
        if not request.followup:
            text = f"Welcome back! Let me confirm the details: {summary}.{ask} Is that all correct?"
            return Reply(text, state)
        last = request.followup[-1]
        heard = f'Noted: "{last.utterance}". ' if last.speaker == "user" and not last.slots else "Thanks, updated. "
        return Reply(f"{heard}Here is the booking now: {summary}.{ask} Is that all correct?", state)


_SPEAKER_PREFIX = re.compile(r"^\s*(assistant|system)\s*:\s*", re.IGNORECASE)


def missing_names(request: ReaderRequest) -> dict[str, str]:
    """The slots the reasoner found missing, each as the reader names it: what the model reader is told."""
    return {s: _name(request, s) for s in request.missing}


def read_text(raw: str) -> Reply:
    """A model's reply as the assistant's turn: without a speaker prefix it may have written. An empty reply stays
    empty: it states nothing, and is counted as failed."""
    text = _SPEAKER_PREFIX.sub("", raw.strip()).strip()
    return Reply(text, failed=not text)


@dataclass(frozen=True)
class LLMReader(Reader):
    backend: ChatBackend
    sampling: SamplingParams

    async def respond(self, request: ReaderRequest) -> Reply:
        messages = reader_messages(as_dicts(request.conversation), request.selection.a_core, missing_names(request))
        return read_text((await self.backend.achat(messages, self.sampling)).text)


READERS: Mapping[str, Callable[[ChatBackend | None, SamplingParams], Reader]] = {
    "template": lambda backend, sampling: TemplateReader(),
    "llm": lambda backend, sampling: LLMReader(require_backend(backend, "reader"), sampling),
}


def build_reader(kind: str, backend: ChatBackend | None, sampling: SamplingParams) -> Reader:
    return READERS[kind](backend, sampling)
