"""Plan MS-TOD individuals from SGD goals.

A plan fixes, before any text is written, which goal each individual pursues, how its 2-3 sessions interleave with
the individual's other tasks, and which slot values each session states. The writers (`session_writers.py`) only turn
a `SessionPlan` into turns, so the gold facts never depend on a model's wording.

Per task (goal), in time order:
- incomplete: the anchor slot and about half of the others; when an updating session follows, one of those is a
  preliminary value that the updating session corrects.
- updating: the correction and every goal slot not stated yet, so every confirmed value lives in an earlier session.
- confirming: the user names the anchor (sometimes one more slot), the assistant confirms the whole goal. Whatever
  the user did not restate is what memory has to supply.
Tasks with 2 slots, and about 10% of the others, skip the updating session; their first session then states every
slot (without a preliminary value).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.data_gen.tod.goals import Goal
from memrl.envs.tod.formats import Stage
from memrl.envs.tod.schema import TodDataError

TWO_SESSION_RATE = 0.1  # share of tasks (3+ slots) written without an updating session
EXTRA_RESTATE_RATE = 0.3  # how often the confirming user restates one slot besides the anchor


@dataclass(frozen=True)
class SessionPlan:
    persona_id: int
    session_id: int  # time order within the individual
    goal: Goal
    stage: Stage
    task_sessions: int  # 2 or 3: how many sessions the task has
    states: dict[str, str]  # slot -> value the user states in this session, anchor first
    corrects: dict[str, str] = field(default_factory=dict)  # updating: slot -> the preliminary value it replaces
    preliminary: tuple[str, ...] = ()  # incomplete: stated slots whose value the updating session will correct
    open_slots: tuple[str, ...] = ()  # goal slots nobody has stated by the end of this session

    @property
    def key(self) -> str:
        return f"{self.persona_id}/{self.session_id}"

    @property
    def missing(self) -> tuple[str, ...]:
        """Confirming: the goal slots the user does not restate before the confirmation (memory must fill them)."""
        return tuple(s for s in self.goal.slots if s not in self.states)


@dataclass(frozen=True)
class IndividualPlan:
    persona_id: int
    sessions: tuple[SessionPlan, ...]

    def tasks(self) -> dict[str, list[SessionPlan]]:
        out: dict[str, list[SessionPlan]] = {}
        for s in self.sessions:
            out.setdefault(s.goal.reference_dialogue_id, []).append(s)
        return out


def _spread(goals: Sequence[Goal], rng: random.Random) -> list[Goal]:
    """Shuffle, then spread each (service, intent) evenly over the sequence so dealing mixes services per person."""
    groups: dict[tuple[str, str], list[Goal]] = {}
    for goal in goals:
        groups.setdefault((goal.service, goal.intent), []).append(goal)
    keyed = []
    for members in groups.values():
        rng.shuffle(members)
        for j, goal in enumerate(members):
            keyed.append(((j + rng.random()) / len(members), goal.reference_dialogue_id, goal))
    return [goal for *_, goal in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _preliminary(goal: Goal, slot: str, pool: dict[tuple[str, str], list[str]], rng: random.Random) -> str | None:
    """A value the user could have said first: one the dialogue itself had, else another value of that slot."""
    confirmed = goal.slots[slot].casefold()
    options = [v for v in goal.earlier.get(slot, ()) if v.casefold() != confirmed and v.casefold() != "dontcare"]
    if not options:
        options = [v for v in pool.get((goal.service, slot), []) if v.casefold() != confirmed]
    return rng.choice(options) if options else None


def plan_task(
    goal: Goal, pool: dict[tuple[str, str], list[str]], rng: random.Random
) -> list[tuple[Stage, dict[str, Any]]]:
    """The stages of one task and what each states (session ids come later, from the interleaving)."""
    anchor, *others = list(goal.slots)
    three = len(goal.slots) >= 3 and rng.random() >= TWO_SESSION_RATE
    restate = {anchor: goal.slots[anchor]}
    if len(others) >= 2 and rng.random() < EXTRA_RESTATE_RATE:
        extra = rng.choice(others)
        restate = {s: goal.slots[s] for s in goal.slots if s in (anchor, extra)}
    confirming: dict[str, Any] = {"states": restate}
    if not three:
        first = {"states": dict(goal.slots), "open_slots": ()}
        return [("incomplete", first), ("confirming", confirming)]
    k = rng.choice([len(others) // 2, (len(others) + 1) // 2])
    k = min(max(k, 1), len(others) - 1)
    early = set(rng.sample(others, k))
    states = {s: v for s, v in goal.slots.items() if s == anchor or s in early}
    late = [s for s in others if s not in early]
    # Prefer correcting a slot the SGD dialogue itself changed its mind about.
    candidates = sorted(early, key=lambda s: (s not in goal.earlier, list(goal.slots).index(s)))
    corrects: dict[str, str] = {}
    for slot in candidates:
        value = _preliminary(goal, slot, pool, rng)
        if value is not None:
            states[slot] = value
            corrects[slot] = value
            break
    incomplete = {"states": states, "preliminary": tuple(corrects), "open_slots": tuple(late)}
    updating_states = {s: v for s, v in goal.slots.items() if s == anchor or s in corrects or s in late}
    updating = {"states": updating_states, "corrects": corrects, "open_slots": ()}
    return [("incomplete", incomplete), ("updating", updating), ("confirming", confirming)]


def plan_individuals(
    goals: Sequence[Goal],
    individuals: int,
    tasks_per_individual: int,
    seed: int,
    pool: dict[tuple[str, str], list[str]],
) -> list[IndividualPlan]:
    """`individuals` people with `tasks_per_individual` goals each (no goal shared), sessions interleaved in time."""
    if individuals < 1 or tasks_per_individual < 1:
        raise TodDataError(f"need at least 1 individual and 1 task each, got {individuals} x {tasks_per_individual}")
    need = individuals * tasks_per_individual
    if len(goals) < need:
        raise TodDataError(
            f"{individuals} individuals x {tasks_per_individual} tasks need {need} goals, but the SGD files hold "
            f"{len(goals)} goals with >= 2 confirmed slots (lower --individuals or --tasks-per-individual)"
        )
    rng = random.Random(seed)
    order = _spread(sorted(goals, key=lambda g: g.reference_dialogue_id), rng)[:need]
    plans = []
    for p in range(individuals):
        persona_id = p + 1
        mine = order[p::individuals]
        staged = [plan_task(goal, pool, rng) for goal in mine]
        # A uniformly random interleaving that keeps each task's own order.
        slots = [t for t, stages in enumerate(staged) for _ in stages]
        rng.shuffle(slots)
        cursor = [0] * len(staged)
        sessions = []
        for session_id, t in enumerate(slots, start=1):
            stage, spec = staged[t][cursor[t]]
            cursor[t] += 1
            sessions.append(SessionPlan(persona_id, session_id, mine[t], stage, len(staged[t]), **spec))
        plans.append(IndividualPlan(persona_id, tuple(sessions)))
    return plans
