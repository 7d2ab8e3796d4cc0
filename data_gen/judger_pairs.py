"""The judger pair: one (query, stored QA pair) row of `J/<split>/pairs.jsonl`, typed, with its writer and reader.

`memrl data judger` (data_gen/judger.py) builds the pairs and judger training its dev split; both write them with
`write_pairs`. Judger training and evaluation read them with `read_pairs`, which refuses a bad row in one line naming
`PATH:LINE` and the field. A plain dataclass, no pydantic model: the trainers read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import json_type, numbered_jsonl, write_jsonl
from memrl.envs.tod.retrieval import Candidate
from memrl.rollout.judger.inputs import JudgerInput


@dataclass(frozen=True)
class JudgerPair:
    key: str  # "{query_id}/{memory_session_id}/{slot}"
    query_id: str  # "{persona_id}/{session_id}": the confirming session the query is
    persona_id: int  # the individual: splits never share one
    session_id: int
    service: str
    intent: str
    context: tuple[dict[str, str], ...]  # the query's turns {"speaker", "utterance"}, oldest first
    intent_query: str  # retrieval's query: the intent and the values said so far
    missing_slots: tuple[str, ...]
    missing_descriptions: tuple[str, ...]
    memory_session_id: int  # the earlier session (memory unit) the stored pair comes from
    memory_intent: str
    memory_service: str
    slot: str
    question: str
    answer: str
    label: int  # 1: the pair answers a slot the query misses
    negative: str | None  # why a negative is one (envs/tod/labels.py), None for a positive

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("context", "missing_slots", "missing_descriptions"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], where: str) -> JudgerPair:
        """A pair from its JSON object; a missing field or a value of the wrong kind raises ConfigError `WHERE: ...`."""
        missing = next((f.name for f in fields(cls) if f.name not in row), None)
        if missing is not None:
            raise ConfigError(f"{where}: judger pair lacks field {missing!r}")
        for name, ok, kind in _CHECKS:
            if not ok(row[name]):
                raise ConfigError(f"{where}: judger pair's {name!r} must be {kind}, got {json_type(row[name])}")
        if row["label"] not in (0, 1):
            raise ConfigError(f"{where}: label must be 0 or 1, got {row['label']!r}")
        values = dict(row) | {
            "context": tuple(dict(t) for t in row["context"]),
            "missing_slots": tuple(row["missing_slots"]),
            "missing_descriptions": tuple(row["missing_descriptions"]),
        }
        return cls(**{f.name: values[f.name] for f in fields(cls)})

    def judger_input(self) -> JudgerInput:
        """What the judger reads of the pair."""
        return JudgerInput(
            context=self.context,
            missing=self.missing_slots,
            question=self.question,
            answer=self.answer,
            intent=self.memory_intent,
            slot=self.slot,
            task=self.intent_query,
        )

    def candidate(self) -> Candidate:
        """What retrieval indexes of the pair."""
        return Candidate(self.key, self.memory_session_id, self.memory_intent, self.slot, self.question, self.answer)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_turns(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("speaker"), str) and isinstance(t.get("utterance"), str) for t in value
    )


_CHECKS = (
    *((name, _is_text, "text") for name in ("key", "query_id", "service", "intent", "intent_query")),
    *((name, _is_text, "text") for name in ("memory_intent", "memory_service", "slot", "question", "answer")),
    *((name, _is_int, "an integer") for name in ("persona_id", "session_id", "memory_session_id")),
    ("context", _is_turns, "a list of turns, each with a speaker and an utterance text"),
    ("missing_slots", _is_texts, "a list of texts"),
    ("missing_descriptions", _is_texts, "a list of texts"),
    ("negative", lambda v: v is None or isinstance(v, str), "text or null"),
)


def write_pairs(pairs: Iterable[JudgerPair], path: Path) -> Path:
    """One pair a line, written atomically."""
    return write_jsonl((p.to_dict() for p in pairs), path)


def read_pairs(path: str | Path) -> list[JudgerPair]:
    """The pairs of one `pairs.jsonl`; a malformed row, or none at all, is a ConfigError naming the file."""
    pairs = [JudgerPair.from_dict(row, f"{path}:{n}") for n, row in numbered_jsonl(path, ConfigError, torn=False)]
    if not pairs:
        raise ConfigError(f"{path}: no judger pairs")
    return pairs
