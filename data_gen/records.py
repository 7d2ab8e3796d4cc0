"""One reflection training sample: the reflector's input (notes before + session), what it should learn, its gold."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memrl.rewards.types import GroundTruth
from memrl.rollout.base import Message

DATA_SOURCE = "memrl/collab_reflection"
ABILITY = "reflection"


@dataclass(frozen=True)
class ReflectionRecord:
    key: str  # "{user_id}/s{session}"
    user_id: str
    problem_id: str
    session: int
    task: str
    preferences: tuple[str, ...]  # the user's true preference ids
    enforced: tuple[str, ...]  # ids the user enforced in this session (rule simulator labels)
    expected: tuple[str, ...]  # ids the updated notes should hold: enforced now + carried from earlier sessions
    enforcements: tuple[str, ...]  # epsilon: the user's enforcing utterances in this session
    notes_before: str
    conversation: tuple[Message, ...]
    prompt: tuple[Message, ...]  # reflection_messages(notes_before, conversation)
    gold_reasoning: str
    gold_notes: str
    gold: str  # the assistant target: JSON text of REFLECTION_KEYS

    def ground_truth(self) -> dict[str, Any]:
        """What the reward reads: GroundTruth.to_dict()."""
        return GroundTruth(self.enforcements, self.gold_notes, self.expected).to_dict()

    def prompt_messages(self) -> list[dict[str, str]]:
        return [{"role": m["role"], "content": m["content"]} for m in self.prompt]

    def sft_messages(self) -> list[dict[str, str]]:
        return [*self.prompt_messages(), {"role": "assistant", "content": self.gold}]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("preferences", "enforced", "expected", "enforcements", "conversation", "prompt"):
            data[name] = [dict(m) if isinstance(m, dict) else m for m in data[name]]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReflectionRecord:
        """Read back a line of train.jsonl / eval.jsonl."""

        def messages(name: str) -> tuple[Message, ...]:
            return tuple(Message(role=m["role"], content=m["content"]) for m in data[name])

        return cls(
            key=str(data["key"]),
            user_id=str(data["user_id"]),
            problem_id=str(data["problem_id"]),
            session=int(data["session"]),
            task=str(data["task"]),
            preferences=tuple(data["preferences"]),
            enforced=tuple(data["enforced"]),
            expected=tuple(data["expected"]),
            enforcements=tuple(data["enforcements"]),
            notes_before=str(data["notes_before"]),
            conversation=messages("conversation"),
            prompt=messages("prompt"),
            gold_reasoning=str(data["gold_reasoning"]),
            gold_notes=str(data["gold_notes"]),
            gold=str(data["gold"]),
        )
