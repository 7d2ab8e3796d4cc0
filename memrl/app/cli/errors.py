"""The CLI's one error path: what escaped a command, as the one line `memrl: error: ...` a user can act on.

Errors of the user's input (memrl's own, typer's usage errors, files that are not text or not JSON, paths that
cannot be read or written, values that fail validation) become one line; anything else is a bug and keeps its
traceback. `--debug` shows the traceback of both. Line and traceback alike are redacted (`memrl.core.secrets`): an
exception's message may quote a key, a URL with credentials or the value of a `${VAR}`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from types import TracebackType

import typer
import typer.main
import yaml
from pydantic import ValidationError

from memrl.core.errors import MemrlError
from memrl.core.files import describe_os_error
from memrl.core.schema import describe_any
from memrl.core.secrets import redact
from memrl.core.yamlsafe import describe_yaml_error


def user_error(exc: BaseException) -> str | None:
    """The one line for an error the user's input caused, or None for a bug."""
    match exc:
        case MemrlError():
            line = str(exc)
        case typer.TyperException():  # usage errors: a bad flag, a value out of range, a missing option
            line = exc.format_message()
        case UnicodeDecodeError():  # a reader that names no path; readers of user files name theirs (core.files)
            line = f"an input file is not UTF-8 text ({exc.reason} at offset {exc.start})"
        case json.JSONDecodeError():
            line = f"an input file is not valid JSON ({exc.msg}, line {exc.lineno})"
        case yaml.MarkedYAMLError():  # text that failed to parse, read by a reader that names no input
            line = f"an input is not valid YAML ({describe_yaml_error(exc)})"  # no snippet: it may be a secret
        case OSError():
            line = describe_os_error(exc) + _under_cache(exc.filename)
        case ValidationError():
            line = describe_any(exc)
        case _:
            return None
    return redact(" ".join(part.strip() for part in line.splitlines() if part.strip()) or type(exc).__name__)


def _under_cache(filename: object) -> str:
    """Names $MEMRL_CACHE when the failing path lies in it: the user set that folder, not the path below it."""
    cache = os.environ.get("MEMRL_CACHE")
    if not cache or not isinstance(filename, str | bytes | os.PathLike):
        return ""
    path = os.path.abspath(os.fsdecode(filename))
    root = os.path.abspath(cache)
    return f" (MEMRL_CACHE={cache})" if path == root or path.startswith(root + os.sep) else ""


def print_redacted(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """`sys.excepthook` that prints the traceback (`--debug`, or a bug's) with every known secret masked."""
    sys.stderr.write(redact("".join(traceback.format_exception(kind, exc, tb))))


def redact_tracebacks() -> None:
    """Print every uncaught exception's traceback through `print_redacted`: this process's hook, and the hook typer
    installs while a command runs, which hands plain tracebacks to the one it found when typer was imported."""
    sys.excepthook = print_redacted
    typer.main._original_except_hook = print_redacted


redact_tracebacks()  # the `memrl` command imports this module before it runs anything
