"""What a session's words state, slot by slot: the deterministic memory writer for unannotated (released) sessions.

It reads the user's turns (and the assistant turn just before each, for the question being answered), never the
confirmation state, so a value the user later changed is stored as said and a value never said is missing. A slot's
value is found by what kind of slot it is:
- a count (categorical, all values digits): a number (digits or a number word) in a user turn when that turn or the
  assistant's question before it names the slot's noun ("4 seats", "How many riders?" "2 of us");
- another categorical slot (True/False excepted): one of the schema's values, as whole words;
- a date or a time (by the slot's name): a date ("March 7th", "the 12th of March", "Saturday", "tomorrow") or a
  clock time ("7:30 pm", "6 pm", "noon"). Where the intent has slots that open and close a span (pickup_date and
  dropoff_date, check_in_date and check_out_date, outbound and inbound times: `slot_phase`, from the slot names),
  a mention goes to the side its wording names ("from"/"pick up"/"check in"/"leave" vs "to"/"drop off"/"return"/
  "check out", a leg noun such as "return flight" first, then the assistant's question), a turn's only unnamed
  one to the opening side, and several unnamed ones nowhere;
- free text: a value the lexicon lists for the slot (the values the SGD dialogues beside the schema mention), else a
  capitalised name after a preposition that fits the slot ("in Emeryville" for a city or location, "to Union
  Square" for a destination, "at Sakura Garden" for the intent's first other free-text slot).
The latest mention wins, so a value changed within the session replaces the earlier one. True/False slots are left
out: the text seldom states them in words a pattern can read. `memrl data judger` reports how many confirmed values
the resulting memory holds. `folder_schemas` gives the schema a released folder is read with: only the slots its
confirmations use.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from memrl.envs.tod.formats import Individual, Session, Turn
from memrl.envs.tod.schema import IntentSpec, Schemas, SlotSpec, is_boolean
from memrl.envs.tod.sgd import dialogue_files, load_dialogues
from memrl.envs.tod.values import NUMBER_WORDS

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
_NUMBER_WORDS = {w: d for w, d in NUMBER_WORDS.items() if w != "zero"}  # nobody books for zero
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
            if _clock_kind(spec) is not None:
                continue
            mention = _last(self._mentions(session.service, spec, intent, turns))
            if mention is not None:
                found[name] = mention.value
        for kind in _CLOCK_PATTERNS:
            slots = [n for n in service.slot_order(session.intent) if _clock_kind(service.slots[n]) == kind]
            found.update(_timed(kind, [n for n in slots if intent and n in intent.slots] or slots, turns))
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


# --- dates and times: which slot a mention belongs to -----------------------------------------------------------

Phase = Literal["start", "end"]
_CLOCK_PATTERNS = {"date": _DATE, "time": _TIME}
_END_NAMES = {"end", "dropoff", "out", "return", "inbound"}  # slot-name words: check_out_date, return_date, ...
_END_CUE = re.compile(
    r"\b(?:drop(?:ping|ped|s)?(?:[- ]?off|\s+(?:it|them|the\s+\w+)\s+off)|return(?:ing|ed|s)?|until|till|through"
    r"|check(?:ing|s)?[- ]?out|back|end(?:ing|s)?)\b",
    re.IGNORECASE,
)
_START_CUE = re.compile(
    r"\b(?:pick(?:ing|ed|s)?(?:[- ]?up|\s+(?:it|them|the\s+\w+)\s+up)|check(?:ing|s)?[- ]?in|start(?:ing|s)?"
    r"|depart(?:ing|ure|s)?|leav(?:e|ing)|begin(?:ning|s)?|arriv(?:e|ing|al))\b",
    re.IGNORECASE,
)
_VERBS = {"end": _END_CUE, "start": _START_CUE}
# A leg named as a noun outranks the verb near the date: "the return flight should depart at 3 pm" is the return.
_LEG = {
    "end": re.compile(r"\b(?:inbound|return\s+(?:flight|trip|leg)|way\s+back)\b", re.IGNORECASE),
    "start": re.compile(r"\b(?:outbound|(?:first|outgoing)\s+(?:flight|leg))\b", re.IGNORECASE),
}
_ADJACENT = {
    "end": re.compile(r"\b(?:to|till|until)\s+(?:the\s+)?$", re.IGNORECASE),
    "start": re.compile(r"\bfrom\s+(?:the\s+)?$", re.IGNORECASE),
}
_CLAUSE = re.compile(r"[.;!?,]|\b(?:and|but)\b", re.IGNORECASE)


def _cues(text: str, patterns: Mapping[str, re.Pattern[str]]) -> list[tuple[int, Phase]]:
    return sorted((m.start(), phase) for phase, cue in patterns.items() for m in cue.finditer(text))  # type: ignore[misc]


def _clock_kind(slot: SlotSpec) -> Literal["date", "time"] | None:
    """A free-text date or time slot, by its name."""
    name = slot.name.lower()
    if is_boolean(slot) or _is_count(slot) or (slot.is_categorical and slot.possible_values):
        return None
    if "date" in name or name == "day":
        return "date"
    return "time" if "time" in name else None


def slot_phase(name: str) -> Phase:
    """`end` for a slot that closes a span (dropoff_date, check_out_date, end_date, return_date, inbound_...), by
    the words of its name; every other date or time slot opens one (`start`)."""
    return "end" if set(name.lower().split("_")) & _END_NAMES else "start"


def _cue(before: str, after: str) -> tuple[Phase | None, bool]:
    """The phase the words around a date name, and whether they name it firmly: a span word right before it
    ("from", "to") or a leg noun before it (firm), else the nearest cue word before it (back to the previous
    date), else a leg noun or cue word after it in its clause."""
    for phase, pattern in _ADJACENT.items():
        if pattern.search(before):
            return phase, True  # type: ignore[return-value]
    if leg := _cues(before, _LEG):
        return leg[-1][1], True
    if verb := _cues(before, _VERBS):
        return verb[-1][1], False
    found = _cues(after, _LEG) or _cues(after, _VERBS)
    return (found[0][1] if found else None), False


def _asked_phase(asked: str) -> tuple[Phase | None, bool]:
    """The phase the assistant's question names ("When will you return the car?"), when it names one only, and
    whether by a leg noun ("... for your return flight?")."""
    for patterns, firm in ((_LEG, True), (_VERBS, False)):
        phases = {p for _, p in _cues(asked, patterns)}
        if phases:
            return (phases.pop() if len(phases) == 1 else None), firm
    return None, False


def _phased(text: str, matches: Sequence[re.Match[str]], asked: str) -> list[Phase | None]:
    """Each date (or time) of a user turn -> the phase its wording names; None where it names none.

    A turn with one mention that its own words name loosely (a verb) follows a leg the question names; a turn's
    only unnamed mention answers the question, else opens the span unless another mention of the turn already
    does; several unnamed ones go nowhere."""
    cuts = [m.start() for m in _CLAUSE.finditer(text)]
    named = []
    for j, m in enumerate(matches):
        start = matches[j - 1].end() if j else 0
        ends = [c for c in cuts if c >= m.end()] + ([matches[j + 1].start()] if j + 1 < len(matches) else [])
        named.append(_cue(text[start : m.start()], text[m.end() : min(ends, default=len(text))]))
    phases = [phase for phase, _ in named]
    if len(matches) == 1 and not named[0][1]:
        question, firm = _asked_phase(asked)
        if question is not None and (firm or phases[0] is None):
            return [question]
    unnamed = [j for j, p in enumerate(phases) if p is None]
    if len(unnamed) == 1:
        phases[unnamed[0]] = None if "start" in phases else "start"
    return phases


def _timed(kind: str, slots: Sequence[str], turns: Sequence[Turn]) -> dict[str, str]:
    """The date (or time) slots' values: each mention goes to the slots of the phase its wording names, the latest
    winning. When the slots are all of one phase (a restaurant's date) every mention is theirs."""
    if not slots:
        return {}
    both = {slot_phase(s) for s in slots} == {"start", "end"}
    latest: dict[Phase, str] = {}
    for i, turn in enumerate(turns):
        if turn.speaker != "user":
            continue
        asked = turns[i - 1].utterance if i and turns[i - 1].speaker == "assistant" else ""
        matches = list(_CLOCK_PATTERNS[kind].finditer(turn.utterance))
        start: Phase = "start"
        phases = _phased(turn.utterance, matches, asked) if both else [start] * len(matches)
        for m, phase in zip(matches, phases, strict=True):
            if phase is not None:
                latest[phase] = re.sub(r"^the\s+(?=\d)", "", m.group(0), flags=re.IGNORECASE)
    return {s: latest[slot_phase(s)] for s in slots if slot_phase(s) in latest}


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


# --- the slots a released folder uses -----------------------------------------------------------------------------


def used_slots(individuals: Iterable[Individual]) -> dict[str, set[str]]:
    """Service -> the slots its sessions' confirmations use (read after the foreign-slot drop)."""
    used: dict[str, set[str]] = {}
    for ind in individuals:
        for session in ind.sessions:
            slots = session.confirmation_state.slot_values if session.confirmation_state is not None else {}
            used.setdefault(session.service, set()).update(slots)
    return {service: slots for service, slots in used.items() if slots}


def folder_schemas(individuals: Sequence[Individual], schemas: Schemas) -> Schemas:
    """The schema a folder's memory, reasoner and reader work with: for a released folder (no turn annotations)
    each service keeps only the slots the folder's confirmations use, so the merged SGD versions add no slot the
    release never confirms (Music `track` beside `song_name`); an annotated (generated) folder keeps `schemas`.
    Built once per folder, from all its individuals, so a train/eval split sees one schema."""
    if any(turn.slots for ind in individuals for s in ind.sessions for turn in s.turns):
        return schemas
    return schemas.restricted(used_slots(individuals))
