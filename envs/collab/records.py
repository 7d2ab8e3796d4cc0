"""The collab session record: what one played session leaves, typed, with its one writer and its one reader.

`PlayedSession` is the environment's side (`CollabEpisode.record()`: the turns, the grade, the reward parts);
`SessionRecord` adds the agent's side (its kind, notes before and after, its reflection, its memory) and is a line of
`sessions.jsonl`. `to_dict` writes the JSON keys, in the order, that runs have always written; `read_sessions` and
`SessionRecord.from_dict` read them back, refusing a bad row in one line naming `PATH:LINE` and the key.

The reader requires what every reader of a session needs (who, which problem, the preferences, the turns); the rest
has a default for records that lack it: hand-written inputs of `memrl data reflection`, and runs recorded before
`truncations`, `unsaid_reaction` or `node` were written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import numbered_jsonl
from memrl.core.rows import RowReader

Turn = dict[str, Any]  # {"role", "content"} and what the session logged with it (`enforce`, `violated`, `retrieved`)


def session_key(user_id: str, index: int) -> str:
    return f"{user_id}/{index}"


@dataclass(frozen=True)
class PlayedSession:
    """The environment's side of a finished session: what `CollabEpisode.record()` writes."""

    key: str  # "{user_id}/{session}"
    user_id: str
    session: int  # 0-based index in the user's sequence
    task: str
    problem_id: str
    preferences: tuple[str, ...]  # the user's true preference ids
    turns: tuple[Turn, ...]
    unsaid_reaction: dict[str, Any] | None  # the user's reaction to a last reply that time cut off
    enforcing_utterances: tuple[str, ...]  # epsilon: the user turns that enforced a preference
    draft_answer: str  # the graded draft
    gold_answer: str
    grade: dict[str, Any]  # correct, method, reasoning
    task_success: int  # 0/1
    user_effort: int  # enforcing utterances
    length: int  # turns
    ended_by: str  # "user" or "max_turns"
    parse_failures: dict[str, int]  # per model role
    truncations: dict[str, int]  # per model role: replies cut at the token budget
    started_at: float
    finished_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            **_identity(self),
            "preferences": list(self.preferences),
            **_conversation(self),
            "parse_failures": self.parse_failures,
            "truncations": self.truncations,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True)
class SessionRecord(PlayedSession):
    """A line of `sessions.jsonl`: the outcome, the agent's side, and where it ran. `parse_failures` has the
    reflection's too; `finished_at` is after the reflection."""

    agent: str  # the agent kind
    notes_before: str
    notes_after: str
    reflection_reasoning: str
    reflection_raw: str  # the reflector's raw reply ("" when the agent does not reflect)
    memory: dict[str, Any]  # the agent's memory after the session (AgentMemory.to_record())
    node: str | None = None  # the Ray node it ran on (None outside Ray)

    @classmethod
    def of(cls, outcome: PlayedSession, **agent_side: Any) -> SessionRecord:
        """The record of `outcome` with the agent's side (and any outcome field the agent's side overrides)."""
        return cls(**{f.name: getattr(outcome, f.name) for f in fields(PlayedSession)} | agent_side)

    def to_dict(self) -> dict[str, Any]:
        return {
            **_identity(self),
            "agent": self.agent,
            "preferences": list(self.preferences),
            **_conversation(self),
            "truncations": self.truncations,
            "notes_before": self.notes_before,
            "notes_after": self.notes_after,
            "reflection_reasoning": self.reflection_reasoning,
            "reflection_raw": self.reflection_raw,
            "parse_failures": self.parse_failures,
            "memory": self.memory,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "node": self.node,
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], where: str) -> SessionRecord:
        """A record from its JSON object; a missing required key or a value of the wrong kind raises ConfigError
        `WHERE: ...` naming the key (`where`: `PATH:LINE`, or which session of a run)."""
        read = RowReader(row, where, "session record")
        read.require(REQUIRED)
        turns = read.turns("turns", ("role", "content"))
        said = [t["content"] for t in turns if t["role"] == "user" and t.get("enforce")]  # records before it was kept
        enforcing = read.texts("enforcing_utterances", said)
        user_id, session = read.text("user_id"), read.integer("session")
        return cls(
            key=read.text("key", session_key(user_id, session)),
            user_id=user_id,
            session=session,
            task=read.text("task"),
            problem_id=read.text("problem_id"),
            preferences=read.texts("preferences"),
            turns=turns,
            unsaid_reaction=read.optional_object("unsaid_reaction"),
            enforcing_utterances=enforcing,
            draft_answer=read.text("draft_answer", ""),
            gold_answer=read.text("gold_answer", ""),
            grade=read.object("grade", {}),
            task_success=read.integer("task_success", 0),
            user_effort=read.integer("user_effort", len(enforcing)),
            length=read.integer("length", len(turns)),
            ended_by=read.text("ended_by", ""),
            parse_failures=read.counts("parse_failures", {}),
            truncations=read.counts("truncations", {}),
            started_at=read.number("started_at", 0.0),
            finished_at=read.number("finished_at", 0.0),
            agent=read.text("agent", ""),
            notes_before=read.text("notes_before", ""),
            notes_after=read.text("notes_after", ""),
            reflection_reasoning=read.text("reflection_reasoning", ""),
            reflection_raw=read.text("reflection_raw", ""),
            memory=read.object("memory", {}),
            node=read.optional_text("node"),
        )


# What every reader of a session needs; the other keys have defaults (see the module's docstring).
REQUIRED = ("user_id", "session", "problem_id", "task", "preferences", "turns")


def read_sessions(path: str | Path) -> list[SessionRecord]:
    """The records of one `sessions.jsonl`; anything malformed is a ConfigError naming `PATH:LINE`."""
    if not Path(path).exists():  # any other kind is named by the reader: "PATH: a FIFO (named pipe), not a file"
        raise ConfigError(f"sessions file not found: {path}")
    return [SessionRecord.from_dict(row, f"{path}:{n}") for n, row in numbered_jsonl(path, ConfigError, torn=False)]


def _identity(outcome: PlayedSession) -> dict[str, Any]:
    return {
        "key": outcome.key,
        "user_id": outcome.user_id,
        "session": outcome.session,
        "task": outcome.task,
        "problem_id": outcome.problem_id,
    }


def _conversation(outcome: PlayedSession) -> dict[str, Any]:
    return {
        "turns": list(outcome.turns),
        "unsaid_reaction": outcome.unsaid_reaction,
        "enforcing_utterances": list(outcome.enforcing_utterances),
        "draft_answer": outcome.draft_answer,
        "gold_answer": outcome.gold_answer,
        "grade": outcome.grade,
        "task_success": outcome.task_success,
        "user_effort": outcome.user_effort,
        "length": outcome.length,
        "ended_by": outcome.ended_by,
    }
