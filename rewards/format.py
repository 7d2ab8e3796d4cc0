"""Format reward: does the reply keep the reflection prompt's JSON contract?

Credit levels (the most serious defect decides):

| credit | level      | the reply                                                                           |
|--------|------------|-------------------------------------------------------------------------------------|
| 1.0    | exact      | is one JSON object and nothing else; both keys hold non-empty strings               |
| 0.75   | wrapped    | holds such an object, but inside a code fence or with other text around it          |
| 0.5    | repaired   | the object parses only after repair, a field is a list/object instead of a string, or |
|        |            | the object repeats a key or holds keys beyond the two (JSON readers keep one of them) |
| 0.25   | notes only | usable `agent_notes`, but the reasoning key is missing or empty                     |
| 0.0    | cut        | the object never closes: the reply stopped inside it (the token cap cut it)          |
| 0.0    | unusable   | no JSON object, or `agent_notes` missing or empty                                   |

A cut reply earns no format credit, however much of it repair recovers: a reflection that runs to the token cap is
not a well-structured one, and crediting its salvaged half taught GRPO to run every rollout to the cap
(docs/reflection.md, run M). Its notes are still read (repaired) for the coverage judge, as the agent would.

The notes are read the way the collab agent reads them (lists and objects are flattened into lines), so the
coverage judge grades exactly what would reach the agent's memory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from memrl.core.files import NotJson, loads, raw_decode
from memrl.rollout.json_output import (
    MAX_DEPTH,
    MAX_REPAIR_CHARS,
    JSONParseFailure,
    ends_open,
    field_text,
    nesting_depth,
    parse_json_object,
)

REFLECTION_KEYS = ("user_preferences_reasoning", "agent_notes")  # what a reflection is a JSON object of
# How a collab agent writes its reply (envs/collab/prompts.py): the agent's JSON contract, or the message alone.
ReplyFormat = Literal["json", "text"]
REASONING_KEY, NOTES_KEY = REFLECTION_KEYS

EXACT, WRAPPED, REPAIRED, NOTES_ONLY, UNUSABLE = 1.0, 0.75, 0.5, 0.25, 0.0
CUT = UNUSABLE

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class FormatResult:
    score: float  # one of the credit levels above
    notes: str | None  # the notes the agent would store; None when the reply holds none
    reason: str


def _strict_object(text: str) -> tuple[dict[str, Any] | None, bool]:
    """(object, exact): the first JSON object that parses without repair, and whether it is the whole reply."""
    stripped = text.strip()
    if nesting_depth(stripped) > MAX_DEPTH:  # parse_json_object reports it
        return None, False
    try:
        whole = loads(stripped, as_written=True)
    except json.JSONDecodeError:
        pass
    except (RecursionError, NotJson):  # nested past Python's limit: parse_json_object reports it
        return None, False
    else:
        return (whole, True) if isinstance(whole, dict) else (None, False)
    fenced = _FENCE.search(text)
    span = fenced.group(1) if fenced else text
    # Each '{' is a fresh attempt that may scan to the end: a degenerate, huge reply is left to the repair path.
    start = span.find("{") if len(span) <= MAX_REPAIR_CHARS else -1
    while start >= 0:
        try:
            found, _ = raw_decode(span, start, as_written=True)
        except json.JSONDecodeError:
            start = span.find("{", start + 1)
            continue
        except (RecursionError, NotJson):
            return None, False
        return (found, False) if isinstance(found, dict) else (None, False)
    return None, False


def format_reward(text: str) -> FormatResult:
    """Grade `text` (the raw reflection reply) on the credit levels in this module's docstring."""
    data, exact = _strict_object(text)
    repaired = False
    if data is None:
        parsed = parse_json_object(text)
        if isinstance(parsed, JSONParseFailure):
            return FormatResult(UNUSABLE, None, f"unusable: {parsed.reason}")
        data, repaired = parsed.data, True
    notes_value, reasoning_value = data.get(NOTES_KEY), data.get(REASONING_KEY)
    notes = field_text(notes_value).strip()
    if not notes:
        return FormatResult(UNUSABLE, None, f"unusable: {NOTES_KEY!r} is missing or empty")
    if repaired and ends_open(text):
        return FormatResult(CUT, notes, "cut: the reply ends inside its JSON object")
    if not field_text(reasoning_value).strip():
        return FormatResult(NOTES_ONLY, notes, f"notes only: {REASONING_KEY!r} is missing or empty")
    not_strings = [k for k, v in ((REASONING_KEY, reasoning_value), (NOTES_KEY, notes_value)) if not isinstance(v, str)]
    if repaired or not_strings:
        why = "the JSON needed repair" if repaired else f"{', '.join(not_strings)} not a string"
        return FormatResult(REPAIRED, notes, f"repaired: {why}")
    if off_contract := _off_contract(data):
        return FormatResult(REPAIRED, notes, f"repaired: {off_contract}")
    if not exact:
        return FormatResult(WRAPPED, notes, "wrapped: the object is fenced or has text around it")
    return FormatResult(EXACT, notes, "exact: one JSON object with both keys")


def _off_contract(data: dict[str, Any]) -> str:
    """What the object holds beyond the contract's two keys once each ("" when nothing): a repeated key (a reader
    keeps only one of its values, and a policy can hide a second reflection there) or another key."""
    written = getattr(data, "written", tuple(data))
    repeated = sorted({key for key in written if written.count(key) > 1})
    extra = [key for key in dict.fromkeys(written) if key not in REFLECTION_KEYS]
    if repeated:
        return f"the object repeats {', '.join(map(repr, repeated))}"
    if extra:
        return f"the object holds keys beyond the contract: {', '.join(map(repr, extra[:3]))}"
    return ""


def extract_notes(text: str) -> str | None:
    """The notes a reflection reply carries (what the agent would store), or None when it carries none."""
    return format_reward(text).notes
