"""Pydantic bases: typed configs reject unknown keys and absurd numbers; models of released data ignore extra keys."""

from __future__ import annotations

import math
import re
import types
import typing
from pathlib import PurePath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

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
