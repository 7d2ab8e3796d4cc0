"""Checks that fail in one line a user can act on: pydantic validation errors (the dotted key, what was expected,
what was given), a data file's text values, and train and eval splits that share an item."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar, Union

from pydantic import BaseModel, ValidationError

from memrl.core.errors import ConfigError, MemrlError, closest

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
