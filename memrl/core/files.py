"""Reading a JSON data file so that any failure is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError


def read_json(path: str | Path, error: type[MemrlError] = MemrlError) -> Any:
    """The parsed file; an unreadable file or invalid JSON raises `error` with the path and the cause."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from exc
