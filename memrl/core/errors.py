"""Errors a user can act on: the CLI prints their message as one line and exits non-zero."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from memrl.core.secrets import redact


class MemrlError(Exception):
    """Base of every error whose message is meant for the user, not a traceback."""

    def __str__(self) -> str:
        # Messages quote URLs, commands and config values: a secret inside one must not reach the user or a log.
        return redact(super().__str__())


class ConfigError(MemrlError):
    """A recipe or override is malformed, names an unknown key, or has a value of the wrong type."""


class ModelNotFoundError(MemrlError):
    """A model name is neither registered, nor a local path, nor loadable from a reachable hub."""


class BackendError(MemrlError):
    """An LLM backend could not answer: endpoint unreachable, timed out, or refused after retries."""


def closest(word: str, options: Iterable[str], cutoff: float = 0.5) -> str | None:
    """The option nearest to a mistyped `word`, for "did you mean ...?" hints."""
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return match[0] if match else None


# Terminal colour and cursor codes: libraries (Ray) colour their messages; in a one-line error they are noise.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line, without terminal codes (the type name when it has none)."""
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
