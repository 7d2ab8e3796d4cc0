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

from memrl.core.files import NotJson, loads  # the one strict decoder: no NaN, no Infinity

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^][{}]+")
# Repair is slow on degenerate replies (seconds for 10k nested braces, minutes for megabytes of text): a longer
# or deeper span than any real reply is refused instead. Valid JSON of any size still parses (json.loads is fast).
MAX_REPAIR_CHARS = 100_000
MAX_DEPTH = 64


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
    if nesting_depth(span) > MAX_DEPTH:  # also keeps field_text's recursion shallow
        return JSONParseFailure(f"JSON nested deeper than {MAX_DEPTH} levels", text)
    repaired = False
    try:
        data = loads(span)
    except NotJson:
        return JSONParseFailure("JSON holds a number that is not finite (NaN or Infinity)", text)
    except json.JSONDecodeError:
        repaired = True
        if len(span) > MAX_REPAIR_CHARS:
            return JSONParseFailure(f"output too long to repair ({len(span)} characters)", text)
        try:
            data = repair_json(span, return_objects=True)
        except (ValueError, RecursionError):  # json_repair gives up on some inputs with an exception
            return JSONParseFailure("output could not be repaired into a JSON object", text)
        try:
            json.dumps(data, allow_nan=False)  # repair keeps NaN and Infinity as floats
        except ValueError:
            return JSONParseFailure("JSON holds a number that is not finite (NaN or Infinity)", text)
    if isinstance(data, list):  # repair may wrap an object followed by trailing text in a list
        data = next((d for d in data if isinstance(d, dict)), None)
    if not isinstance(data, dict) or not data:
        return JSONParseFailure("output could not be repaired into a JSON object", text)
    missing = [k for k in required if k not in data]
    if missing:
        return JSONParseFailure(f"JSON object lacks required keys: {', '.join(missing)}", text)
    return ParsedJSON(data, repaired)


def _brackets(text: str) -> str:
    """The brackets of `text` outside its string literals, in order (an unclosed string runs to the end)."""
    return _NOT_BRACKET.sub("", _STRING.sub("", text))


def nesting_depth(text: str) -> int:
    """How deep `{`/`[` nest in `text`, outside string literals (a cheap bound before repairing it)."""
    depth = deepest = 0
    for char in _brackets(text):
        if char in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "}]":
            depth = max(0, depth - 1)
    return deepest


def ends_open(text: str) -> bool:
    """Whether the reply stops inside its JSON object: a bracket, or a string (and so its object), still open at the
    end of the span `parse_json_object` reads. What a reply cut by the token cap looks like."""
    span = _candidate(text)
    if not span.startswith("{"):
        return False
    depth = 0
    for char in _brackets(span):
        depth += 1 if char in "{[" else -1
        if depth == 0:
            return False
    return True


def field_text(value: object) -> str:
    """A JSON field as text. Small models return notes as lists or objects: keep their content, one item a line."""
    if isinstance(value, list):
        return "\n".join(f"- {field_text(v)}" for v in value)
    if isinstance(value, dict):
        return "\n".join(f"{k}: {field_text(v)}" for k, v in value.items())
    return "" if value is None else str(value)
