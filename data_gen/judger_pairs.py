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
from memrl.core.files import numbered_jsonl, write_jsonl
from memrl.core.rows import RowReader
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
        read = RowReader(row, where, "judger pair")
        read.require(f.name for f in fields(cls))
        return cls(
            key=read.text("key"),
            query_id=read.text("query_id"),
            persona_id=read.integer("persona_id"),
            session_id=read.integer("session_id"),
            service=read.text("service"),
            intent=read.text("intent"),
            context=read.turns("context", ("speaker", "utterance")),
            intent_query=read.text("intent_query"),
            missing_slots=read.texts("missing_slots"),
            missing_descriptions=read.texts("missing_descriptions"),
            memory_session_id=read.integer("memory_session_id"),
            memory_intent=read.text("memory_intent"),
            memory_service=read.text("memory_service"),
            slot=read.text("slot"),
            question=read.text("question"),
            answer=read.text("answer"),
            label=read.one_of("label", (0, 1)),
            negative=read.optional_text("negative"),
        )

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


def write_pairs(pairs: Iterable[JudgerPair], path: Path) -> Path:
    """One pair a line, written atomically."""
    return write_jsonl((p.to_dict() for p in pairs), path)


def read_pairs(path: str | Path) -> list[JudgerPair]:
    """The pairs of one `pairs.jsonl`; a malformed row, or none at all, is a ConfigError naming the file."""
    pairs = [JudgerPair.from_dict(row, f"{path}:{n}") for n, row in numbered_jsonl(path, ConfigError, torn=False)]
    if not pairs:
        raise ConfigError(f"{path}: no judger pairs")
    return pairs
