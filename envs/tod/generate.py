"""Plan MS-TOD individuals from SGD goals, and write them session by session with a resumable log.

A plan fixes, before any text is written, which goal each individual pursues, how its 2-3 sessions interleave with
the individual's other tasks, and which slot values each session states. The writers (`writers.py`) only turn a
`SessionPlan` into turns, so the gold facts never depend on a model's wording.

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

import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memrl.core.files import read_json
from memrl.core.jsonl import ResumableJsonl
from memrl.envs.tod.formats import Individual, Session, Stage, individual_path, write_individual
from memrl.envs.tod.schema import TodDataError
from memrl.envs.tod.sgd import Goal

TWO_SESSION_RATE = 0.1  # share of tasks (3+ slots) written without an updating session
EXTRA_RESTATE_RATE = 0.3  # how often the confirming user restates one slot besides the anchor
MIN_TURNS = 6


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


# --- writing ------------------------------------------------------------------------------------------------------


class SessionWriter(Protocol):
    """Turns plans into sessions, yielding (session, whether a model failed it and the template wrote it) in order."""

    fallbacks: int

    def write(self, plan: SessionPlan) -> Session: ...

    def write_many(self, plans: Sequence[SessionPlan]) -> Iterator[tuple[Session, bool]]: ...


@dataclass
class GenerationStats:
    individuals: int = 0
    sessions: int = 0
    resumed_sessions: int = 0  # taken from the progress log of an earlier, interrupted run
    skipped_individuals: int = 0  # already complete on disk
    writer_fallbacks: int = 0  # sessions the LLM writer failed and the template wrote


PROGRESS = Path(".progress") / "sessions.jsonl"


def generate(
    plans: Sequence[IndividualPlan],
    writer: SessionWriter,
    out_dir: str | Path,
    on_individual: Callable[[Individual], None] | None = None,
) -> GenerationStats:
    """Write every planned individual to `out_dir/persona_<id>.json`, resuming an interrupted run.

    Each session is appended to `out_dir/.progress/sessions.jsonl` (key `persona/session`) as soon as it is written;
    an individual's file appears, atomically, once all its sessions are there. A rerun skips finished individuals and
    reuses logged sessions, so nothing is written twice.
    """
    out = Path(out_dir)
    log = ResumableJsonl(out / PROGRESS)
    logged = {str(r["key"]): r for r in log.records()}
    stats = GenerationStats()
    for plan in plans:
        path = individual_path(out, plan.persona_id)
        if path.exists():
            stats.skipped_individuals += 1
            stats.writer_fallbacks += sum(bool(logged.get(s.key, {}).get("fallback")) for s in plan.sessions)
            continue
        todo = [sp for sp in plan.sessions if sp.key not in logged]
        stats.resumed_sessions += len(plan.sessions) - len(todo)
        # One call per individual lets a model writer batch its requests; each session is logged as it arrives.
        for sp, (session, fallback) in zip(todo, writer.write_many(todo), strict=True):
            record = {"key": sp.key, "fallback": fallback, "session": session.to_record()}
            log.append(record)
            logged[sp.key] = record
        sessions = []
        for sp in plan.sessions:
            record = logged[sp.key]
            stats.writer_fallbacks += bool(record.get("fallback"))
            sessions.append(Session.model_validate(record["session"]))
            stats.sessions += 1
        individual = Individual(persona_id=plan.persona_id, sessions=sessions)
        write_individual(individual, out)
        stats.individuals += 1
        if on_individual is not None:
            on_individual(individual)
    return stats


def check_run_config(out_dir: str | Path, config: dict[str, Any]) -> None:
    """A rerun into the same folder must use the same settings, or resumed sessions would belong to another plan."""
    path = Path(out_dir) / ".progress" / "config.json"
    if path.exists():
        previous = read_json(path, TodDataError)
        for key, value in config.items():
            if previous.get(key) != value:
                raise TodDataError(
                    f"{out_dir} holds a run with {key}={previous.get(key)!r}, not {value!r}: resume it with the same "
                    "settings or write to a new folder"
                )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=1) + "\n")
