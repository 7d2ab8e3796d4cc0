"""Data the reward code passes around: a sample's ground truth, judge inputs and verdicts, reward parts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from memrl.core.errors import ConfigError


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"ground truth field {what!r} must be a list of strings, got {type(value).__name__}")
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class GroundTruth:
    """What one reflection sample is graded against."""

    enforcements: tuple[str, ...]  # epsilon: the user's enforcing utterances in this session
    gold_notes: str = ""  # the gold reflection's agent_notes ("" when none)
    # Taxonomy ids the updated notes should hold (enforced now plus kept from before); () = derive from enforcements.
    expected: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"enforcements": list(self.enforcements), "gold_notes": self.gold_notes, "expected": list(self.expected)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any] | str | GroundTruth) -> GroundTruth:
        """From the dict or its JSON string (verl parquet and TRL columns hold the string)."""
        if isinstance(obj, GroundTruth):
            return obj
        data: object = obj
        if isinstance(obj, str):
            try:
                data = json.loads(obj)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"ground truth is not valid JSON: {exc.msg} at char {exc.pos}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"ground truth must be a JSON object, got {type(data).__name__}")
        unknown = set(map(str, data)) - {"enforcements", "gold_notes", "expected"}
        if unknown:
            raise ConfigError(f"ground truth has unknown keys: {', '.join(sorted(unknown))}")
        expected = _strings(data.get("expected"), "expected")
        if expected:
            from memrl.core.preferences import get_preference

            for pid in expected:
                get_preference(pid)  # a typo in the data fails here, in one line, not as a silent miss
        return cls(_strings(data.get("enforcements"), "enforcements"), str(data.get("gold_notes") or ""), expected)


@dataclass(frozen=True)
class JudgeItem:
    notes: str  # the notes to grade ("" when the reflection held none)
    truth: GroundTruth


@dataclass(frozen=True)
class JudgeVerdict:
    """A judge's grade on the paper's 0-3 scale; the id lists are filled by judges that can tell."""

    score: float
    reasoning: str
    covered: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    hallucinated: tuple[str, ...] = ()


@dataclass(frozen=True)
class RewardParts:
    """Every part of one sample's reward, for the trainer and for logging.

    `score` and `coverage` are None when the judge failed after its retries: the sample has no reward, and
    callers count it instead of training on a made-up number.
    """

    score: float | None
    coverage: float | None  # judge score / 3
    format: float
    judge_score: float | None
    length_penalty: float  # already subtracted from `score`; >= 0
    notes_tokens: int
    n_hallucinated: int | None  # None when the judge does not report ids (the LLM judge)
    judge_failed: bool
    reasoning: str = ""
    format_reason: str = ""
    covered: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    hallucinated: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("covered", "missing", "hallucinated"):
            out[key] = list(out[key])
        return out
