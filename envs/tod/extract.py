"""What a session's words state, slot by slot: the deterministic memory writer for unannotated (released) sessions.

It reads the user's turns (and the assistant turn just before each, for the question being answered), never the
confirmation state, so a value the user later changed is stored as said and a value never said is missing. A slot's
value is found by what kind of slot it is:
- a count (categorical, all values digits): a number (digits or a number word) in a user turn when that turn or the
  assistant's question before it names the slot's noun ("4 seats", "How many riders?" "2 of us");
- another categorical slot (True/False excepted): one of the schema's values, as whole words;
- a date or a time (by the slot's name): a date ("March 7th", "the 12th of March", "Saturday", "tomorrow") or a
  clock time ("7:30 pm", "6 pm", "noon");
- free text: a value the lexicon lists for the slot (the values the SGD dialogues beside the schema mention), else a
  capitalised name after a preposition that fits the slot ("in Emeryville" for a city or location, "to Union
  Square" for a destination, "at Sakura Garden" for the intent's first other free-text slot).
The latest mention wins, so a value changed within the session replaces the earlier one. True/False slots are left
out: the text seldom states them in words a pattern can read. `memrl data judger` reports how many confirmed values
the resulting memory holds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memrl.envs.tod.formats import Session, Turn
from memrl.envs.tod.schema import IntentSpec, Schemas, SlotSpec, is_boolean
from memrl.envs.tod.sgd import dialogue_files, load_dialogues

_VERSION = re.compile(r"_\d+$")

_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_ORDINAL = r"\d{1,2}(?:st|nd|rd|th)"
_DATE = re.compile(
    rf"\b(?:(?:{_MONTHS})\s+{_ORDINAL}|(?:{_MONTHS})\s+\d{{1,2}}\b|(?:the\s+)?{_ORDINAL}\s+of\s+(?:{_MONTHS})"
    rf"|(?:next\s+)?(?:{_WEEKDAYS})|day after tomorrow|tomorrow|today|the\s+{_ORDINAL})\b",
    re.IGNORECASE,
)
_TIME = re.compile(r"\b(?:\d{1,2}(?::\d{2})?\s*(?:am|pm|a\.m\.|p\.m\.)|\d{1,2}:\d{2}|noon|midnight)", re.IGNORECASE)
_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"), 1
    )
}
_COUNT = re.compile(
    r"\b(?:(\d{1,2})(?![\d:]|\s*(?:am|pm|a\.m|p\.m|st|nd|rd|th)\b)|(" + "|".join(_NUMBER_WORDS) + r"))\b",
    re.IGNORECASE,
)
_PEOPLE = ("people", "person", "us", "guest", "passenger", "party", "group")
_NAME = r"[A-Z][\w'&.-]*"
_CAPITALISED = re.compile(rf"{_NAME}(?:\s+(?:of|the|and|&|de|la|del)?\s*{_NAME})*")
_NOT_NAMES = {m.capitalize() for m in (_MONTHS + "|" + _WEEKDAYS).split("|")} | {"I", "I'd", "I'll", "I'm"}
_PLACE_WORDS = ("city", "location", "area", "origin", "from")
_PLACE_PREPOSITIONS = ("in", "from")
_DESTINATION_PREPOSITIONS = ("to",)
_OTHER_PREPOSITIONS = ("at", "to", "for", "called", "named")

Lexicon = Mapping[tuple[str, str], Sequence[str]]
"""(service family, slot) -> values known for that slot, longest first."""


def family(service: str) -> str:
    """`Restaurants_2` -> `Restaurants`: the release names services without SGD's version suffix."""
    return _VERSION.sub("", service)


def lexicon_from_sgd(path: str | Path) -> dict[tuple[str, str], tuple[str, ...]]:
    """Every slot value the SGD dialogues under `path` mention (user and system acts); empty without dialogues."""
    values: dict[tuple[str, str], dict[str, str]] = {}
    base = Path(path)
    for file in dialogue_files(base.parent if base.is_file() else base):
        for dialogue in load_dialogues(file):
            for turn in dialogue.turns:
                for frame in turn.frames:
                    for action in frame.actions:
                        for value in action.values:
                            if action.slot and value.strip() and value != "dontcare":
                                key = (family(frame.service), action.slot)
                                values.setdefault(key, {}).setdefault(value.casefold(), value)
    return {k: tuple(sorted(v.values(), key=len, reverse=True)) for k, v in values.items()}


@dataclass(frozen=True)
class Mention:
    turn: int
    start: int
    value: str


def _last(mentions_: Iterable[Mention]) -> Mention | None:
    return max(mentions_, key=lambda m: (m.turn, m.start), default=None)


def _slot_words(slot: SlotSpec) -> tuple[str, ...]:
    words = [w.rstrip("s") for w in slot.name.lower().split("_") if w not in ("number", "of", "num", "count")]
    return tuple(w for w in words if w)


def _is_count(slot: SlotSpec) -> bool:
    return slot.is_categorical and bool(slot.possible_values) and all(v.isdigit() for v in slot.possible_values)


def _names_noun(text: str, slot: SlotSpec) -> bool:
    words = set(re.findall(r"[a-z]+", text.lower()))
    stems = {w.rstrip("s") for w in words}
    people = any(w in ("seat", "rider", "people", "party", "group", "passenger", "guest") for w in _slot_words(slot))
    return bool(stems & set(_slot_words(slot))) or (people and bool(words & set(_PEOPLE)))


@dataclass
class TextExtractor:
    """Slot -> the value the session's user turns last state; see the module docstring for how each kind is read."""

    schemas: Schemas
    lexicon: Lexicon = field(default_factory=dict)

    def facts(self, session: Session) -> dict[str, str]:
        service = self.schemas.service(session.service)
        intent = service.intents.get(session.intent)
        turns = session.turns
        found: dict[str, str] = {}
        for name in service.slot_order(session.intent):
            spec = service.slots[name]
            mention = _last(self._mentions(session.service, spec, intent, turns))
            if mention is not None:
                found[name] = mention.value
        return found

    def _mentions(
        self, service: str, slot: SlotSpec, intent: IntentSpec | None, turns: Sequence[Turn]
    ) -> Iterable[Mention]:
        for i, turn in enumerate(turns):
            if turn.speaker != "user":
                continue
            asked = turns[i - 1].utterance if i and turns[i - 1].speaker == "assistant" else ""
            yield from self._in_turn(service, slot, intent, i, turn.utterance, asked)

    def _in_turn(
        self, service: str, slot: SlotSpec, intent: IntentSpec | None, i: int, text: str, asked: str
    ) -> Iterable[Mention]:
        name = slot.name.lower()
        if is_boolean(slot):
            return
        if _is_count(slot):
            if _names_noun(text, slot) or _names_noun(asked, slot):
                for m in _COUNT.finditer(text):
                    yield Mention(i, m.start(), m.group(1) or _NUMBER_WORDS[m.group(2).lower()])
            return
        if slot.is_categorical and slot.possible_values:
            for value in slot.possible_values:
                if value != "dontcare" and (at := _whole_word(text, value)) is not None:
                    yield Mention(i, at, value)
            return
        if "date" in name or name == "day":
            for m in _DATE.finditer(text):
                yield Mention(i, m.start(), re.sub(r"^the\s+(?=\d)", "", m.group(0), flags=re.IGNORECASE))
            return
        if "time" in name:
            yield from (Mention(i, m.start(), m.group(0)) for m in _TIME.finditer(text))
            return
        known = self.lexicon.get((family(service), slot.name), ())
        hits = []
        if known:
            pattern, canonical = _lexicon_pattern(tuple(known))
            found = ((m.start(), m.group(0)) for m in pattern.finditer(text))
            hits = [Mention(i, at, canonical.get(said.casefold(), said)) for at, said in found]
        if hits:
            yield from hits
            return
        for m in self._after(self._prepositions(slot, intent), text):
            yield Mention(i, m.start(1), m.group(1).rstrip(".-"))

    def _prepositions(self, slot: SlotSpec, intent: IntentSpec | None) -> tuple[str, ...]:
        name = slot.name.lower()
        if any(w in name for w in _PLACE_WORDS):
            return _PLACE_PREPOSITIONS
        if "destination" in name or name.startswith("to_"):
            return _DESTINATION_PREPOSITIONS
        free = [s for s in (intent.slots if intent else ()) if self._free_text_other(s)]
        return _OTHER_PREPOSITIONS if free[:1] == [slot.name] else ()

    def _free_text_other(self, name: str) -> bool:
        low = name.lower()
        return not any(w in low for w in (*_PLACE_WORDS, "destination", "date", "time")) and not low.startswith("to_")

    @staticmethod
    def _after(prepositions: Sequence[str], text: str) -> Iterable[re.Match[str]]:
        if not prepositions:
            return
        pattern = re.compile(rf"\b(?:{'|'.join(prepositions)})\s+(?:the\s+)?({_CAPITALISED.pattern})")
        for m in pattern.finditer(text):
            if m.group(1).split()[0] not in _NOT_NAMES:
                yield m


@functools.lru_cache(maxsize=256)
def _lexicon_pattern(values: tuple[str, ...]) -> tuple[re.Pattern[str], dict[str, str]]:
    """One alternation over a slot's known values (longest first, whole words, any case), compiled once: a full SGD
    lexicon has thousands of values per slot, searched in every user turn."""
    ordered = sorted({v.strip() for v in values if v.strip()}, key=len, reverse=True)
    pattern = re.compile(rf"(?<!\w)(?:{'|'.join(map(re.escape, ordered))})(?!\w)", re.IGNORECASE)
    return pattern, {v.casefold(): v for v in reversed(ordered)}


def _whole_word(text: str, value: str) -> int | None:
    """Where `value` occurs in `text` as whole words, ignoring case; None when it does not."""
    value = value.strip()
    m = re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text, re.IGNORECASE) if value else None
    return None if m is None else m.start()
