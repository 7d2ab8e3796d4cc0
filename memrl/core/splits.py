"""Train and eval splits must not share an item: one check, with each caller's key and message."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

from memrl.core.errors import ConfigError, MemrlError

T = TypeVar("T")


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
