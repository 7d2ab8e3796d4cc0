"""Environment references in text: `${NAME}`, or `${NAME:-default}` for a fallback, filled from the environment.

Recipes keep them so that a saved recipe names a secret or a node's address without holding it; printed commands
keep them so that the shell running the command fills them in. Whatever a reference fills in that is secret (by
the variable's name, by the field holding the reference, or by its place in a URL: the userinfo or a query value) is
registered with `memrl.core.secrets`, as are the credentials of every URL a recipe holds, so `redact` hides them in
every message and file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from memrl.core.errors import ConfigError
from memrl.core.secrets import is_secret_name, register, url_credentials, urls
from memrl.core.yamlsafe import safe_load

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
    in_credentials = _credential_refs(text)

    def fill(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = env.get(name)
        if value is not None:
            if is_secret_name(name) or match.start() in in_credentials:
                register(_secret_forms(value, whole=match.group(0) == text))
            return escape(value) if escape is not None else value
        if default is not None:
            return default
        if fallback is not None:
            return fallback
        raise ConfigError(message(name) if message is not None else f"environment variable {name} is not set")

    filled = ENV_REF.sub(fill, text)
    if filled != text:  # a variable holding a whole URL brings its credentials along
        register(url_credentials(filled))
    return filled


def _credential_refs(text: str) -> set[int]:
    """Where in `text` a reference sits in a URL's credentials (its userinfo or a query value), whatever the
    variable is called: `http://user:${JUDGE_AUTH}@host/v1`, `http://host/v1?auth=${JUDGE_AUTH}`."""
    if "://" not in text:
        return set()
    refs = list(ENV_REF.finditer(text))
    numbers = iter(range(len(refs)))
    # Each reference becomes a plain token, so that the URL reads as it will once filled in.
    marked = ENV_REF.sub(lambda _: f"memrlref{next(numbers)}x", text)
    found: set[int] = set()
    for url in urls(marked):
        authority = re.split(r"[/?#]", url.partition("://")[2], maxsplit=1)[0]
        credentials = authority.rpartition("@")[0] + "?" + url.partition("?")[2]
        found |= {refs[int(i)].start() for i in re.findall(r"memrlref(\d+)x", credentials)}
    return found


def _secret_forms(value: str, whole: bool) -> list[str]:
    """`value`, and when it fills a whole recipe value (which is read as YAML) and reads as a list or a mapping, the
    scalars inside it too: a validation error echoes the parsed value (`{'a': 'tok-...'}`), not the text."""
    if not whole or not value.lstrip().startswith(("[", "{")):
        return [value]
    try:
        parsed = safe_load(value)
    except yaml.YAMLError:
        return [value]
    return [value, *_scalars(parsed)]


def _scalars(data: Any) -> list[str]:
    if isinstance(data, dict):
        return [s for v in data.values() for s in _scalars(v)]  # keys name things; values hold them
    if isinstance(data, list):
        return [s for item in data for s in _scalars(item)]
    return [] if data is None else [str(data)]


def register_secrets(data: Any, environ: Mapping[str, str] | None = None, *, secret: bool = False) -> None:
    """Register the secrets of a recipe as written (before substitution): the value of every field whose name is
    secret (`api_key`, `hf_token`, ...) and of every variable such a field references, whatever its name, and the
    credentials of every URL written out in it. (`substitute` registers what references fill into URLs.)"""
    env = os.environ if environ is None else environ
    if isinstance(data, dict):
        for key, value in data.items():
            register_secrets(value, env, secret=secret or (isinstance(key, str) and is_secret_name(key)))
    elif isinstance(data, list):
        for item in data:
            register_secrets(item, env, secret=secret)
    elif isinstance(data, str):
        names = referenced_names(data)
        if secret:
            register([env.get(name) for name in names] if names else [data])
        register(url_credentials(data))  # written into the recipe or an override: `http://user:KEY@host/v1`
