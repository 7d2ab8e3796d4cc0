"""Reflection training data from collab session records (`sessions.jsonl` of `memrl eval collab`).

One record per session that has something to learn (an enforcing utterance) or something to keep (notes before).
The gold reflection is either composed offline from the rule simulator's labels (`composed`) or taken from the
run's own reflector, a strong teacher (`teacher`). Train and eval must share no user and no problem.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from rich.console import Console

from memrl.core.errors import ConfigError
from memrl.core.outcomes import NothingDoneError
from memrl.core.schema import check_disjoint as check_splits_disjoint
from memrl.data_gen.config import ReflectionDataConfig
from memrl.data_gen.gold import NOTES, compose_notes, compose_reasoning, gold_json
from memrl.data_gen.writers import ReflectionRecord, Stats, write_dataset
from memrl.envs.collab.prompts import reflection_messages
from memrl.envs.collab.records import SessionRecord, read_sessions
from memrl.rewards.format import REFLECTION_KEYS
from memrl.rollout.base import Message
from memrl.rollout.json_output import JSONParseFailure, field_text, parse_json_object

__all__ = [
    "GoldSource",
    "ReflectionRecord",
    "SkipCounts",
    "Skipped",
    "Stats",
    "build_from_sessions",
    "build_records",
    "check_disjoint",
    "require_records",
    "write_dataset",
]

GoldSource = Literal["composed", "teacher"]


@dataclass
class SkipCounts:
    """Sessions that produced no record, by reason."""

    nothing_to_learn: int = 0  # no enforcing utterance and no notes before
    unlabelled: int = 0  # composed: the user enforced, but the turns carry no `violated` ids (not a rule user)
    teacher_unparsed: int = 0  # teacher: the run's reflection is missing, unparsable, or has empty notes

    @property
    def total(self) -> int:
        return self.nothing_to_learn + self.unlabelled + self.teacher_unparsed

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}

    @classmethod
    def from_dict(cls, counts: dict[str, int]) -> SkipCounts:
        return cls(**{k: v for k, v in counts.items() if k != "total"})

    def describe(self) -> str:
        """The non-zero counts in words: "1 with nothing to learn (no preference enforced), 2 unlabelled"."""
        words = {
            "nothing_to_learn": "with nothing to learn (no preference enforced)",
            "unlabelled": "unlabelled (no violated preference ids: not a rule user)",
            "teacher_unparsed": "whose teacher reflection did not parse",
        }
        return ", ".join(f"{n} {words[k]}" for k, n in asdict(self).items() if n) or "none"


@dataclass
class Skipped:
    train: SkipCounts = field(default_factory=SkipCounts)
    eval: SkipCounts = field(default_factory=SkipCounts)

    @property
    def total(self) -> int:
        return self.train.total + self.eval.total

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {"train": self.train.to_dict(), "eval": self.eval.to_dict()}


# --- loading ------------------------------------------------------------------------------------------------------


def load_split(paths: Sequence[str | Path]) -> list[SessionRecord]:
    """The session records of one split's files; files holding none are a ConfigError naming them, on the command
    and the stage alike (a split with no session would only fail later, as "no records")."""
    records = [s for path in paths for s in read_sessions(path)]
    if not records:
        raise ConfigError(f"no session records in {', '.join(map(str, paths))}")
    return records


# --- what one session teaches -------------------------------------------------------------------------------------


def _name(record: SessionRecord) -> str:
    return f"{record.user_id}/s{record.session}"


def _conversation(record: SessionRecord) -> tuple[Message, ...]:
    return tuple(Message(role=t["role"], content=t["content"]) for t in record.turns)


def _enforced_ids(record: SessionRecord) -> tuple[str, ...]:
    """Preference ids named in the `violated` lists of enforcing user turns, first occurrence first."""
    seen: dict[str, None] = {}
    for turn in record.turns:
        if turn["role"] == "user" and turn.get("enforce"):
            for pid in turn.get("violated") or ():
                if pid not in NOTES:
                    raise ConfigError(f"session {_name(record)}: unknown preference id {pid!r} in a violated list")
                seen.setdefault(pid, None)
    return tuple(seen)


def _teacher_gold(record: SessionRecord) -> tuple[str, str] | None:
    """(reasoning, notes) of the run's own reflection, or None when there is no usable one."""
    reasoning_key, notes_key = REFLECTION_KEYS
    parsed = parse_json_object(record.reflection_raw, required=(notes_key,))
    if isinstance(parsed, JSONParseFailure):
        return None
    notes = field_text(parsed.data.get(notes_key)).strip()
    if not notes:  # the agent would have kept its old notes: there is no teacher target here
        return None
    return field_text(parsed.data.get(reasoning_key)).strip(), notes


def _by_user(sessions: Iterable[SessionRecord]) -> dict[str, list[SessionRecord]]:
    users: dict[str, list[SessionRecord]] = {}
    seen: set[tuple[str, int]] = set()
    for record in sessions:
        ident = (record.user_id, record.session)
        if ident in seen:
            raise ConfigError(f"session {_name(record)} appears twice in the input")
        seen.add(ident)
        users.setdefault(record.user_id, []).append(record)
    for records in users.values():
        records.sort(key=lambda r: r.session)
    return users


def build_records(
    sessions: Iterable[SessionRecord], gold: GoldSource = "composed"
) -> tuple[list[ReflectionRecord], SkipCounts]:
    """Reflection records of one split, users in first-seen order and each user's sessions by index."""
    if gold not in ("composed", "teacher"):
        raise ConfigError(f"unknown gold source {gold!r}: use composed or teacher")
    records: list[ReflectionRecord] = []
    skipped = SkipCounts()
    for user_id, user_sessions in _by_user(sessions).items():
        expected: tuple[str, ...] = ()  # ids enforced so far, in first-enforced order
        for record in user_sessions:
            carried, enforced = expected, _enforced_ids(record)
            expected = carried + tuple(pid for pid in enforced if pid not in carried)
            enforcements = record.enforcing_utterances
            # composed: the chain restarts at the user's first session; each step adds what was enforced
            notes_before = compose_notes(carried) if gold == "composed" else record.notes_before
            if not enforcements and not notes_before.strip():
                skipped.nothing_to_learn += 1
                continue
            if gold == "composed":
                if enforcements and not enforced:
                    skipped.unlabelled += 1
                    continue
                reasoning, notes = compose_reasoning(enforced, carried), compose_notes(expected)
            else:
                teacher = _teacher_gold(record)
                if teacher is None:
                    skipped.teacher_unparsed += 1
                    continue
                reasoning, notes = teacher
            conversation = _conversation(record)
            records.append(
                ReflectionRecord(
                    key=_name(record),
                    user_id=user_id,
                    problem_id=record.problem_id,
                    session=record.session,
                    task=record.task,
                    preferences=record.preferences,
                    enforced=enforced,
                    expected=expected,
                    enforcements=enforcements,
                    notes_before=notes_before,
                    conversation=conversation,
                    prompt=tuple(reflection_messages(notes_before, conversation)),
                    gold_reasoning=reasoning,
                    gold_notes=notes,
                    gold=gold_json(reasoning, notes),
                )
            )
    return records, skipped


def check_disjoint(train: Sequence[ReflectionRecord], eval_: Sequence[ReflectionRecord]) -> None:
    """ConfigError (one line, one example) when train and eval share a user or a problem."""
    for what, attr in (("user", "user_id"), ("problem", "problem_id")):
        check_splits_disjoint(
            train,
            eval_,
            key=operator.attrgetter(attr),
            message=f"train and eval share {{n}} {what}(s), e.g. {{example!r}}: "
            "generate them from disjoint splits (collab `split: train|eval`)",
        )


def build_from_sessions(
    train_sessions: Sequence[SessionRecord], eval_sessions: Sequence[SessionRecord], gold: GoldSource = "composed"
) -> tuple[list[ReflectionRecord], list[ReflectionRecord], Skipped]:
    """Train and eval records from the session records of disjoint collab runs (checked)."""
    train, train_skipped = build_records(train_sessions, gold)
    eval_, eval_skipped = build_records(eval_sessions, gold)
    check_disjoint(train, eval_)
    return train, eval_, Skipped(train_skipped, eval_skipped)


def require_records(
    what: str,
    train: Sequence[ReflectionRecord],
    eval_: Sequence[ReflectionRecord],
    skipped: Skipped,
    sessions: tuple[int, int],
) -> None:
    """One line naming `what` when a split has no record (checked before anything is written): a trainer given an
    empty split fails far later, and less clearly. `sessions`: the (train, eval) sessions the records came from."""
    for split, records, skips, n in (
        ("train", train, skipped.train, sessions[0]),
        ("eval", eval_, skipped.eval, sessions[1]),
    ):
        if records:
            continue
        if not n:
            raise NothingDoneError(f"{what}: no {split} sessions to build records from; no dataset written")
        label = "training" if split == "train" else split
        raise NothingDoneError(
            f"{what}: no {label} records: all {n} {split} sessions were skipped ({skips.describe()}); no dataset "
            "written"
        )


def build_reflection_data(
    cfg: ReflectionDataConfig, out: Path, console: Console, seed: int, what: str
) -> tuple[Stats, int, int]:
    """The datasets under `out` from the given sessions, else from fresh collab runs of each split (under
    `out/collab-<split>`); returns the stats and the train and eval record counts. `what` names the work in errors."""
    if cfg.train_sessions:  # as `memrl data reflection` reads them: a split with no session refused in one line
        train, evaluation = load_split(cfg.train_sessions), load_split(cfg.eval_sessions)
    else:
        train = _collab_sessions(cfg, "train", cfg.train_users, out / "collab-train", console, seed, what)
        evaluation = _collab_sessions(cfg, "eval", cfg.eval_users, out / "collab-eval", console, seed, what)
    train_records, eval_records, skipped = build_from_sessions(train, evaluation, cfg.gold)
    require_records(what, train_records, eval_records, skipped, (len(train), len(evaluation)))
    return write_dataset(train_records, eval_records, out, skipped), len(train_records), len(eval_records)


def _collab_sessions(
    cfg: ReflectionDataConfig, split: str, users: int, out: Path, console: Console, seed: int, what: str
) -> list[SessionRecord]:
    """The split's finished sessions; fails (writing no dataset) when fewer than `min_success` of those run finished."""
    from memrl.envs.collab.runner import collab_run, finished_sessions

    collab = cfg.collab.model_copy(update={"split": split, "users": users, "seed": seed})
    run = collab_run(collab, out, console)
    then = f"no dataset written; a rerun runs them again ({out / 'failed.jsonl'})"
    run.check(f"{what} ({split} split)", cfg.min_success, then)
    return finished_sessions(run, out)
