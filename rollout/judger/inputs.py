"""What the judger reads: the dialogue so far, the slots it still lacks, and one stored QA pair.

Two renderings of the same input: a text pair for a cross-encoder and a single prompt for a causal LM. Both keep
the most recent turns when the dialogue does not fit in `max_length` tokens: the end of the dialogue is where the
user restates the task, and the slot list and the candidate are never cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INSTRUCTION = (
    "You check whether a note saved from an earlier conversation with this user supplies one of the details "
    "the current conversation still lacks, for the same task the user is pursuing now."
)
QUESTION = "Does the note supply one of the missing details for this task? Answer Yes or No."


@dataclass(frozen=True)
class JudgerInput:
    """One (dialogue, missing slots, stored QA pair) triple."""

    context: Sequence[Mapping[str, str]]  # turns {"speaker": "user" | "assistant", "utterance": ...}, oldest first
    missing: Sequence[str]  # slot names the dialogue has not filled yet (the missing-slot hypothesis)
    question: str  # the stored pair's question
    answer: str  # the stored pair's answer
    intent: str = ""  # intent description of the memory unit (earlier session) the pair comes from
    slot: str = ""  # the slot the stored pair answers: matching it against `missing` is half the decision

    @classmethod
    def from_pair(cls, row: Mapping[str, Any]) -> JudgerInput:
        """A row of judger data (`pairs.jsonl`)."""
        return cls(
            context=[{"speaker": str(t["speaker"]), "utterance": str(t["utterance"])} for t in row["context"]],
            missing=[str(s) for s in row["missing_slots"]],
            question=str(row["question"]),
            answer=str(row["answer"]),
            intent=str(row.get("memory_intent") or ""),
            slot=str(row.get("slot") or ""),
        )


def _turn(turn: Mapping[str, str]) -> str:
    return f"{turn['speaker']}: {turn['utterance']}"


def _missing(item: JudgerInput) -> str:
    return ", ".join(item.missing) if item.missing else "none"


def _note(item: JudgerInput) -> str:
    about = f" (earlier session: {item.intent})" if item.intent else ""
    slot = f" Slot: {item.slot}." if item.slot else ""
    return f"Note{about}.{slot} Question: {item.question} Answer: {item.answer}"


def recent_turns(turns: Sequence[Mapping[str, str]], budget: int, count: Callable[[str], int]) -> list[str]:
    """The newest rendered turns whose token counts (+1 for the line break each) fit in `budget`, oldest first.

    The newest turn is kept even when it alone is too long; the tokenizer then cuts its start (left truncation).
    """
    kept: list[str] = []
    used = 0
    for turn in reversed(turns):
        text = _turn(turn)
        cost = count(text) + 1
        if kept and used + cost > budget:
            break
        kept.append(text)
        used += cost
    return kept[::-1]


def token_counter(tokenizer: Any) -> Callable[[str], int]:
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def cross_encoder_pair(item: JudgerInput, tokenizer: Any, max_length: int) -> tuple[str, str]:
    """(dialogue + missing slots, note). The dialogue comes first so a left truncation only drops old turns."""
    count = token_counter(tokenizer)
    tail = f"Missing: {_missing(item)}"
    note = _note(item)
    fixed = count(tail) + count(note) + tokenizer.num_special_tokens_to_add(pair=True) + 2
    turns = recent_turns(item.context, max_length - fixed, count)
    return "\n".join([*turns, tail]), note


def causal_prompt(item: JudgerInput, tokenizer: Any, max_length: int) -> str:
    """The whole prompt, through the chat template when the tokenizer has one; the answer token comes next."""
    count = token_counter(tokenizer)
    fixed = count(_render(item, [], tokenizer)) + 2
    turns = recent_turns(item.context, max_length - fixed, count)
    return _render(item, turns, tokenizer)


def _render(item: JudgerInput, turns: list[str], tokenizer: Any) -> str:
    body = "\n\n".join(
        [
            INSTRUCTION,
            "Conversation so far:\n" + ("\n".join(turns) if turns else "(empty)"),
            f"Details still missing: {_missing(item)}",
            _note(item),
            QUESTION,
        ]
    )
    if uses_chat_template(tokenizer):
        messages = [{"role": "user", "content": body}]
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return body + "\nAnswer:"


def uses_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
