"""The MS-TOD per-individual JSON format: models, loader, writer, and which format a JSON file holds.

The loader reads the format as released (`persona_id`, `sessions`, no extra keys) and our generated files, which add
two optional fields: `slots` on a turn (the slot values that turn states) and `stage` on a session. Unknown keys of
other releases are ignored rather than rejected. Any malformed file fails with one line naming the file and field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationError, field_validator, model_validator

from memrl.core import files as json_files
from memrl.core.errors import first_line
from memrl.core.files import atomic_write_json
from memrl.core.schema import LenientModel
from memrl.envs.tod.schema import Schemas, TodDataError

Stage = Literal["incomplete", "updating", "confirming"]
Format = Literal["mstod", "sgd"]

NEITHER = (
    "neither an MS-TOD individual (persona_id, sessions) nor a list of SGD dialogues (dialogue_id, services, turns)"
)


class Turn(LenientModel):
    speaker: Literal["user", "assistant"]
    utterance: str
    slots: dict[str, str] = Field(default_factory=dict)  # extension: the values this turn states

    @field_validator("speaker", mode="before")
    @classmethod
    def _speaker(cls, value: object) -> object:
        # SGD spells the roles USER / SYSTEM; accept both spellings.
        if isinstance(value, str):
            value = value.lower()
            return "assistant" if value == "system" else value
        return value


def as_dicts(turns: Sequence[Turn]) -> list[dict[str, str]]:
    """Turns as the prompts, the judger and its data read them: speaker and utterance only."""
    return [{"speaker": t.speaker, "utterance": t.utterance} for t in turns]


class Unscored(NamedTuple):
    """Why a confirming session is left out of every score: the field at fault and what is wrong with it."""

    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.field} {self.problem}"


class ConfirmationState(LenientModel):
    slot_values: dict[str, str]
    confirmation_utterance_id: int = Field(ge=0)  # index in `turns` of the assistant's confirmation


class Session(LenientModel):
    session_id: int
    reference_dialogue_id: str
    exist_confirmation: bool
    intent: str
    service: str
    turns: list[Turn]
    confirmation_state: ConfirmationState | None = None
    stage: Stage | None = None  # extension

    @field_validator("confirmation_state", mode="before")
    @classmethod
    def _empty_state(cls, value: object) -> object:
        return None if value == {} else value

    @field_validator("turns")
    @classmethod
    def _some_turns(cls, value: list[Turn]) -> list[Turn]:
        if not value:
            raise ValueError("a session needs at least one turn")
        return value

    @model_validator(mode="after")
    def _confirmation_in_range(self) -> Session:
        state = self.confirmation_state
        if state is not None and state.confirmation_utterance_id >= len(self.turns):
            raise ValueError(
                f"confirmation_state.confirmation_utterance_id {state.confirmation_utterance_id} is past the "
                f"session's {len(self.turns)} turns"
            )
        return self

    @property
    def confirming(self) -> bool:
        return self.exist_confirmation and self.confirmation_state is not None

    @property
    def unscored(self) -> Unscored | None:
        """Why this confirming session cannot be scored (None: it can, or it confirms nothing).

        Such a session is no query of the judger data and no session of `eval tod`: its gold would be empty (a
        perfect score for saying nothing) or its context would already hold the assistant's confirmation. Its
        turns still serve as memory for later sessions.
        """
        state = self.confirmation_state
        if not self.confirming or state is None:
            return None
        at = state.confirmation_utterance_id
        if self.turns[at].speaker != "assistant":
            return Unscored(
                "confirmation_state.confirmation_utterance_id", f"{at} is a user turn, not the assistant's confirmation"
            )
        if not state.slot_values:
            return Unscored(
                "confirmation_state.slot_values",
                f"no slot of service {self.service} left to score (empty, or only another service's slots, dropped)",
            )
        return None

    @property
    def scored(self) -> bool:
        """A confirming session that the metrics and the judger data score."""
        return self.confirming and self.unscored is None

    def context(self) -> list[Turn]:
        """The turns before the confirmation (all turns of a session without one)."""
        if self.confirmation_state is None:
            return list(self.turns)
        return list(self.turns[: self.confirmation_state.confirmation_utterance_id])

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "session_id": self.session_id,
            "reference_dialogue_id": self.reference_dialogue_id,
            "exist_confirmation": self.exist_confirmation,
            "intent": self.intent,
            "service": self.service,
            "turns": [
                {"speaker": t.speaker, "utterance": t.utterance, **({"slots": t.slots} if t.slots else {})}
                for t in self.turns
            ],
            "confirmation_state": self.confirmation_state.model_dump() if self.confirmation_state else {},
        }
        if self.stage is not None:
            record["stage"] = self.stage
        return record


class Individual(LenientModel):
    persona_id: int
    sessions: list[Session]

    @field_validator("sessions")
    @classmethod
    def _time_order(cls, value: list[Session]) -> list[Session]:
        return sorted(value, key=lambda s: s.session_id)

    def tasks(self) -> dict[str, list[Session]]:
        """reference_dialogue_id -> that task's sessions in time order (tasks ordered by their first session)."""
        out: dict[str, list[Session]] = {}
        for session in self.sessions:
            out.setdefault(session.reference_dialogue_id, []).append(session)
        return out

    def confirmed(self, reference_dialogue_id: str) -> dict[str, str]:
        """The task's gold goal: the slot values of its (last) confirmation; {} when it has none."""
        state: dict[str, str] = {}
        for session in self.tasks().get(reference_dialogue_id, []):
            if session.confirmation_state is not None:
                state = dict(session.confirmation_state.slot_values)
        return state

    def to_record(self) -> dict[str, Any]:
        return {"persona_id": self.persona_id, "sessions": [s.to_record() for s in self.sessions]}


# --- reading ------------------------------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    return json_files.read_json(path, TodDataError)


def detect_format(data: Any) -> Format | None:
    """`mstod` for an individual, `sgd` for a list of dialogues, None for anything else."""
    if isinstance(data, dict) and "persona_id" in data and "sessions" in data:
        return "mstod"
    if (
        isinstance(data, list)
        and data
        and all(isinstance(d, dict) and {"dialogue_id", "services", "turns"} <= d.keys() for d in data)
    ):
        return "sgd"
    return None


def file_format(path: str | Path) -> Format:
    """The format of a JSON file; fails in one line when it is neither."""
    path = Path(path)
    kind = detect_format(read_json(path))
    if kind is None:
        raise TodDataError(f"{path}: {NEITHER}")
    return kind


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(exc: ValidationError) -> str:
    """The first validation problem as `field.path: message`."""
    error = exc.errors()[0]
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{_loc(error['loc']) or 'file'}: {message}"


@dataclass
class LoadProblems:
    """What a lenient load left out: slots foreign to their session's service, confirming sessions no score can
    use (`Session.unscored`), and files it could not read.

    Passed to the loaders, it makes them lenient: a foreign slot is dropped (the rest of its session kept), an
    unscored session is kept as memory and named, and a malformed file is skipped; without it, the first problem
    fails in one line, naming the file and the field.
    """

    dropped_slots: list[dict[str, Any]] = field(default_factory=list)  # file, session_id, service, slot, where
    unscored_sessions: list[dict[str, Any]] = field(default_factory=list)  # file, session_id, why
    skipped_files: list[dict[str, str]] = field(default_factory=list)  # file, error

    def summary(self) -> dict[str, Any]:
        """What the commands print and save: counts, and every dropped slot, unscored session and skipped file."""
        return {
            "dropped_slots": {"count": len(self.dropped_slots), "slots": list(self.dropped_slots)},
            "unscored_sessions": {"count": len(self.unscored_sessions), "sessions": list(self.unscored_sessions)},
            "skipped_files": {"count": len(self.skipped_files), "files": list(self.skipped_files)},
        }

    def mark(self) -> tuple[int, int]:
        return len(self.dropped_slots), len(self.unscored_sessions)

    def undo(self, mark: tuple[int, int]) -> None:
        """Forget what was recorded since `mark` (a skipped file is not read at all)."""
        del self.dropped_slots[mark[0] :]
        del self.unscored_sessions[mark[1] :]


def check_scored(ind: Individual, path: Path, problems: LoadProblems | None = None) -> None:
    """Name every confirming session no score can use in `problems`; without it, the first fails the file."""
    for i, session in enumerate(ind.sessions):
        if (why := session.unscored) is None:
            continue
        if problems is None:
            raise TodDataError(
                f"{path}: sessions[{i}].{why.field}: {why.problem} (session_id {session.session_id}); "
                "without --strict the session is left out of the scores and named"
            )
        problems.unscored_sessions.append({"file": str(path), "session_id": session.session_id, "why": str(why)})


def check_slots(ind: Individual, schemas: Schemas, path: Path, problems: LoadProblems | None = None) -> None:
    """Every service, intent, confirmation slot and annotated slot must exist in the schema.

    An unknown service or intent fails the file. A slot foreign to its session's service fails it too, unless
    `problems` is given: the slot is then removed from the session and recorded there.
    """
    for i, session in enumerate(ind.sessions):
        where = f"{path}: sessions[{i}]"
        try:
            service = schemas.service(session.service)
        except TodDataError as exc:
            raise TodDataError(f"{where}.service: {exc}") from None
        if session.intent not in service.intents:
            raise TodDataError(
                f"{where}.intent: intent {session.intent!r} is not an intent of service {session.service!r}"
            )

        def foreign(slot: str, field_path: str, session: Session = session, where: str = where) -> bool:
            if schemas.has_slot(session.service, slot):
                return False
            if problems is None:
                raise TodDataError(f"{where}.{field_path}: no slot {slot!r} in the schema of service {session.service}")
            problems.dropped_slots.append(
                {
                    "file": str(path),
                    "session_id": session.session_id,
                    "service": session.service,
                    "slot": slot,
                    "where": field_path,
                }
            )
            return True

        if session.confirmation_state is not None:
            values = session.confirmation_state.slot_values
            for slot in [s for s in values if foreign(s, f"confirmation_state.slot_values.{s}")]:
                del values[slot]
        for j, turn in enumerate(session.turns):
            for slot in [s for s in turn.slots if foreign(s, f"turns[{j}].slots.{s}")]:
                del turn.slots[slot]


def parse_individual(
    data: Any, path: Path, schemas: Schemas | None = None, problems: LoadProblems | None = None
) -> Individual:
    if detect_format(data) != "mstod":
        raise TodDataError(
            f"{path}: {NEITHER}" if detect_format(data) is None else f"{path}: SGD dialogues, not MS-TOD"
        )
    try:
        ind = Individual.model_validate(data)
    except ValidationError as exc:
        raise TodDataError(f"{path}: {describe(exc)}") from exc
    if schemas is not None:
        check_slots(ind, schemas, path, problems)
    check_scored(ind, path, problems)  # after the drop: it may leave a goal empty
    return ind


def load_individual(
    path: str | Path, schemas: Schemas | None = None, problems: LoadProblems | None = None
) -> Individual:
    """One `persona_<id>.json` (released or generated); with `schemas`, its slots are checked against them."""
    path = Path(path)
    return parse_individual(read_json(path), path, schemas, problems)


def load_tod_dir(
    path: str | Path, schemas: Schemas | None = None, problems: LoadProblems | None = None
) -> list[Individual]:
    """Every `persona_*.json` of a folder, sorted by persona id.

    Strict without `problems`: the first malformed file fails the folder. With it, a malformed file (or a second
    file of one persona id) is skipped and recorded, foreign slots are dropped and recorded, and only a folder with
    no readable file fails.
    """
    path = Path(path)
    if not path.is_dir():
        raise TodDataError(f"{path}: not a folder of MS-TOD files (persona_<id>.json)")
    files = sorted(path.glob("persona_*.json"))
    if not files:
        raise TodDataError(f"{path}: no persona_*.json files")
    by_id: dict[int, Individual] = {}
    for file in files:
        mark = problems.mark() if problems is not None else (0, 0)
        try:
            ind = load_individual(file, schemas, problems)
            if ind.persona_id in by_id:
                raise TodDataError(f"{path}: persona_id {ind.persona_id} appears in more than one file ({file.name})")
        except TodDataError as exc:
            if problems is None:
                raise
            problems.undo(mark)  # a skipped file drops nothing: it is not read at all
            problems.skipped_files.append({"file": str(file), "error": first_line(exc)})
            continue
        by_id[ind.persona_id] = ind
    if not by_id:
        assert problems is not None
        raise TodDataError(
            f"{path}: none of its {len(files)} persona_*.json file(s) could be read; the first: "
            f"{problems.skipped_files[0]['error']}"
        )
    return [by_id[i] for i in sorted(by_id)]


def individual_path(out_dir: str | Path, persona_id: int) -> Path:
    return Path(out_dir) / f"persona_{persona_id}.json"


def write_individual(ind: Individual, out_dir: str | Path) -> Path:
    return atomic_write_json(individual_path(out_dir, ind.persona_id), ind.to_record())
