"""Reading one JSON row of a record file, value by value: each checked for its kind, a wrong or missing one is one
ConfigError line, `WHERE: RECORD's `KEY` must be KIND, got JSON-TYPE` (`where`: `PATH:LINE`, or which row of a run).

The one reader of memrl's typed records (envs/collab/records.py, envs/tod/records.py, envs/pahf/records.py,
data_gen/judger_pairs.py): a record's `from_dict`
says which keys it needs and reads each value through these methods; a key with a default may be absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import json_type

_ABSENT: Any = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or _is_int(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _all(value: Any, kind: type, each: Callable[[Any], bool]) -> bool:
    """Whether `value` is a `kind` (list or dict) whose items (a dict's values) all pass `each`."""
    items = value.values() if isinstance(value, dict) else value
    return isinstance(value, kind) and all(each(v) for v in items)


class RowReader:
    """The values of `row`, a `record` (its name in the messages) read at `where`."""

    def __init__(self, row: Mapping[str, Any], where: str, record: str) -> None:
        self.row, self.where, self.record = row, where, record

    def require(self, keys: Iterable[str]) -> None:
        """Refuse the row when any of `keys` is absent, naming them all."""
        missing = [k for k in keys if k not in self.row]
        if missing:
            raise ConfigError(f"{self.where}: {self.record} lacks {', '.join(missing)}")

    def _get(self, key: str, default: Any, ok: bool, kind: str) -> Any:
        value = self.row.get(key, _ABSENT)
        if value is _ABSENT:
            if default is _ABSENT:
                raise ConfigError(f"{self.where}: {self.record} lacks {key}")
            return default
        if not ok:
            raise ConfigError(f"{self.where}: {self.record}'s `{key}` must be {kind}, got {json_type(value)}")
        return value

    def text(self, key: str, default: str = _ABSENT) -> str:
        return str(self._get(key, default, isinstance(self.row.get(key), str), "text"))

    def optional_text(self, key: str) -> str | None:
        """Text, or None where the row holds null or lacks the key."""
        return None if self.row.get(key) is None else self.text(key)

    def integer(self, key: str, default: int = _ABSENT) -> int:
        return int(self._get(key, default, _is_int(self.row.get(key)), "an integer"))

    def optional_integer(self, key: str) -> int | None:
        """An integer, or None where the row holds null or lacks the key."""
        return None if self.row.get(key) is None else self.integer(key)

    def number(self, key: str, default: float = _ABSENT) -> float:
        return float(self._get(key, default, _is_number(self.row.get(key)), "a number"))

    def optional_number(self, key: str) -> float | None:
        """A number, or None where the row holds null or lacks the key."""
        return None if self.row.get(key) is None else self.number(key)

    def flag(self, key: str, default: bool = _ABSENT) -> bool:
        return bool(self._get(key, default, isinstance(self.row.get(key), bool), "true or false"))

    def texts(self, key: str, default: Iterable[str] = _ABSENT) -> tuple[str, ...]:
        return tuple(self._get(key, default, _all(self.row.get(key), list, _is_text), "a list of texts"))

    def text_lists(self, key: str) -> tuple[tuple[str, ...], ...]:
        ok = _all(self.row.get(key), list, lambda v: _all(v, list, _is_text))
        return tuple(tuple(v) for v in self._get(key, _ABSENT, ok, "a list of lists of texts"))

    def object(self, key: str, default: Mapping[str, Any] = _ABSENT) -> dict[str, Any]:
        return dict(self._get(key, default, isinstance(self.row.get(key), dict), "an object"))

    def optional_object(self, key: str) -> dict[str, Any] | None:
        """An object, or None where the row holds null or lacks the key."""
        return None if self.row.get(key) is None else self.object(key)

    def counts(self, key: str, default: Mapping[str, int] = _ABSENT) -> dict[str, int]:
        return dict(self._get(key, default, _all(self.row.get(key), dict, _is_int), "an object of counts"))

    def texts_by(self, key: str) -> dict[str, str]:
        """An object whose values are texts."""
        return dict(self._get(key, _ABSENT, _all(self.row.get(key), dict, _is_text), "an object of texts"))

    def flags_by(self, key: str) -> dict[str, bool]:
        """An object whose values are true or false."""
        ok = _all(self.row.get(key), dict, lambda v: isinstance(v, bool))
        return dict(self._get(key, _ABSENT, ok, "an object of true/false"))

    def objects(self, key: str, texts: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
        """A list of objects, each holding text under every key of `texts`; copied."""
        kind = "a list of objects" + (f", each with {' and '.join(texts)} as text" if texts else "")
        return self._objects(key, texts, _ABSENT, kind)

    def turns(
        self, key: str, texts: tuple[str, str], default: Iterable[dict[str, Any]] = _ABSENT
    ) -> tuple[dict[str, Any], ...]:
        """A list of turns, each an object whose two `texts` keys (who, what) hold text; copied."""
        return self._objects(key, texts, default, f"a list of turns, each with {texts[0]} and {texts[1]} as text")

    def _objects(self, key: str, texts: tuple[str, ...], default: Any, kind: str) -> tuple[dict[str, Any], ...]:
        ok = _all(self.row.get(key), list, lambda v: isinstance(v, dict) and all(_is_text(v.get(k)) for k in texts))
        return tuple(dict(v) for v in self._get(key, default, ok, kind))

    def one_of(self, key: str, allowed: tuple[Any, ...]) -> Any:
        value = self._get(key, _ABSENT, True, "")
        if value not in allowed or isinstance(value, bool):
            shown = " or ".join(map(repr, allowed))
            raise ConfigError(f"{self.where}: {self.record}'s `{key}` must be {shown}, got {value!r}")
        return value
