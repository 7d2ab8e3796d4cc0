"""Tokenizer-free text measures shared by the judges and the length penalty."""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w+")
_MARKER = re.compile(r"^\s*(?:[-*•+>]+|\d+[.)]|\(?[a-z]\)|#+)\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[\"'(\[]?[A-Z0-9])")


def count_tokens(text: str) -> int:
    """Words plus punctuation marks: a stand-in for model tokens that does not depend on the policy's tokenizer."""
    return len(_TOKEN.findall(text))


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def split_statements(text: str) -> list[str]:
    """The notes as separate claims: one per line or bullet, lines cut at sentence ends.

    Headers ("Preferences:") and fragments under two words are dropped: they state nothing to check.
    """
    out: list[str] = []
    for line in text.splitlines():
        line = _MARKER.sub("", line).strip().strip("*_").strip()
        if not line:
            continue
        for part in _SENTENCE_END.split(line):
            part = part.strip()
            words = count_words(part)
            if words < 2 or (part.endswith(":") and words <= 5):
                continue
            out.append(part)
    return out
