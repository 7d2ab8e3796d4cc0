"""Collaborative agents: what each knows about the user, how it answers, and how it updates its memory.

Kinds (the paper's settings): `none` (no memory, S3), `oracle` (told the preferences, S4), `memory` (notes in the
system prompt + per-turn retrieval + session-level reflection, S5), `history-3` / `history-all` (transcripts of the
last 3 / all earlier sessions instead of notes, Appendix E).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from memrl.core.preferences import as_prompt_text, get_preference
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.prompts import (
    AGENT_KEYS,
    ReplyFormat,
    agent_messages,
    reflection_messages,
    render_conversation,
    retrieval_messages,
)
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, field_text, parse_json_object

RETRIEVAL_SAMPLING = SamplingParams(temperature=0.0, max_tokens=192)


def _is_text(value: object) -> bool:
    """A field that can be read as text: a string, or the lists and objects small models write (field_text)."""
    return isinstance(value, str | list | dict)


def read_agent_reply(raw: str, reply: ReplyFormat = "json") -> tuple[str, bool]:
    """(what the user reads, whether the agent's JSON was unusable): its `response`, else the raw text, counted (a
    run never stops on one bad reply). A plain-text reply is read as it is."""
    if reply == "text":
        return raw.strip(), False
    parsed = parse_json_object(raw, required=AGENT_KEYS[-1:])
    value = None if isinstance(parsed, JSONParseFailure) else parsed.data["response"]
    response = field_text(value).strip() if _is_text(value) else ""
    return (response, False) if response else (raw.strip(), True)


class AgentKind(StrEnum):
    NONE = "none"
    ORACLE = "oracle"
    MEMORY = "memory"
    HISTORY_3 = "history-3"
    HISTORY_ALL = "history-all"


@dataclass
class AgentMemory:
    """What an agent carries from one session with a user to the next; saved in every session record."""

    notes: str = ""
    transcripts: list[list[Message]] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        return {"notes": self.notes, "transcripts": self.transcripts}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> AgentMemory:
        return cls(record.get("notes", ""), [list(t) for t in record.get("transcripts", [])])


@dataclass(frozen=True)
class AgentReply:
    text: str
    parse_failed: bool = False
    retrieved: str | None = None
    retrieval_failed: bool = False


@dataclass(frozen=True)
class Reflection:
    notes: str
    reasoning: str = ""
    raw: str = ""
    parse_failed: bool = False


@dataclass(frozen=True)
class Reflector:
    """Session-level reflection: (notes, conversation) -> updated notes. Any backend, e.g. a trained checkpoint."""

    backend: ChatBackend
    sampling: SamplingParams

    async def reflect(self, notes: str, turns: Sequence[Message]) -> Reflection:
        raw = (await self.backend.achat(reflection_messages(notes, turns), self.sampling)).text
        return read_reflection(raw, notes)


def read_reflection(raw: str, notes: str) -> Reflection:
    """A reflection's text (the answer to `reflection_messages`) -> the updated notes; unreadable, the old `notes`
    are kept rather than lost and the parse failure is flagged."""
    parsed = parse_json_object(raw, required=("agent_notes",))
    if isinstance(parsed, JSONParseFailure) or not _is_text(parsed.data["agent_notes"]):
        return Reflection(notes, raw=raw, parse_failed=True)
    data = parsed.data
    updated = field_text(data.get("agent_notes")).strip() or notes
    return Reflection(updated, field_text(data.get("user_preferences_reasoning")), raw)


def oracle_notes(preferences: Sequence[str]) -> str:
    """What an agent that knows the user is told: each preference as the user would state it, one line each."""
    return "\n".join(f"- {as_prompt_text(get_preference(p))}" for p in preferences)


def _oracle(profile: UserProfile, memory: AgentMemory) -> str:
    return oracle_notes(profile.preferences)


def _transcripts(last: int | None) -> Callable[[UserProfile, AgentMemory], str]:
    def knowledge(profile: UserProfile, memory: AgentMemory) -> str:
        picked = memory.transcripts if last is None else memory.transcripts[-last:]
        return "\n\n".join(f"## Session {i + 1}\n{render_conversation(t)}" for i, t in enumerate(picked))

    return knowledge


# kind -> (prompt section, what goes in it)
_KNOWLEDGE: dict[AgentKind, tuple[str, Callable[[UserProfile, AgentMemory], str]]] = {
    AgentKind.NONE: ("none", lambda profile, memory: ""),
    AgentKind.ORACLE: ("oracle", _oracle),
    AgentKind.MEMORY: ("notes", lambda profile, memory: memory.notes),
    AgentKind.HISTORY_3: ("history", _transcripts(3)),
    AgentKind.HISTORY_ALL: ("history", _transcripts(None)),
}


@dataclass(frozen=True)
class CollabAgent:
    kind: AgentKind
    backend: ChatBackend
    sampling: SamplingParams
    reflector: Reflector | None = None  # required for kind `memory`
    retrieval_sampling: SamplingParams = RETRIEVAL_SAMPLING
    reply_format: ReplyFormat = "json"

    def __post_init__(self) -> None:
        if self.kind is AgentKind.MEMORY and self.reflector is None:
            raise ValueError("a memory agent needs a reflector")

    async def _retrieve(self, notes: str, turns: Sequence[Message]) -> tuple[str, bool]:
        """Per-turn retrieval: the notes relevant to the next reply (all notes when the output is unusable)."""
        raw = (await self.backend.achat(retrieval_messages(notes, turns), self.retrieval_sampling)).text
        parsed = parse_json_object(raw, required=("relevant_notes",))
        if isinstance(parsed, JSONParseFailure) or not _is_text(parsed.data["relevant_notes"]):
            return notes, True
        return field_text(parsed.data["relevant_notes"]).strip() or notes, False

    async def reply(self, profile: UserProfile, memory: AgentMemory, turns: Sequence[Message]) -> AgentReply:
        section, knowledge = _KNOWLEDGE[self.kind]
        text = knowledge(profile, memory)
        retrieved, retrieval_failed = None, False
        if self.kind is AgentKind.MEMORY and memory.notes:
            retrieved, retrieval_failed = await self._retrieve(memory.notes, turns)
            text = f"{memory.notes}\n\nMost relevant right now:\n{retrieved}"
        messages = agent_messages(section, text, turns, self.sampling.max_tokens, self.reply_format)
        raw = (await self.backend.achat(messages, self.sampling)).text
        text, parse_failed = read_agent_reply(raw, self.reply_format)
        return AgentReply(text, parse_failed, retrieved, retrieval_failed)

    async def end_session(self, memory: AgentMemory, turns: Sequence[Message]) -> tuple[AgentMemory, Reflection | None]:
        """The memory for the next session with this user."""
        transcripts = [*memory.transcripts, list(turns)]
        if self.kind is AgentKind.MEMORY:
            assert self.reflector is not None
            reflection = await self.reflector.reflect(memory.notes, turns)
            return AgentMemory(reflection.notes, []), reflection
        if self.kind in (AgentKind.HISTORY_3, AgentKind.HISTORY_ALL):
            return AgentMemory("", transcripts), None
        return AgentMemory(), None
