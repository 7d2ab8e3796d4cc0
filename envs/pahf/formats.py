"""The released PAHF data formats: models and loaders for the shopping and embodied domains.

Shopping: `phase{1..4}.json` (lists of `product`, `Option A/B/C`, `User`, `Task`, `gt` with null for "buy nothing"),
`persona_info.json` / `updated_persona_info.json` (name -> `persona_info` -> product -> feature -> `like_most`,
`like_second`, `dislike`, plus a `sample_list` we ignore) and `original_persona.json` / `updated_persona.json`
(name -> persona prompt). Embodied: `scenarios/{original,evolved}_scenarios_{A,B}.json` and
`personas/{original,evolved}_persona.py` as released (Python modules of string literals, parsed with `ast` and never
imported or run), or `personas/{original,evolved}_persona.json` (name -> prompt) where no `.py` is present. Any
malformed file fails in one line naming the file and the field.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from memrl.core import files as json_files
from memrl.core.errors import MemrlError
from memrl.core.schema import LenientModel

Label = Literal["A", "B", "C"]
LABELS: tuple[Label, ...] = ("A", "B", "C")


class PahfDataError(MemrlError):
    """A PAHF data file is malformed or in an unknown format; the message names the file and the field."""


class ShoppingScenario(LenientModel):
    """One purchase: up to three options (label -> feature values); `gt` None means buying nothing is right."""

    product: str
    options: dict[Label, list[str]]
    user: str
    task: str
    gt: Label | None

    @field_validator("options")
    @classmethod
    def _some_options(cls, value: dict[Label, list[str]]) -> dict[Label, list[str]]:
        if not value:
            raise ValueError("a row needs at least one of `Option A`, `Option B`, `Option C`")
        for label, features in value.items():
            if not features:
                raise ValueError(f"`Option {label}` lists no features")
        return {label: value[label] for label in LABELS if label in value}

    @classmethod
    def from_record(cls, record: Any) -> ShoppingScenario:
        """From the released keys (`Option A`, `User`, `Task`, ...); raises ValidationError when malformed."""
        if not isinstance(record, dict):
            return cls.model_validate(record)  # fails with pydantic's own "should be a dict" message
        fields = {"product": "product", "user": "User", "task": "Task", "gt": "gt"}
        data: dict[str, Any] = {ours: record[theirs] for ours, theirs in fields.items() if theirs in record}
        data["options"] = {label: record[f"Option {label}"] for label in LABELS if f"Option {label}" in record}
        return cls.model_validate(data)

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"product": self.product}
        out.update({f"Option {label}": list(features) for label, features in self.options.items()})
        out.update({"User": self.user, "Task": self.task, "gt": self.gt})
        return out


class FeaturePreference(LenientModel):
    like_most: str
    like_second: list[str]
    dislike: list[str]


class PersonaTable(LenientModel):
    """A user's preference table: product -> feature -> which values they like most, accept, or dislike."""

    name: str
    products: dict[str, dict[str, FeaturePreference]]

    @classmethod
    def from_record(cls, name: str, record: Any) -> PersonaTable:
        """From `{"persona_info": {"name": ..., PRODUCT: {FEATURE: {...}}}, "sample_list": [...]}` (or the inner
        `persona_info` object alone)."""
        if isinstance(record, dict) and "persona_info" in record:
            record = record["persona_info"]
        if not isinstance(record, dict):
            return cls.model_validate(record)
        products = {k: v for k, v in record.items() if k != "name"}
        return cls.model_validate({"name": record.get("name", name), "products": products})

    def to_record(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.name}
        for product, features in self.products.items():
            info[product] = {feature: pref.model_dump() for feature, pref in features.items()}
        return {"persona_info": info, "sample_list": list(self.products)}


class EmbodiedScenario(LenientModel):
    index: int
    scene: str
    task: str
    context: str
    user: str
    user_intent_object: str
    user_intent_location: str  # `pick-up` (bring the object), else where to put it
    scene_objects: list[str] = Field(default_factory=list)

    @property
    def is_pickup(self) -> bool:
        return self.user_intent_location == "pick-up"


@dataclass
class ShoppingData:
    phases: dict[int, list[ShoppingScenario]]  # 1..4
    original: dict[str, PersonaTable]  # name -> table before the drift (phases 1-2)
    evolved: dict[str, PersonaTable]  # after the drift (phases 3-4)
    personas_original: dict[str, str]  # name -> persona prompt
    personas_evolved: dict[str, str]

    def table(self, phase: int, user: str) -> PersonaTable:
        """The table that defines `user`'s gold in `phase` (original for 1-2, evolved for 3-4)."""
        tables = self.original if phase <= 2 else self.evolved
        if user not in tables:
            raise PahfDataError(f"no preference table for user {user!r} (phase {phase})")
        return tables[user]


@dataclass
class EmbodiedData:
    original: list[EmbodiedScenario]
    evolved: list[EmbodiedScenario]
    personas_original: dict[str, str]
    personas_evolved: dict[str, str]


# --- reading ------------------------------------------------------------------------------------------------------


def read_json(path: str | Path) -> Any:
    return json_files.read_json(path, PahfDataError)


_RELEASED_KEYS = {"product": "product", "options": "Option A/B/C", "user": "User", "task": "Task"}


def _loc(loc: Sequence[int | str]) -> str:
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "options":  # ("options", "B", 0) -> "Option B[0]"
        parts = [f"Option {parts[1]}", *parts[2:]]
    out = ""
    for part in parts:
        part = _RELEASED_KEYS.get(part, part) if isinstance(part, str) else part
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: ErrorDetails) -> str:
    return "missing" if error["type"] == "missing" else str(error["msg"]).removeprefix("Value error, ")


def describe(exc: ValidationError, prefix: str = "") -> str:
    """The first validation problem as `prefix.field.path: message`, in the released key names."""
    error = exc.errors()[0]
    message = _message(error)
    where = _loc(error["loc"])
    return f"{prefix}{'.' if prefix and where else ''}{where}: {message}" if (prefix or where) else message


def _expect(data: Any, kind: type, path: Path, what: str) -> Any:
    if not isinstance(data, kind):
        raise PahfDataError(f"{path}: unknown format: expected {what}, got a JSON {type(data).__name__}")
    return data


def load_shopping_phase(path: str | Path) -> list[ShoppingScenario]:
    """A shopping phase file: a list of rows with `product`, `Option A/B/C`, `User`, `Task`, `gt`."""
    path = Path(path)
    rows = _expect(read_json(path), list, path, "a list of shopping rows (product, Option A/B/C, User, Task, gt)")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(ShoppingScenario.from_record(row))
        except ValidationError as exc:
            raise PahfDataError(f"{path}: {describe(exc, f'[{i}]')}") from None
        if out[-1].gt is not None and out[-1].gt not in out[-1].options:
            raise PahfDataError(f"{path}: [{i}].gt: names `Option {out[-1].gt}`, which the row does not have")
    return out


def load_persona_tables(path: str | Path) -> dict[str, PersonaTable]:
    """`persona_info.json` / `updated_persona_info.json`: name -> preference table."""
    path = Path(path)
    data = _expect(read_json(path), dict, path, "an object of name -> {persona_info: {product: {feature: ...}}}")
    out = {}
    for name, record in data.items():
        try:
            out[name] = PersonaTable.from_record(name, record)
        except ValidationError as exc:
            inner = "persona_info" if isinstance(record, dict) and "persona_info" in record else ""
            error = exc.errors()[0]
            loc = [p for p in error["loc"] if p != "products"]
            field = ".".join(str(p) for p in [name, inner, *loc] if p != "")
            raise PahfDataError(f"{path}: {field}: {_message(error)}") from None
    return out


class _BoundNames(ast.NodeTransformer):
    """Replaces each name bound earlier in the module to a literal by that literal, so literal_eval can read it."""

    def __init__(self, bound: dict[str, Any]) -> None:
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.bound:
            return ast.copy_location(ast.Constant(self.bound[node.id]), node)
        return node


def read_literal_module(path: str | Path) -> dict[str, Any]:
    """The names a Python file binds to literals, read with `ast` only: the file is never imported or run.

    Allowed: a docstring, and assignments `NAME = LITERAL` (or `NAME: T = LITERAL`) where the literal may refer to
    names bound earlier, as in the released `prompt_dict = {"Alex": prompt_alex, ...}`. Anything else (an import, a
    call, a function, an f-string, ...) is refused with the file and line.
    """
    path = Path(path)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except OSError as exc:
        raise PahfDataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise PahfDataError(f"{path}: not UTF-8 text") from None
    except SyntaxError as exc:
        raise PahfDataError(f"{path}: line {exc.lineno}: not valid Python ({exc.msg})") from None
    except (ValueError, RecursionError, MemoryError):
        raise PahfDataError(f"{path}: cannot parse as Python") from None
    bound: dict[str, Any] = {}
    for i, stmt in enumerate(tree.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the module docstring
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if not isinstance(target, ast.Name) or value is None:
            raise PahfDataError(
                f"{path}: line {stmt.lineno}: only `NAME = literal` assignments are read, found {type(stmt).__name__}"
                " (the file is parsed, never run)"
            )
        try:
            bound[target.id] = ast.literal_eval(_BoundNames(bound).visit(value))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise PahfDataError(
                f"{path}: line {stmt.lineno}: {target.id} is not a plain literal (calls, imports and expressions "
                "are refused: the file is parsed, never run)"
            ) from None
    return bound


def _personas_from_py(path: Path) -> Any:
    """The released persona module's name -> prompt dict: the last dict it assigns (`prompt_dict`, ...)."""
    dicts = [v for v in read_literal_module(path).values() if isinstance(v, dict)]
    if not dicts:
        raise PahfDataError(f"{path}: unknown format: assigns no dict of name -> persona prompt")
    return dicts[-1]


def load_personas(path: str | Path) -> dict[str, str]:
    """A persona prompt file: name -> prompt. Shopping `*_persona.json`; embodied `personas/*_persona.py` as
    released (see `read_literal_module`) or `personas/*_persona.json`."""
    path = Path(path)
    raw = _personas_from_py(path) if path.suffix == ".py" else read_json(path)
    data = _expect(raw, dict, path, "an object of name -> persona prompt")
    for name, prompt in data.items():
        if not isinstance(prompt, str) or not prompt.strip():
            raise PahfDataError(f"{path}: {name}: expected a non-empty persona prompt string")
    return dict(data)


def load_embodied(path: str | Path) -> list[EmbodiedScenario]:
    """An embodied scenario file: a list of `index, scene, task, context, user, user_intent_*, scene_objects`."""
    path = Path(path)
    rows = _expect(read_json(path), list, path, "a list of embodied scenarios (index, scene, task, user, ...)")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(EmbodiedScenario.model_validate(row))
        except ValidationError as exc:
            raise PahfDataError(f"{path}: {describe(exc, f'[{i}]')}") from None
    return out


def _need(path: Path) -> Path:
    if not path.is_file():
        raise PahfDataError(f"{path}: file not found")
    return path


def load_shopping_dir(directory: str | Path) -> ShoppingData:
    """The shopping folder: phase1-4.json, persona_info.json, updated_persona_info.json, *_persona.json."""
    d = Path(directory)
    if not d.is_dir():
        raise PahfDataError(f"{d}: not a folder")
    return ShoppingData(
        phases={i: load_shopping_phase(_need(d / f"phase{i}.json")) for i in range(1, 5)},
        original=load_persona_tables(_need(d / "persona_info.json")),
        evolved=load_persona_tables(_need(d / "updated_persona_info.json")),
        personas_original=load_personas(_need(d / "original_persona.json")),
        personas_evolved=load_personas(_need(d / "updated_persona.json")),
    )


def persona_file(personas: Path, stem: str) -> Path:
    """`personas/STEM.py` (the released form) when it exists, else `personas/STEM.json`."""
    py, js = personas / f"{stem}.py", personas / f"{stem}.json"
    if py.is_file():
        return py
    if js.is_file():
        return js
    raise PahfDataError(f"{py}: file not found (nor {js.name} beside it)")


def load_embodied_dir(directory: str | Path, variant: Literal["A", "B"] = "A") -> EmbodiedData:
    """The embodied folder: scenarios/{original,evolved}_scenarios_{variant}.json and personas/*_persona.py (or
    .json where there is no .py)."""
    d = Path(directory)
    if not d.is_dir():
        raise PahfDataError(f"{d}: not a folder")
    return EmbodiedData(
        original=load_embodied(_need(d / "scenarios" / f"original_scenarios_{variant}.json")),
        evolved=load_embodied(_need(d / "scenarios" / f"evolved_scenarios_{variant}.json")),
        personas_original=load_personas(persona_file(d / "personas", "original_persona")),
        personas_evolved=load_personas(persona_file(d / "personas", "evolved_persona")),
    )
