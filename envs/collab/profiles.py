"""User profiles: a persona plus three interaction preferences from distinct categories.

Profiles are sampled with a seed from our own persona list, or loaded from the original benchmark's
`user_profiles.json` (`i, persona, preferences[3], categories[3]`) or from our JSONL. Train and eval sets must not
share a user; `check_disjoint` enforces it.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memrl.core.errors import ConfigError
from memrl.core.files import parse_json, read_jsonl, read_text
from memrl.core.preferences import TAXONOMY, from_original, get_preference
from memrl.core.schema import as_text
from memrl.core.schema import check_disjoint as check_splits_disjoint

# Personas in our own words; the paper draws its personas from Persona Hub, which is not shipped here.
PERSONAS: tuple[str, ...] = (
    "A night-shift nurse who studies for a statistics certificate between patient rounds",
    "A retired civil engineer who volunteers as a maths tutor at the local library",
    "A first-year law student who finds formal logic puzzles oddly relaxing",
    "A bakery owner trying to get better at pricing and inventory arithmetic",
    "A high-school chemistry teacher preparing exam questions for her class",
    "A game developer who wants to brush up on probability for loot-table design",
    "A freelance translator who is learning discrete mathematics from scratch",
    "A medical resident reviewing for board exams during a busy rotation",
    "A semi-professional cyclist who tracks training data in spreadsheets",
    "A museum guide who loves history and is curious about classic riddles",
    "A supply-chain analyst who double-checks every calculation twice",
    "A community-college student returning to school after ten years at work",
    "A jazz pianist who sees patterns in numbers the way he hears them in chords",
    "A veterinarian who wants clear reasoning before trusting any conclusion",
    "A startup founder with little time and a strong dislike of filler",
    "A librarian who catalogues puzzle books and enjoys careful explanations",
    "A high-school senior preparing for a maths olympiad qualifier",
    "A pharmacist checking dosage calculations for a continuing-education course",
    "An urban gardener who plans plots with area and yield estimates",
    "A data journalist who verifies every statistic before it goes to print",
    "A carpenter learning trigonometry to design better roof trusses",
    "A parent helping two children with homework every evening",
    "A retired accountant who does logic puzzles to stay sharp",
    "A physiotherapy student memorising anatomy for an upcoming exam",
    "A software tester who likes structured, step-by-step procedures",
    "A philosophy graduate who enjoys arguments but wants them rigorous",
    "A small-town mayor who needs quick, practical answers between meetings",
    "A marine biology PhD student who is rusty on calculus",
    "A chess club organiser who thinks in lines and alternatives",
    "An emergency dispatcher used to short, direct instructions",
    "A wedding planner juggling budgets, schedules and seating charts",
    "A self-taught programmer moving into machine learning",
    "A language teacher curious about how logic puzzles are built",
    "A hospital administrator reading up on clinical guidelines",
    "An amateur astronomer computing orbital periods for fun",
    "A paralegal who prepares careful summaries for busy attorneys",
    "A fitness coach who explains everything with sports analogies",
    "A graphic designer who prefers to see the big picture first",
    "A tax preparer studying for an advanced certification",
    "A nursing student practising medication maths under time pressure",
)


@dataclass(frozen=True)
class UserProfile:
    """`wording`: the original benchmark's sentence for each preference (with its examples), which the LLM user is
    prompted with when a profile carries it; the checkers and the rule user work from the preference ids."""

    id: str
    persona: str
    preferences: tuple[str, str, str]  # preference ids, from three distinct categories
    wording: tuple[str, str, str] | None = None

    def __post_init__(self) -> None:
        prefs = [get_preference(p) for p in self.preferences]  # unknown ids fail here, in one line
        if len(prefs) != 3 or len({p.category for p in prefs}) != 3:
            raise ConfigError(f"user {self.id!r}: needs 3 preferences from distinct categories, got {self.preferences}")

        if self.wording is not None and len(self.wording) != len(self.preferences):
            raise ConfigError(f"user {self.id!r}: wording gives {len(self.wording)} sentences for 3 preferences")

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"id": self.id, "persona": self.persona, "preferences": list(self.preferences)}
        return record if self.wording is None else record | {"wording": list(self.wording)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> UserProfile:
        try:
            wording = record.get("wording")
            return cls(
                as_text(record["id"], "id"),
                as_text(record["persona"], "persona"),
                tuple(record["preferences"]),
                None if wording is None else tuple(as_text(w, "wording") for w in wording),  # type: ignore[arg-type]
            )
        except KeyError as exc:
            raise ConfigError(f"user profile record lacks key {exc.args[0]!r}") from exc
        except ValueError as exc:
            raise ConfigError(f"user profile record: {exc}") from exc


def sample_profiles(
    n: int,
    seed: int,
    *,
    personas: Sequence[str] = PERSONAS,
    prefix: str = "user",
    preferences: Collection[str] | None = None,
) -> list[UserProfile]:
    """`n` profiles: a persona and 3 preferences from 3 distinct categories (of `preferences` when given, else of
    the whole taxonomy), reproducible from `seed`; fewer when fewer distinct users exist."""
    rng = random.Random(seed)
    by_category: dict[str, list[str]] = {}
    for pid in TAXONOMY if preferences is None else preferences:
        by_category.setdefault(get_preference(pid).category.value, []).append(pid)  # unknown ids fail in one line
    if len(by_category) < 3:
        held = ", ".join(pid for ids in by_category.values() for pid in ids)
        raise ConfigError(
            f"preferences {held} span {len(by_category)} categories ({', '.join(by_category)}); a user holds three "
            "preferences of three distinct categories"
        )
    sizes = [len(ids) for ids in by_category.values()]
    triples = sum(a * b * c for a, b, c in itertools.combinations(sizes, 3))
    n = min(n, triples * len(set(personas)))  # past this many, every further draw would repeat a user
    profiles: list[UserProfile] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    while len(profiles) < n:
        categories = rng.sample(sorted(by_category), 3)
        prefs = tuple(rng.choice(by_category[c]) for c in categories)
        persona = rng.choice(list(personas))
        if (persona, frozenset(prefs)) in seen:  # two identical users would make a train/eval split leak
            continue
        seen.add((persona, frozenset(prefs)))
        profiles.append(UserProfile(f"{prefix}-{seed}-{len(profiles)}", persona, prefs))  # type: ignore[arg-type]
    return profiles


def _from_original(record: dict[str, Any]) -> UserProfile:
    texts = tuple(as_text(text, "preferences") for text in record["preferences"])
    prefs = tuple(from_original(text).id for text in texts)
    return UserProfile(f"orig-{record['i']}", as_text(record["persona"], "persona"), prefs, texts)  # type: ignore[arg-type]


def load_profiles(path: str | Path) -> list[UserProfile]:
    """Profiles from our JSONL/JSON (`id, persona, preferences`) or the original `user_profiles.json`."""
    path = Path(path)
    # The readers say what stands at `path` when it is not a file.
    records: Any = (
        read_jsonl(path, ConfigError, torn=False)
        if path.suffix == ".jsonl"
        else parse_json(read_text(path, ConfigError), str(path), ConfigError)
    )
    if not isinstance(records, list):
        raise ConfigError(f"{path}: expected a list of user profiles")
    profiles = []
    for index, record in enumerate(records):
        try:
            profile = _from_original(record) if "i" in record else UserProfile.from_record(record)
        except (KeyError, TypeError, ValueError) as exc:  # ValueError: a text field that is not text (as_text)
            raise ConfigError(f"{path}: user profile {index} is malformed ({exc})") from exc
        except ConfigError as exc:
            raise ConfigError(f"{path}: user profile {index}: {exc}") from exc
        profiles.append(profile)
    return profiles


def save_profiles(profiles: Iterable[UserProfile], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(p.to_record()) + "\n" for p in profiles))


def check_disjoint(train: Iterable[UserProfile], eval_: Iterable[UserProfile]) -> None:
    """Fail when a user (same id, or same persona and preferences) is in both sets."""
    check_splits_disjoint(
        train,
        eval_,
        key=(lambda p: p.id, lambda p: (p.persona.strip().lower(), frozenset(p.preferences))),
        message="train and eval user profiles overlap in {n} user(s), e.g. {example!r}",
    )


def split_profiles(
    profiles: Sequence[UserProfile], n_eval: int, seed: int
) -> tuple[list[UserProfile], list[UserProfile]]:
    """Disjoint (train, eval) sets; eval gets `n_eval` users."""
    if not 0 < n_eval < len(profiles):
        raise ConfigError(f"cannot hold out {n_eval} of {len(profiles)} user profiles")
    order = list(profiles)
    random.Random(seed).shuffle(order)
    train, eval_ = order[n_eval:], order[:n_eval]
    check_disjoint(train, eval_)
    return train, eval_


SAMPLED_USERS = 200  # users sampled when no profile file is given; train and eval get half each


def profiles_for(
    source: str | Path | None,
    split: Literal["train", "eval"],
    *,
    users: int,
    seed: int,
    preferences: Collection[str] | None = None,
) -> list[UserProfile]:
    """The first `users` profiles of one side of the user split: a profile file's users (the original release ships
    one `user_profiles.json`, no split of its own), or `SAMPLED_USERS` sampled from `seed`, split in halves with
    `seed`, so train and eval never share a user. `preferences`: only users holding nothing else (sampled from
    them, or kept from the file)."""
    if source is None:
        pool = sample_profiles(SAMPLED_USERS, seed, preferences=preferences)
    else:
        pool = [p for p in load_profiles(source) if preferences is None or set(p.preferences) <= set(preferences)]
    where = "the sampled users" if source is None else str(source)
    if preferences is not None:
        where += f" holding only {', '.join(sorted(preferences))}"
    if len(pool) < 2:
        raise ConfigError(f"{where}: {len(pool)} user profile(s); disjoint train and eval users need at least 2")
    train, eval_ = split_profiles(pool, len(pool) // 2, seed)
    side = eval_ if split == "eval" else train
    if users > len(side):
        raise ConfigError(f"--users {users}: the {split} half of {where} has {len(side)} users")
    return side[:users]
