"""CLI commands generated from a config model: one flag per field, named and described by the field.

A field `max_in_flight` is `--max-in-flight`, its help is the field's description and its default the model's; a
model role (a `ModelConfig` field) takes `NAME` (served locally) or `NAME@URL` (an OpenAI-compatible endpoint);
nested sections (sampling) are recipe keys only, unless a `Flag` exposes one of their values. Only the flags the
user gives reach the model, so every default lives in one place: the config model.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from rich.console import Console

from memrl.app.actions import Action
from memrl.app.context import redact_console
from memrl.core import interrupts
from memrl.core.errors import ConfigError
from memrl.core.files import describe_kind
from memrl.core.schema import describe_error, number_problem
from memrl.core.secrets import redact_logs
from memrl.rollout.config import HFModelConfig, OpenAIModelConfig, VLLMModelConfig, model_from_spec

MODEL_HELP = "NAME (served locally) or NAME@URL (an OpenAI-compatible endpoint)"
ROLE_TYPES = (HFModelConfig, OpenAIModelConfig, VLLMModelConfig)

Spec = dict[str, Any]


@dataclass(frozen=True)
class Flag:
    """A flag that is not one of the config's fields: `apply(spec, value, model)` folds a given value into the raw
    config before it is validated (see `set_nested`)."""

    name: str  # python name; the flag is --name-with-dashes
    annotation: Any
    help: str
    apply: Callable[[Spec, Any, type[BaseModel]], None]


def set_nested(spec: Spec, model: type[BaseModel], path: str, value: Any) -> None:
    """Set `a.b.c` in the raw spec, starting a section from the model's default (so its other defaults hold)."""
    head, _, rest = path.partition(".")
    if not rest:
        spec[head] = value
        return
    if head not in spec:
        default = model.model_fields[head].get_default(call_default_factory=True)
        spec[head] = default.model_dump() if isinstance(default, BaseModel) else {}
    sub = model.model_fields[head].annotation
    assert isinstance(sub, type) and issubclass(sub, BaseModel), path
    set_nested(spec[head], sub, rest, value)


def in_flight(spec: Spec, model: type[BaseModel]) -> int:
    """The requests in flight the run will allow: an endpoint given as NAME@URL gets that concurrency."""
    info = model.model_fields.get("max_in_flight")
    return int(spec.get("max_in_flight", info.default if info is not None else 32))


def _strip(annotation: Any) -> Any:
    """The plain type: Annotated metadata and Optional removed (every flag is optional: unset keeps the default)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _strip(args[0]) if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
    if typing.get_origin(annotation) is list:  # a repeatable flag: `--ks 1 --ks 5`
        return list[_strip(typing.get_args(annotation)[0])]  # type: ignore[misc]
    return annotation


def _is_role(plain: Any) -> bool:
    members = typing.get_args(plain) if typing.get_origin(plain) in (Union, types.UnionType) else (plain,)
    return any(m in ROLE_TYPES for m in members)


def _choices(plain: Any) -> list[str]:
    if typing.get_origin(plain) is typing.Literal:
        return [str(c) for c in typing.get_args(plain)]
    if isinstance(plain, type) and issubclass(plain, enum.Enum):
        return [str(member.value) for member in plain]
    return []


def _is_section(plain: Any) -> bool:
    return isinstance(plain, type) and issubclass(plain, BaseModel)


def _shown_default(info: FieldInfo) -> str | bool:
    default = info.get_default(call_default_factory=True)
    if default is None or default is PydanticUndefined:
        return False
    if isinstance(default, enum.Enum):
        return str(default.value)
    if isinstance(default, ROLE_TYPES):
        return default.model
    return str(default)


def sane_number(param: typer.CallbackParam, value: Any) -> Any:
    """Callback of every numeric flag: NaN, infinities and absurd sizes (`--timeout inf`, `--max-tokens 1e20`,
    `--seed -1`) are a usage error naming the flag, as a config file's would be (`schema.number_problem`)."""
    for item in value if isinstance(value, list | tuple) else (value,):
        if problem := number_problem(item, param.name or ""):
            raise typer.BadParameter(problem)
    return value


def plain_path(value: Any) -> Any:
    """Callback of every path flag: a FIFO, a device or a socket is refused before anything opens it (opening a FIFO
    waits for a writer for ever; a device reads without end), in words that say what it is."""
    for item in value if isinstance(value, list | tuple) else (value,):
        if isinstance(item, Path) and item.exists() and not (item.is_file() or item.is_dir()):
            raise typer.BadParameter(f"{item}: {describe_kind(item)}, not a file nor a folder")
    return value


_CHECKS = {int: sane_number, float: sane_number, Path: plain_path}


def _option(name: str, annotation: Any, help_: str, *, required: bool, shown: str | bool) -> inspect.Parameter:
    flag = "--" + name.replace("_", "-")
    item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
    check: dict[str, Any] = {"callback": _CHECKS[item]} if item in _CHECKS else {}
    option = typer.Option(flag, help=help_, show_default=False if required else shown, **check)
    default = ... if required else None
    hint = annotation if required else annotation | None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[hint, option])


def config_command(
    action: Action[Any],
    *,
    flags: Sequence[Flag] = (),
    skip: Sequence[str] = (),
    rename: dict[str, str] | None = None,
) -> Callable[..., None]:
    """A typer command for `action`: `--out`, flags from its config's fields, and `flags`; the summary `action.run`
    returns goes to stdout as JSON, everything else to stderr."""
    model = action.config
    rename = rename or {}
    params = [_option("out", Path, "output folder", required=True, shown=False)]
    fields: dict[str, str] = {}  # flag name -> field
    roles: set[str] = set()
    for field, info in model.model_fields.items():
        plain = _strip(info.annotation)
        if field in skip or (_is_section(plain) and not _is_role(plain)):
            continue
        name = rename.get(field, field)
        fields[name] = field
        help_ = info.description or ""
        if _is_role(plain):
            roles.add(field)
            plain, help_ = str, f"{help_ or field}: {MODEL_HELP}"
        elif choices := _choices(plain):
            # pydantic checks the value and says what is wrong in one line; typer would print a usage box
            plain = str
            if " | " not in help_:  # descriptions often list the choices already
                help_ = f"{help_} ({' | '.join(choices)})".lstrip()
        params.append(_option(name, plain, help_, required=info.is_required(), shown=_shown_default(info)))
    for flag in flags:
        params.append(_option(flag.name, flag.annotation, flag.help, required=False, shown=False))
    console = Console(stderr=True)
    redact_console(console)  # an action's lines may quote a URL with credentials ("session failed: ...")

    def command(**values: Any) -> None:
        redact_logs()
        given = {n: v for n, v in values.items() if v is not None and v != [] and v != ()}  # unset repeatables: empty
        spec: Spec = {fields[n]: list(v) if isinstance(v, tuple) else v for n, v in given.items() if n in fields}
        concurrency = in_flight(spec, model)
        spec |= {field: model_from_spec(spec[field], concurrency) for field in roles & spec.keys()}
        for flag in flags:
            if values[flag.name] is not None:
                flag.apply(spec, values[flag.name], model)
        try:
            cfg = model.model_validate(spec)
        except ValidationError as exc:
            raise ConfigError(describe_error(exc, model)) from None
        # A stopped command resumes when run again: what finished is in --out, and only what did not runs then.
        hint = f"the same command (what finished is kept in {values['out']})"
        # libraries print on import; stdout is the summary alone
        with contextlib.redirect_stdout(sys.stderr), interrupts.resume_hint(hint):
            summary = action.run(cfg, values["out"], console)
        typer.echo(json.dumps(summary))

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = action.help
    return command


def client_flags(roles: Sequence[str]) -> list[Flag]:
    """--request-timeout / --max-retries for every model role given as NAME@URL."""

    def setter(key: str) -> Callable[[Spec, Any, type[BaseModel]], None]:
        def apply(spec: Spec, value: Any, model: type[BaseModel]) -> None:
            for role in roles:
                if isinstance(spec.get(role), OpenAIModelConfig):
                    spec[role] = spec[role].model_copy()
                    setattr(spec[role], key, value)  # an assignment is validated: the config's bounds hold

        return apply

    return [
        Flag("request_timeout", float, "seconds per request to a NAME@URL endpoint (default 120)", setter("timeout")),
        Flag("max_retries", int, "retries with backoff per NAME@URL request (default 4)", setter("max_retries")),
    ]


def nested_flag(name: str, annotation: Any, help_: str, path: str) -> Flag:
    """A flag for one value of a nested section, e.g. `--max-tokens` for `sampling.agent.max_tokens`."""
    return Flag(name, annotation, help_, lambda spec, value, model: set_nested(spec, model, path, value))
