"""The task goals hidden in SGD dialogues.

A goal is what the assistant finally confirmed for one intent of one dialogue: the dialogue is split by the user's
active intent, the slot values of the assistant's CONFIRM acts under that intent are merged in order (a later
confirmation overrides an earlier one: users change their minds), and goals with fewer than `min_slots` slots are
dropped. Values the dialogue mentioned for a goal slot before settling on the confirmed one are kept as `earlier`:
they make natural preliminary values for an "updating" session.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from memrl.envs.tod.schema import Schemas, TodDataError
from memrl.envs.tod.sgd import SgdAction, SgdDialogue, load_dialogues


@dataclass(frozen=True)
class Goal:
    reference_dialogue_id: str  # the dialogue id, suffixed with the intent when a dialogue holds several goals
    dialogue_id: str
    service: str
    intent: str
    slots: dict[str, str]  # confirmed values, in the intent's schema order
    earlier: dict[str, tuple[str, ...]] = field(default_factory=dict)  # other values the dialogue had for a slot

    @property
    def anchor(self) -> str:
        """The slot that identifies the task in every session (its first slot in schema order)."""
        return next(iter(self.slots))


def _canonical(action: SgdAction, i: int = 0) -> str:
    values = action.canonical_values or action.values
    return values[i].strip().casefold() if i < len(values) else ""


def dialogue_goals(dialogue: SgdDialogue, schemas: Schemas, where: str = "", min_slots: int = 2) -> list[Goal]:
    """The goals of one dialogue (usually one: its transactional intent)."""
    active: dict[str, str] = {}
    confirmed: dict[tuple[str, str], dict[str, SgdAction]] = {}
    mentioned: dict[tuple[str, str], list[SgdAction]] = {}  # (service, slot) -> value-bearing acts, in order
    for t, turn in enumerate(dialogue.turns):
        user = turn.speaker.upper() == "USER"
        for f, frame in enumerate(turn.frames):
            if frame.service not in schemas:
                raise TodDataError(
                    f"{where}{dialogue.dialogue_id}: turns[{t}].frames[{f}].service: service {frame.service!r} "
                    "is not in the schema"
                )
            if user and frame.state is not None and frame.state.active_intent != "NONE":
                active[frame.service] = frame.state.active_intent
            for a, action in enumerate(frame.actions):
                if not action.values or action.act not in ("INFORM", "CONFIRM"):
                    continue
                if not schemas.has_slot(frame.service, action.slot):
                    raise TodDataError(
                        f"{where}{dialogue.dialogue_id}: turns[{t}].frames[{f}].actions[{a}].slot: no slot "
                        f"{action.slot!r} in the schema of service {frame.service}"
                    )
                if user or action.act == "CONFIRM":
                    mentioned.setdefault((frame.service, action.slot), []).append(action)
                if not user and action.act == "CONFIRM" and frame.service in active:
                    confirmed.setdefault((frame.service, active[frame.service]), {})[action.slot] = action
    goals = []
    for (service, intent), acts in confirmed.items():
        if len(acts) < min_slots:
            continue
        slots = schemas.service(service).in_slot_order(intent, acts)
        earlier: dict[str, tuple[str, ...]] = {}
        for slot in slots:
            final = _canonical(acts[slot])
            seen: dict[str, str] = {}
            for action in mentioned.get((service, slot), []):
                key = _canonical(action)
                if key != final and (key not in seen or action.act == "CONFIRM"):
                    seen[key] = action.values[0]  # the assistant's wording of a value reads better than the user's
            if seen:
                earlier[slot] = tuple(seen.values())
        goals.append(
            Goal(
                reference_dialogue_id=dialogue.dialogue_id,
                dialogue_id=dialogue.dialogue_id,
                service=service,
                intent=intent,
                slots={s: acts[s].values[0] for s in slots},
                earlier=earlier,
            )
        )
    if len(goals) > 1:  # keep task ids unique when one dialogue yields several goals
        goals = [replace(g, reference_dialogue_id=f"{g.dialogue_id}_{g.intent}") for g in goals]
    return goals


def extract_goals(files: Sequence[Path], schemas: Schemas, min_slots: int = 2) -> list[Goal]:
    """Every goal with at least `min_slots` confirmed slots, sorted by task id."""
    goals = []
    for path in files:
        # SGD numbers dialogues per split, so the split qualifies the id when the file sits in a split folder.
        split = path.parent.name if path.parent.name in ("train", "dev", "test") else ""
        for dialogue in load_dialogues(path):
            for goal in dialogue_goals(dialogue, schemas, f"{path}: ", min_slots):
                if split:
                    goal = replace(goal, reference_dialogue_id=f"{split}-{goal.reference_dialogue_id}")
                goals.append(goal)
    ids = [g.reference_dialogue_id for g in goals]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TodDataError(f"dialogue id {dup} appears in more than one SGD file ({', '.join(map(str, files))})")
    return sorted(goals, key=lambda g: g.reference_dialogue_id)


def value_pool(goals: Iterable[Goal], schemas: Schemas) -> dict[tuple[str, str], list[str]]:
    """(service, slot) -> the distinct confirmed values of the corpus, then the schema's possible values."""
    pool: dict[tuple[str, str], dict[str, str]] = {}
    for goal in goals:
        for slot, value in goal.slots.items():
            pool.setdefault((goal.service, slot), {}).setdefault(value.casefold(), value)
    for name, service in schemas.services.items():
        for spec in service.slots.values():
            for value in spec.possible_values:
                if value != "dontcare":
                    pool.setdefault((name, spec.name), {}).setdefault(value.casefold(), value)
    return {key: list(values.values()) for key, values in pool.items()}
