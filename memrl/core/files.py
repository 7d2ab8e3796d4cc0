"""Reading the user's files so that any failure is one line naming the path; writing a file atomically.

Every reader of a file or folder the user names goes through `read_text` / `read_json` / `open_text` /
`list_dir`, so a binary file, a Latin-1 file, a folder where a file belongs or a file where a folder belongs reads
"PATH: not UTF-8 text" / "PATH: not valid JSON (...)" / "PATH: a folder, not a file" / "PATH: not a folder" instead
of a traceback. `describe_os_error` words the same for OS errors the CLI catches last (writes included).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from memrl.core.errors import MemrlError

# What an OS error means for a path the user gave, in their words; strerror for the rest.
_OS_MEANING = {
    errno.ENOENT: "not found",
    errno.EISDIR: "a folder, not a file",
    errno.ENOTDIR: "not a folder (a file stands where a folder is needed)",
    errno.EEXIST: "already exists and is not a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
    errno.ENAMETOOLONG: "name too long",
}


def describe_os_error(exc: OSError, path: str | Path | None = None) -> str:
    """`PATH: what is wrong` for an OS error, PATH being the error's own file name when it has one."""
    where = exc.filename if exc.filename is not None else path
    meaning = _OS_MEANING.get(exc.errno or 0) or exc.strerror or str(exc)
    return f"{os.fsdecode(where)}: {meaning}" if where is not None else meaning


def _not_text(path: Path, exc: UnicodeDecodeError) -> str:
    return f"{path}: not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset {exc.start})"


def read_text(path: str | Path, error: type[MemrlError] = MemrlError) -> str:
    """The file's UTF-8 text; a missing, unreadable or non-text file raises `error` with the path and the cause."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(_not_text(path, exc)) from None
    except OSError as exc:
        raise error(describe_os_error(exc, path)) from None


def read_json(path: str | Path, error: type[MemrlError] = MemrlError) -> Any:
    """The parsed file; an unreadable file, a non-text file or invalid JSON raises `error` with the path and cause."""
    path = Path(path)
    text = read_text(path, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:  # nesting deeper than Python's stack: hostile, not data
        raise error(f"{path}: not valid JSON (nested too deeply)") from None


def read_jsonl(path: str | Path, error: type[MemrlError] = MemrlError) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, read only. A last line without its newline that does not parse is the torn
    write of a killed process and is dropped; any other bad line raises `error` naming `PATH:LINE`."""
    path = Path(path)
    text = read_text(path, error)
    lines = text.splitlines()
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            if n == len(lines) and not text.endswith("\n"):
                break
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise error(f"{path}:{n}: not valid JSON ({why})") from None
        if not isinstance(record, dict):
            raise error(f"{path}:{n}: expected a JSON object, got {type(record).__name__}")
        out.append(record)
    return out


@contextlib.contextmanager
def open_text(path: str | Path, error: type[MemrlError] = MemrlError) -> Iterator[IO[str]]:
    """The file opened for reading UTF-8 text line by line: errors while opening or decoding, raised in the
    `with` body included, become `error` naming the path."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as f:
            yield f
    except UnicodeDecodeError as exc:
        raise error(_not_text(path, exc)) from None
    except OSError as exc:
        raise error(describe_os_error(exc, path)) from None


def list_dir(path: str | Path, error: type[MemrlError] = MemrlError) -> list[Path]:
    """The entries of a folder, sorted; a missing folder or a file in its place raises `error` naming the path."""
    path = Path(path)
    if not path.is_dir():
        raise error(f"{path}: {'not a folder' if path.exists() else 'not found'}")
    try:
        return sorted(path.iterdir())
    except OSError as exc:
        raise error(describe_os_error(exc, path)) from None


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
