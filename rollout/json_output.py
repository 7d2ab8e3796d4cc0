"""Pull the JSON object out of a model's reply, repairing what a small model gets wrong.

Callers get a `ParsedJSON` or a `JSONParseFailure`, never an exception, so every parse site can count failures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from json_repair import repair_json

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class ParsedJSON:
    data: dict[str, Any]
    repaired: bool  # True when the raw text was not valid JSON as it stood
    ok: bool = field(default=True, init=False)


@dataclass(frozen=True)
class JSONParseFailure:
    reason: str
    raw: str
    ok: bool = field(default=False, init=False)


JSONResult = ParsedJSON | JSONParseFailure


def _candidate(text: str) -> str:
    """The most likely JSON span: a fenced block if there is one, else from the first '{' on."""
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    start = text.find("{")
    return text[start:] if start >= 0 else text


def parse_json_object(text: str, required: Iterable[str] = ()) -> JSONResult:
    """Extract one JSON object from `text`; fail (typed) when none is there or a required key is missing."""
    span = _candidate(text).strip()
    if not span.startswith("{"):
        return JSONParseFailure("no JSON object in the output", text)
    repaired = False
    try:
        data = json.loads(span)
    except json.JSONDecodeError:
        repaired = True
        data = repair_json(span, return_objects=True)
    if isinstance(data, list):  # repair may wrap an object followed by trailing text in a list
        data = next((d for d in data if isinstance(d, dict)), None)
    if not isinstance(data, dict) or not data:
        return JSONParseFailure("output could not be repaired into a JSON object", text)
    missing = [k for k in required if k not in data]
    if missing:
        return JSONParseFailure(f"JSON object lacks required keys: {', '.join(missing)}", text)
    return ParsedJSON(data, repaired)


def field_text(value: object) -> str:
    """A JSON field as text. Small models return notes as lists or objects: keep their content, one item a line."""
    if isinstance(value, list):
        return "\n".join(f"- {field_text(v)}" for v in value)
    if isinstance(value, dict):
        return "\n".join(f"{k}: {field_text(v)}" for k, v in value.items())
    return "" if value is None else str(value)
