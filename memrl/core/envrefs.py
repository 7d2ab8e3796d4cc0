"""Environment references in text: `${NAME}`, or `${NAME:-default}` for a fallback, filled from the environment.

Recipes keep them so that a saved recipe names a secret or a node's address without holding it; printed commands
keep them so that the shell running the command fills them in. Whatever a reference fills in that is secret (by
the variable's name, or by the field holding the reference) is registered with `memrl.core.secrets`, so `redact`
hides it in every message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.secrets import is_secret_name, register

# Group 1 is the name; group 2 the default after `:-`, None when there is none (an empty default is "").
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def referenced_names(text: str) -> list[str]:
    """The names `text` refers to, each once, in order of first appearance."""
    return list(dict.fromkeys(m.group(1) for m in ENV_REF.finditer(text)))


def substitute(
    text: str,
    environ: Mapping[str, str] | None = None,
    *,
    fallback: str | None = None,
    message: Callable[[str], str] | None = None,
    escape: Callable[[str], str] | None = None,
) -> str:
    """`text` with each reference filled in from `environ` (default: os.environ).

    A set variable wins, even when empty, and is written through `escape` (say, to fit inside a JSON string); an
    unset one takes its own default as written, else `fallback`. With neither, ConfigError is raised with
    `message(name)`, by default "environment variable NAME is not set".
    """
    env = os.environ if environ is None else environ

    def fill(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = env.get(name)
        if value is not None:
            if is_secret_name(name):
                register([value])
            return escape(value) if escape is not None else value
        if default is not None:
            return default
        if fallback is not None:
            return fallback
        raise ConfigError(message(name) if message is not None else f"environment variable {name} is not set")

    return ENV_REF.sub(fill, text)


def register_secrets(data: Any, environ: Mapping[str, str] | None = None, *, secret: bool = False) -> None:
    """Register the secrets of a recipe as written (before substitution): the value of every field whose name is
    secret (`api_key`, `hf_token`, ...) and of every variable such a field references, whatever its name."""
    env = os.environ if environ is None else environ
    if isinstance(data, dict):
        for key, value in data.items():
            register_secrets(value, env, secret=secret or (isinstance(key, str) and is_secret_name(key)))
    elif isinstance(data, list):
        for item in data:
            register_secrets(item, env, secret=secret)
    elif secret and isinstance(data, str):
        names = referenced_names(data)
        register([env.get(name) for name in names] if names else [data])
