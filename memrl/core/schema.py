"""Pydantic bases: typed configs reject unknown keys and absurd numbers; models of released data ignore extra keys.
And the checks that fail in one line a user can act on: pydantic validation errors (the dotted key, what was
expected, what was given), a data file's text values, and train and eval splits that share an item."""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import PurePath
from typing import Annotated, Any, TypeVar, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from memrl.core.errors import ConfigError, MemrlError, closest

# No count, size, budget, weight or duration a config holds comes near 2**31; a value past it is a typo or hostile
# (`max_tokens: 1e20`, `max_retries: 99999999999` retries for ever) and overflows the C code it reaches.
MAX_NUMBER = 2**31 - 1
MAX_SEED = 2**32 - 1  # NumPy's seed range (transformers' set_seed seeds NumPy); torch and vLLM take it too


def number_problem(value: Any, name: str = "") -> str | None:
    """Why `value` is no sane config number (NaN, infinite, beyond MAX_NUMBER, a seed outside 0..MAX_SEED), else
    None. Booleans and non-numbers pass: their type is the field's concern."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if name == "seed" and not 0 <= value <= MAX_SEED:
        return f"{value} is outside the seed range 0..{MAX_SEED}"
    if name != "seed" and abs(value) > MAX_NUMBER:
        shown = value if isinstance(value, int) and value < 10**30 else f"{value:.4g}"
        return f"{shown} is too large (at most {MAX_NUMBER} in size)"
    return None


# A name that becomes a folder (a stage's, a run's): letters, digits, '.', '_' and '-', no path of any kind.
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def plain_name_problem(value: str) -> str | None:
    """Why `value` is no plain name (see _PLAIN; not '.' nor '..'), else None."""
    if _PLAIN.fullmatch(value) and value not in (".", ".."):
        return None
    return f"{value[:60]!r} is not a plain name (letters, digits, '.', '_', '-'; up to 100): it names a folder"


def _plain_name(value: str) -> str:
    if problem := plain_name_problem(value):
        raise PydanticCustomError("config_field", "{problem}", {"problem": problem})
    return value


# The name of a folder a run or a stage writes in, inside the run folder.
PlainName = Annotated[str, AfterValidator(_plain_name)]


def _file_name(value: str) -> str:
    # A stage writes its outputs inside its own folder: `../x` or `/tmp/x` would write outside the run folder.
    if not value.strip() or value in (".", "..") or "/" in value or "\\" in value or "\0" in value:
        problem = f"expected a file name inside the stage's folder, got {value!r}"
        raise PydanticCustomError("config_field", "{problem}", {"problem": problem})  # describe_error names the key
    return value


# The name of a file a stage writes in its own folder.
FileName = Annotated[str, AfterValidator(_file_name)]


class StrictModel(BaseModel):
    """Base of every typed config: unknown keys fail validation instead of being ignored; NaN, infinities and
    numbers too large for any real setting fail too (see `number_problem`), and so do `true`/`false` where a number
    belongs (pydantic would read `seed: true` as 1) and text holding a NUL (no path or name can)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        for name, value in data.items() if isinstance(data, dict) else ():
            field = cls.model_fields.get(name)
            if isinstance(value, bool) and field is not None and _numeric(field.annotation):
                problem = f"expected a number, got {str(value).lower()}"
                raise PydanticCustomError("config_number", "{field}: {problem}", {"field": name, "problem": problem})
        return data

    @model_validator(mode="after")
    def _sane_numbers(self) -> StrictModel:
        for name in type(self).model_fields:
            value = getattr(self, name)
            for item in value if isinstance(value, list | tuple) else (value,):
                problem = number_problem(item, name)
                if isinstance(item, str | PurePath) and "\0" in str(item):
                    problem = "holds a NUL character, which no name, path or text here may hold"
                if problem:  # validation.describe_error puts its dotted key first
                    raise PydanticCustomError(
                        "config_number", "{field}: {problem}", {"field": name, "problem": problem}
                    )
        return self


def _numeric(annotation: Any) -> bool:
    """Whether a field holds a number (int or float, maybe optional), and not a boolean too."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    kinds = {a for a in args if a is not type(None)} or {annotation}
    while len(kinds) == 1 and typing.get_origin(next(iter(kinds))) is typing.Annotated:
        kinds = {typing.get_args(next(iter(kinds)))[0]}
    return bool(kinds) and kinds <= {int, float} and bool not in kinds


class LenientModel(BaseModel):
    """Reads released data that carries extra keys: keys the model does not name are ignored, not rejected."""

    model_config = ConfigDict(extra="ignore")


# --- one-line checks -------------------------------------------------------------------------------------------------

Key = str | int
T = TypeVar("T")


def as_text(value: Any, what: str) -> str:
    """A value read from a data file as text: a string, or a number written as one (a benchmark's answer `42`).
    null, booleans, lists and objects raise ValueError naming `what`: `str()` would make a question of "None"."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    kind = "null" if value is None else type(value).__name__.replace("dict", "an object").replace("list", "a list")
    raise ValueError(f"{what} must be text, got {kind}")


def describe_error(exc: ValidationError, root: type[BaseModel]) -> str:
    """The first error as one line naming its dotted key (`unknown key 'a.b' (did you mean 'c'?)`), then a count."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    shown, parent = _walk(root, loc[:-1])
    if first["type"] == "extra_forbidden" and loc:
        key = str(loc[-1])
        where = ".".join([*shown, key])
        hint = did_you_mean(key, list(parent.model_fields)) if parent is not None else ""
        line = f"unknown key {where!r}{hint}"
    elif first["type"] == "config_number":  # a model's own error: its location is the model, union tags dropped
        line = _explain(first, ".".join(_walk(root, loc)[0]) or "(top level)")
    else:
        where = ".".join([*shown, *(map(str, loc[-1:]) if loc else [])]) or "(top level)"
        line = _explain(first, where)
    more = len(errors) - 1
    return line + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def describe_any(exc: ValidationError) -> str:
    """One line for a validation error whose schema the caller does not know: the model, the dotted key, the cause."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = ".".join(map(str, first["loc"])) or "(top level)"
    more = len(errors) - 1
    line = f"{exc.title}: {_explain(first, where)}"
    return line + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def _explain(error: Any, where: str) -> str:
    kind, msg = error["type"], error["msg"]
    if kind == "missing":
        return f"required key {where!r} is missing"
    if kind == "config_number":  # raised by a model, not a field: `where` is the model's key
        return f"{where}.{msg}" if where != "(top level)" else msg
    if kind == "config_field":  # a field's own check (schema.FileName): the message leaves the key to us
        return f"{where}: {msg}"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    ctx = error.get("ctx", {})
    if kind == "union_tag_not_found":
        return f"required key '{where}.{ctx['discriminator'].strip(chr(39))}' is missing"
    if kind == "union_tag_invalid":
        return (
            f"{where}.{ctx['discriminator'].strip(chr(39))}: expected one of {ctx['expected_tags']}, got {ctx['tag']!r}"
        )
    expected = msg.removeprefix("Input should be ")
    return f"{where}: expected {expected}, got {error['input']!r}"


def _walk(root: type[BaseModel], loc: tuple[Key, ...]) -> tuple[list[str], type[BaseModel] | None]:
    """Follow a pydantic error location through the schema; drop union tags from the displayed path."""
    shown: list[str] = []
    node: Any = root
    i = 0
    while i < len(loc):
        node = _unwrap(node)
        part = loc[i]
        if isinstance(node, type) and issubclass(node, BaseModel):
            info = node.model_fields.get(str(part))
            node = info.annotation if info is not None else None
            shown.append(str(part))
        elif typing.get_origin(node) in (dict, list):
            node = typing.get_args(node)[-1]
            shown.append(str(part))
        elif _is_union(node):
            member = _union_member(node, part)
            if member is None:
                return shown, None
            node = member
        else:
            return shown, None
        i += 1
    node = _unwrap(node)
    if _is_union(node):
        models = [m for m in typing.get_args(node) if isinstance(m, type) and issubclass(m, BaseModel)]
        node = models[0] if len(models) == 1 else None
    return shown, node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _unwrap(node: Any) -> Any:
    while typing.get_origin(node) is typing.Annotated:
        node = typing.get_args(node)[0]
    return node


def _is_union(node: Any) -> bool:
    return typing.get_origin(node) in (Union, types.UnionType)


def _union_member(node: Any, tag: Key) -> Any:
    """The union member whose Literal discriminator equals `tag` (pydantic puts the tag in the location)."""
    for member in typing.get_args(node):
        if isinstance(member, type) and issubclass(member, BaseModel):
            for info in member.model_fields.values():
                if typing.get_origin(info.annotation) is typing.Literal and tag in typing.get_args(info.annotation):
                    return member
    return None


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """' (did you mean X?)' for the option nearest a mistyped word, else ''."""
    match = closest(word, options)
    return f" (did you mean {match!r}?)" if match else ""


def check_disjoint(
    train: Iterable[T],
    eval_: Iterable[T],
    *,
    key: Callable[[T], Hashable] | Sequence[Callable[[T], Hashable]],
    message: str,
    label: Callable[[T], Any] | None = None,
    error: type[MemrlError] = ConfigError,
) -> None:
    """Raise `error` in one line when an eval item is also in train.

    An eval item is in train when one of its keys (`key`: one function, or several for several identities such as an
    id and a normalized text) equals the same key of a train item. The shared items are named by `label` (default:
    the first key), once each and sorted; `message` is a format string over `n` (how many), `example` (the first)
    and `shared` (all, comma-separated).
    """
    keys = [key] if callable(key) else list(key)
    train_keys: list[set[Hashable]] = [set() for _ in keys]
    for item in train:
        for known, k in zip(train_keys, keys, strict=True):
            known.add(k(item))
    name: Callable[[T], Any] = label or keys[0]
    shared = sorted(
        {name(item) for item in eval_ if any(k(item) in known for k, known in zip(keys, train_keys, strict=True))}
    )
    if shared:
        raise error(message.format(n=len(shared), example=shared[0], shared=", ".join(map(str, shared))))
