"""Embodied tasks: lettered options and the gold option derived from a scenario, and feedback from the gold.

A pick-up scenario (`user_intent_location == "pick-up"`) offers each scene object to bring; the gold is the
intended object. A placement scenario names the object first in `scene_objects` and candidate places after it; the
options are the places and the gold is the intended one. When the intended place is not among the candidates but
there is room for it (fewer than four), it is added as an option. The option order is shuffled with a seed, so the
same scenario and seed always give the same letters and scoring never depends on an LLM. When the data leaves no
gold (the intended object is not in the scene, the scene is empty, or all four slots are taken by other places),
`gold` is None and the scenario cannot be scored.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from memrl.envs.pahf.formats import EmbodiedScenario, PahfDataError
from memrl.envs.pahf.shopping import Feedback, Style

EmbodiedLabel = Literal["A", "B", "C", "D"]
EMBODIED_LABELS: tuple[EmbodiedLabel, ...] = ("A", "B", "C", "D")


@dataclass(frozen=True)
class EmbodiedOption:
    label: EmbodiedLabel
    object: str
    location: str | None  # None: bring the object to the user

    @property
    def text(self) -> str:
        if self.location is None:
            return f"bring the {self.object}"
        return f"put the {self.object} at the {self.location}"


@dataclass(frozen=True)
class EmbodiedTask:
    scenario: EmbodiedScenario
    options: tuple[EmbodiedOption, ...]
    gold: EmbodiedLabel | None  # None: the data allows no gold; skip the scenario when scoring

    def option(self, label: str) -> EmbodiedOption:
        for option in self.options:
            if option.label == label:
                return option
        have = ", ".join(o.label for o in self.options)
        raise PahfDataError(f"choice {label!r} is not an option of embodied scenario {self.scenario.index} ({have})")

    def render(self) -> str:
        """The options as the agent sees them, one per line (`A. bring the green tea`)."""
        return "\n".join(f"{o.label}. {o.text}" for o in self.options)


def _candidates(scenario: EmbodiedScenario) -> tuple[list[tuple[str, str | None]], tuple[str, str | None] | None]:
    """(object, location) candidates in scene order, and the intended one (None when it cannot be offered)."""
    objects = scenario.scene_objects
    if not objects:
        return [], None
    if scenario.is_pickup:
        candidates: list[tuple[str, str | None]] = [(o, None) for o in objects[: len(EMBODIED_LABELS)]]
        target: tuple[str, str | None] = (scenario.user_intent_object, None)
        return candidates, target if target in candidates else None
    thing = objects[0]
    candidates = [(thing, place) for place in objects[1 : 1 + len(EMBODIED_LABELS)]]
    target = (thing, scenario.user_intent_location)
    if target not in candidates and len(candidates) < len(EMBODIED_LABELS):
        candidates.append(target)  # the data names the place but forgot to list it; there is room to offer it
    return candidates, target if target in candidates else None


def embodied_task(scenario: EmbodiedScenario, seed: int = 0) -> EmbodiedTask:
    """The scenario's options in a seeded order (stable across runs and machines) and its gold label."""
    candidates, target = _candidates(scenario)
    # A string seed is hashed with SHA-512 by `random`, so the order does not depend on PYTHONHASHSEED.
    random.Random(f"pahf-embodied:{seed}:{scenario.user}:{scenario.index}").shuffle(candidates)
    options = tuple(EmbodiedOption(EMBODIED_LABELS[i], o, loc) for i, (o, loc) in enumerate(candidates))
    gold = next((o.label for o in options if (o.object, o.location) == target), None)
    return EmbodiedTask(scenario, options, gold)


def no_gold_reason(scenario: EmbodiedScenario) -> str:
    """Why `embodied_task` finds no gold for `scenario`, in a few words (for the line and metrics that name it)."""
    objects, slots = scenario.scene_objects, len(EMBODIED_LABELS)
    if not objects:
        return "empty object list"
    if scenario.is_pickup:
        if scenario.user_intent_object not in objects:
            return f"intended object {scenario.user_intent_object!r} not in the scene"
        return f"intended object {scenario.user_intent_object!r} is not among the first {slots} scene objects"
    return f"intended place {scenario.user_intent_location!r} not among the {slots} places offered"


def embodied_feedback(task: EmbodiedTask, choice: str, style: Style = "minimal") -> Feedback:
    """A deterministic reaction from the gold: right, or what the user wanted instead."""
    if task.gold is None:
        raise PahfDataError(f"embodied scenario {task.scenario.index} ({task.scenario.user}) has no gold option")
    picked = task.option(choice)
    if picked.label == task.gold:
        return Feedback(True, "Yes, that's what I wanted, thanks.", "right")
    wanted = task.option(task.gold)
    if wanted.location is None:
        message = f"That's not what I wanted: I wanted the {wanted.object}."
    else:
        message = f"That's not where I wanted it: the {wanted.object} should go at the {wanted.location}."
    if style == "detailed":
        message += f" In this situation ({task.scenario.context.lower()}) that is what I prefer."
    return Feedback(False, message, "wrong")
