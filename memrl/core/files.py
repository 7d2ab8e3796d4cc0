"""Reading a JSON data file so that any failure is one line naming the file; writing a file atomically."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

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


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[str]]:
    """A text file to write that appears under `path` only once complete: it is written to a hidden temporary file
    beside it, synced, then renamed over `path`, so a crash never leaves half a file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (see `atomic_writer`); returns the path."""
    with atomic_writer(path) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write `data` as UTF-8 JSON (non-ASCII kept as is) with a final newline, atomically; returns the path."""
    return atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
