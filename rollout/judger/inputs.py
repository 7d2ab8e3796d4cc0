"""What the judger reads: the dialogue so far, the slots it still lacks, and one stored QA pair.

Two renderings of the same input: a text pair for a cross-encoder and a single prompt for a causal LM. Both hold
every turn when the whole input fits in `max_length` tokens, and otherwise the most recent turns that fit: the end
of the dialogue is where the user restates the task, and the slot list and the candidate are never cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INSTRUCTION = (
    "You check whether a note saved from an earlier conversation with this user supplies one of the details "
    "the current conversation still lacks, for the same task the user is pursuing now."
)
QUESTION = "Does the note supply one of the missing details for this task? Answer Yes or No."

Counter = Callable[[str], int]  # text -> its token count, special tokens left out


@dataclass(frozen=True)
class JudgerInput:
    """One (dialogue, missing slots, stored QA pair) triple."""

    context: Sequence[Mapping[str, str]]  # turns {"speaker": "user" | "assistant", "utterance": ...}, oldest first
    missing: Sequence[str]  # slot names the dialogue has not filled yet (the missing-slot hypothesis)
    question: str  # the stored pair's question
    answer: str  # the stored pair's answer
    intent: str = ""  # intent description of the memory unit (earlier session) the pair comes from
    slot: str = ""  # the slot the stored pair answers: matching it against `missing` is half the decision
    # The current task as retrieval's intent query states it (intent and the values said so far). A confirming
    # session often opens with "Thank you!": without it the judger cannot tell one booking from another.
    task: str = ""


def _turn(turn: Mapping[str, str]) -> str:
    return f"{turn['speaker']}: {turn['utterance']}"


def _missing(item: JudgerInput) -> str:
    return ", ".join(item.missing) if item.missing else "none"


def _note(item: JudgerInput) -> str:
    about = f" (earlier session: {item.intent})" if item.intent else ""
    slot = f" Slot: {item.slot}." if item.slot else ""
    return f"Note{about}.{slot} Question: {item.question} Answer: {item.answer}"


def _task(item: JudgerInput) -> str:
    return f"Task: {item.task}\n" if item.task else ""


def _tail(item: JudgerInput) -> str:
    return f"{_task(item)}Missing: {_missing(item)}"


def _pair(item: JudgerInput, turns: list[str]) -> tuple[str, str]:
    return "\n".join([*turns, _tail(item)]), _note(item)


def recent_turns(turns: Sequence[Mapping[str, str]], budget: int, count: Counter) -> list[str]:
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


def token_counter(tokenizer: Any, texts: Iterable[str] | None = None) -> Counter:
    """Token counts: of `texts` from one tokenizer call (each distinct text once: a TOD query's candidates share
    its dialogue), or one call per text when `texts` is None."""
    if texts is None:
        return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
    unique = list(dict.fromkeys(texts))
    ids = tokenizer(unique, add_special_tokens=False, return_attention_mask=False)["input_ids"] if unique else []
    return dict(zip(unique, map(len, ids), strict=True)).__getitem__


def all_turns(item: JudgerInput) -> list[str]:
    return [_turn(t) for t in item.context]


def cross_encoder_pair(
    item: JudgerInput, tokenizer: Any, max_length: int, count: Counter | None = None
) -> tuple[str, str]:
    """(dialogue + missing slots, note) with the newest turns that fit. The dialogue comes first so a left
    truncation only drops old turns."""
    count = count or token_counter(tokenizer)
    fixed = count(_tail(item)) + count(_note(item)) + tokenizer.num_special_tokens_to_add(pair=True) + 2
    return _pair(item, recent_turns(item.context, max_length - fixed, count))


def cross_encoder_pairs(items: Sequence[JudgerInput], tokenizer: Any, max_length: int) -> list[tuple[str, str]]:
    """`cross_encoder_pair` of each item, every token count taken in one tokenizer call."""
    count = token_counter(tokenizer, (t for item in items for t in (_tail(item), _note(item), *all_turns(item))))
    return [cross_encoder_pair(item, tokenizer, max_length, count) for item in items]


def whole_pair(item: JudgerInput) -> tuple[str, str]:
    """`cross_encoder_pair` with every turn: what the judger reads when it all fits."""
    return _pair(item, all_turns(item))


def causal_prompt(item: JudgerInput, tokenizer: Any, max_length: int, count: Counter | None = None) -> str:
    """The prompt with the newest turns that fit, through the chat template when the tokenizer has one; the
    answer token comes next."""
    count = count or token_counter(tokenizer)
    return _render(item, causal_turns(item, count(_render(item, [], tokenizer)), max_length, count), tokenizer)


def causal_turns(item: JudgerInput, fixed: int, max_length: int, count: Counter) -> list[str]:
    """The newest rendered turns that fit in a causal prompt beside the `fixed` tokens of the prompt without them."""
    return recent_turns(item.context, max_length - fixed - 2, count)


def whole_prompt(item: JudgerInput, tokenizer: Any) -> str:
    """`causal_prompt` with every turn: what the judger reads when it all fits."""
    return _render(item, all_turns(item), tokenizer)


def causal_prompts(items: Sequence[JudgerInput], tokenizer: Any, max_length: int) -> list[str]:
    """`causal_prompt` of each item, every token count taken in one tokenizer call."""
    count = token_counter(tokenizer, (t for item in items for t in (_render(item, [], tokenizer), *all_turns(item))))
    return [causal_prompt(item, tokenizer, max_length, count) for item in items]


def _render(item: JudgerInput, turns: list[str], tokenizer: Any) -> str:
    return _wrap(_body(*prompt_parts(item, turns)), tokenizer)


def prompt_parts(item: JudgerInput, turns: list[str]) -> tuple[str, str, str]:
    """A causal prompt's variable parts: the dialogue (these turns), the task and missing slots, the note."""
    dialogue = "\n".join(turns) if turns else "(empty)"
    return dialogue, f"{_task(item)}Details still missing: {_missing(item)}", _note(item)


def prompt_frame(tokenizer: Any) -> tuple[str, ...] | None:
    """The fixed texts around `prompt_parts`, one more than the parts: a prompt is the two interleaved, fixed text
    first. None where the chat template does not keep the parts as they are."""
    marks = ("\ue000", "\ue001", "\ue002")  # private-use characters: no template writes them
    rest = _wrap(_body(*marks), tokenizer)
    fixed = []
    for mark in marks:
        text, found, rest = rest.partition(mark)
        if not found:
            return None
        fixed.append(text)
    fixed.append(rest)
    return None if any(mark in text for mark in marks for text in fixed) else tuple(fixed)


def _body(dialogue: str, missing: str, note: str) -> str:
    return "\n\n".join([INSTRUCTION, "Conversation so far:\n" + dialogue, missing, note, QUESTION])


def _wrap(body: str, tokenizer: Any) -> str:
    if uses_chat_template(tokenizer):
        messages = [{"role": "user", "content": body}]
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return body + "\nAnswer:"


def uses_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
