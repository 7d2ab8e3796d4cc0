"""Offline, schema-based reasoning over a dialogue context: which slots it has filled, which the intent still misses,
and a short query describing the intent (the offline stand-ins for the LLM intent extractor and missing-slot reasoner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memrl.envs.tod.formats import Turn
from memrl.envs.tod.schema import IntentSpec, Schemas, intent_phrase, slot_phrase
from memrl.envs.tod.values import mentions


def filled_slots(turns: Sequence[Turn], goal: Mapping[str, str] | None = None) -> dict[str, str]:
    """Slot -> value established in `turns`: their slot annotations (last wins); for unannotated turns (the released
    format) the `goal` values found verbatim in the utterances."""
    if any(t.slots for t in turns):
        out: dict[str, str] = {}
        for turn in turns:
            out.update(turn.slots)
        return out
    if not goal:
        return {}
    return {slot: value for slot, value in goal.items() if any(mentions(t.utterance, value) for t in turns)}


def schema_missing_slots(turns: Sequence[Turn], intent: IntentSpec, goal: Mapping[str, str] | None = None) -> list[str]:
    """The intent's required and optional slots (schema order) that the context has not filled: hypothesised L_miss."""
    filled = filled_slots(turns, goal)
    return [s for s in intent.slots if s not in filled]


def schema_intent_query(
    turns: Sequence[Turn], service: str, intent: str, schemas: Schemas, goal: Mapping[str, str] | None = None
) -> str:
    """k_cur offline: the intent's description, then each filled value in schema order ('...; city San Jose')."""
    spec = schemas.intent(service, intent)
    filled = filled_slots(turns, goal)
    parts = [intent_phrase(spec)]
    for slot in schemas.service(service).in_slot_order(intent, filled):
        if schemas.has_slot(service, slot):
            parts.append(f"{slot_phrase(schemas.slot(service, slot))} {filled[slot]}")
    return "; ".join(parts)
