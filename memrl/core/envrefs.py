"""Environment references in text: `${NAME}`, or `${NAME:-default}` for a fallback, filled from the environment.

Recipes keep them so that a saved recipe names a secret or a node's address without holding it; printed commands
keep them so that the shell running the command fills them in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from memrl.core.errors import ConfigError

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
            return escape(value) if escape is not None else value
        if default is not None:
            return default
        if fallback is not None:
            return fallback
        raise ConfigError(message(name) if message is not None else f"environment variable {name} is not set")

    return ENV_REF.sub(fill, text)
