"""The CLI's one error path: what escaped a command, as the one line `memrl: error: ...` a user can act on.

Errors of the user's input (memrl's own, typer's usage errors, files that are not text or not JSON, paths that
cannot be read or written, values that fail validation) become one line; anything else is a bug and keeps its
traceback. `--debug` shows the traceback of both.
"""

from __future__ import annotations

import json
import os

import typer
from pydantic import ValidationError

from memrl.core.errors import MemrlError
from memrl.core.files import describe_os_error
from memrl.core.secrets import redact
from memrl.core.validation import describe_any


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
