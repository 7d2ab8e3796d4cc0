"""Errors a user can act on: the CLI prints their message as one line and exits non-zero."""

from __future__ import annotations


class MemrlError(Exception):
    """Base of every error whose message is meant for the user, not a traceback."""


class ConfigError(MemrlError):
    """A recipe or override is malformed, names an unknown key, or has a value of the wrong type."""


class ModelNotFoundError(MemrlError):
    """A model name is neither registered, nor a local path, nor loadable from a reachable hub."""


class BackendError(MemrlError):
    """An LLM backend could not answer: endpoint unreachable, timed out, or refused after retries."""
