"""SGD dialogues as read from `dialogues_*.json` files: their turns, frames and dialogue acts."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from memrl.core.schema import LenientModel
from memrl.envs.tod.formats import NEITHER, describe, detect_format, read_json
from memrl.envs.tod.schema import TodDataError


class SgdAction(LenientModel):
    act: str
    slot: str = ""
    values: list[str] = Field(default_factory=list)
    canonical_values: list[str] = Field(default_factory=list)


class SgdState(LenientModel):
    active_intent: str = "NONE"


class SgdFrame(LenientModel):
    service: str
    actions: list[SgdAction] = Field(default_factory=list)
    state: SgdState | None = None


class SgdTurn(LenientModel):
    speaker: str
    utterance: str
    frames: list[SgdFrame] = Field(default_factory=list)


class SgdDialogue(LenientModel):
    dialogue_id: str
    services: list[str]
    turns: list[SgdTurn]


def dialogue_files(path: str | Path) -> list[Path]:
    """`dialogues_*.json` of a file, a folder, or a folder's train/dev/test subfolders, in a stable order."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(path.glob("dialogues_*.json"))
    for split in ("train", "dev", "test"):
        files += sorted((path / split).glob("dialogues_*.json"))
    return files


def load_dialogues(path: str | Path) -> list[SgdDialogue]:
    """The dialogues of one SGD `dialogues_*.json` file; any other JSON fails in one line."""
    path = Path(path)
    data = read_json(path)
    kind = detect_format(data)
    if kind != "sgd":
        raise TodDataError(f"{path}: " + (NEITHER if kind is None else "an MS-TOD individual, not SGD dialogues"))
    out = []
    for index, record in enumerate(data):
        try:
            out.append(SgdDialogue.model_validate(record))
        except ValidationError as exc:
            raise TodDataError(f"{path}: [{index}].{describe(exc)}") from exc
    return out
