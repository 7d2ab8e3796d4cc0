"""The MS-TOD session record: one line of `sessions.jsonl` (`memrl eval tod`), typed, with its writer and reader.

`SessionRunner.run` builds it, the driver appends `to_dict()` (the JSON keys, in the order, runs have always
written), and `read_session` reads a line back (fresh or from an earlier run), refusing a bad row in one line naming
the file, the row and the key. Every key has been written since the first run; what grew since is the recall family
(`recalls`: `pair_recall@k`, `ceiling_`, `retrieval_` / `judger_` came later, `metrics` scores old records again)
and `quality`, written only when a quality judge ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.rows import RowReader

SESSIONS_FILE = "sessions.jsonl"
SCORES = ("jga", "slot_accuracy", "correct_slots", "dte", "success")  # `metrics.session_scores` besides the recalls


@dataclass(frozen=True)
class TodSessionRecord:
    key: str  # "{persona_id}/{session_id}"
    persona_id: int
    session_id: int
    reference_dialogue_id: str
    service: str
    intent: str
    goal: dict[str, str]  # the confirmed slot values
    context_turns: int
    memory_units: int  # the individual's earlier sessions
    intent_query: str
    missing_slots: tuple[str, ...]
    reasoning: str
    ranked: tuple[dict[str, Any], ...]  # the kept top of the fused ranking, each `pipeline.Scored.to_record()`
    a_core: tuple[str, ...]  # the answers the reader got
    gold: tuple[str, ...]  # the keys of the gold QA pairs, sorted
    confirmation: str
    turns: tuple[dict[str, Any], ...]  # {"speaker", "utterance"[, "slots"]}
    outstanding: tuple[tuple[str, ...], ...]  # the slots left after each assistant turn
    jga: float
    slot_accuracy: float
    correct_slots: dict[str, bool]
    dte: int
    success: bool
    recalls: dict[str, float | None]  # `recall@k` and its family, in the order written; None: no gold memory
    failures: dict[str, int]  # per model role
    rated: bool = False  # a quality judge ran: `quality` is written
    quality: int | None = None  # its 1-10 score; None when its reply was unusable

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "key": self.key,
            "persona_id": self.persona_id,
            "session_id": self.session_id,
            "reference_dialogue_id": self.reference_dialogue_id,
            "service": self.service,
            "intent": self.intent,
            "goal": self.goal,
            "context_turns": self.context_turns,
            "memory_units": self.memory_units,
            "intent_query": self.intent_query,
            "missing_slots": list(self.missing_slots),
            "reasoning": self.reasoning,
            "ranked": list(self.ranked),
            "a_core": list(self.a_core),
            "gold": list(self.gold),
            "confirmation": self.confirmation,
            "turns": list(self.turns),
            "outstanding": [list(left) for left in self.outstanding],
            "jga": self.jga,
            "slot_accuracy": self.slot_accuracy,
            "correct_slots": self.correct_slots,
            "dte": self.dte,
            "success": self.success,
            **self.recalls,
            "failures": self.failures,
        }
        return row | {"quality": self.quality} if self.rated else row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], where: str) -> TodSessionRecord:
        """A record from its JSON object; a missing key or a value of the wrong kind raises ConfigError `WHERE: ...`
        naming the key (`where`: `PATH:LINE`, or which session of a run)."""
        read = RowReader(row, where, "TOD session record")
        read.require(REQUIRED)
        return cls(
            key=read.text("key"),
            persona_id=read.integer("persona_id"),
            session_id=read.integer("session_id"),
            reference_dialogue_id=read.text("reference_dialogue_id"),
            service=read.text("service"),
            intent=read.text("intent"),
            goal=read.texts_by("goal"),
            context_turns=read.integer("context_turns"),
            memory_units=read.integer("memory_units"),
            intent_query=read.text("intent_query"),
            missing_slots=read.texts("missing_slots"),
            reasoning=read.text("reasoning"),
            ranked=read.objects("ranked", ("key", "slot", "answer")),
            a_core=read.texts("a_core"),
            gold=read.texts("gold"),
            confirmation=read.text("confirmation"),
            turns=read.turns("turns", ("speaker", "utterance")),
            outstanding=read.text_lists("outstanding"),
            jga=read.number("jga"),
            slot_accuracy=read.number("slot_accuracy"),
            correct_slots=read.flags_by("correct_slots"),
            dte=read.integer("dte"),
            success=read.flag("success"),
            recalls={key: read.optional_number(key) for key in row if "recall@" in key},
            failures=read.counts("failures"),
            rated="quality" in row,
            quality=read.optional_integer("quality"),
        )


REQUIRED = (
    *("key", "persona_id", "session_id", "reference_dialogue_id", "service", "intent", "goal", "context_turns"),
    *("memory_units", "intent_query", "missing_slots", "reasoning", "ranked", "a_core", "gold", "confirmation"),
    *("turns", "outstanding", *SCORES, "failures"),
)


def read_session(row: Mapping[str, Any], out: Path) -> TodSessionRecord:
    """A row of the run in `out` (as the driver hands it on), named by its key in any complaint."""
    return TodSessionRecord.from_dict(row, f"{out / SESSIONS_FILE}: session {row.get('key')!r}")
