"""Reading the user's files so that any failure is one line naming the path; writing a file atomically, or a line at
a time so that a killed run resumes.

Every reader of a file or folder the user names goes through `read_text` / `read_json` / `open_text` /
`list_dir`, so a binary file, a Latin-1 file, a folder where a file belongs or a file where a folder belongs reads
"PATH: not UTF-8 text" / "PATH: not valid JSON (...)" / "PATH: a folder, not a file" / "PATH: not a folder" instead
of a traceback. What a path is gets checked before it is opened (`check_file`, `describe_kind`): a FIFO would block
the read for ever, a device or a sparse file of GBs would exhaust memory. `describe_os_error` words the same for OS
errors the CLI catches last (writes included; `naming` gives a failed `write` the name of its file).
A whole file appears under its name only once complete (`atomic_writer`); `ResumableJsonl` appends one whole line
at a time and survives a killed process (a torn last line is dropped).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from memrl.core.errors import MemrlError

log = logging.getLogger(__name__)

# Whole-file reads: user inputs memrl reads whole are KB to tens of MB; a sparse file of GBs would exhaust memory.
MAX_TEXT_BYTES = 512 * 2**20
_HEAD = 8192  # bytes looked at for a NUL before a file is read line by line

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
    errno.EFBIG: "file too large (a size limit of the file system or the process)",
    errno.EDQUOT: "disk quota exceeded",
}


def describe_os_error(exc: OSError, path: str | Path | None = None) -> str:
    """`PATH: what is wrong` for an OS error, PATH being the error's own file name when it has one."""
    where = exc.filename if exc.filename is not None else path
    meaning = _OS_MEANING.get(exc.errno or 0) or exc.strerror or str(exc)
    return f"{os.fsdecode(where)}: {meaning}" if where is not None else meaning


def describe_kind(path: str | Path) -> str:
    """What stands at `path`, in words: "a file", "a folder", "a FIFO (named pipe)", "a socket", "a character
    device", "a block device", "a broken symbolic link", "not found", or why it cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "not found"
    except OSError as exc:
        return _OS_MEANING.get(exc.errno or 0) or exc.strerror or str(exc)
    return next((words for is_kind, words in _KINDS if is_kind(mode)), "not a file nor a folder")


_KINDS = (
    (stat.S_ISREG, "a file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_file(path: str | Path, error: type[MemrlError] = MemrlError, limit: int | None = None) -> None:
    """Raise `error` unless `path` is a regular file (of at most `limit` bytes): checked before opening, since
    opening a FIFO waits for a writer forever and reading a device or a sparse file of GBs exhausts memory."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise error(describe_os_error(exc, path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: {describe_kind(path)}, not a file")
    if limit is not None and st.st_size > limit:
        raise error(f"{path}: {_size(st.st_size)} is too large to read (at most {_size(limit)})")


def check_folder(path: str | Path, error: type[MemrlError] = MemrlError) -> None:
    """Raise `error` unless `path` is a folder, saying what it is instead ("not found", "a FIFO (named pipe)")."""
    if not os.path.isdir(path):
        kind = describe_kind(path)
        raise error(f"{path}: {_NOT_A_FOLDER.get(kind, f'{kind}, not a folder')}")


_NOT_A_FOLDER = {"a file": "not a folder", "not found": "not found"}


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def _not_text(path: Path, exc: UnicodeDecodeError) -> str:
    return f"{path}: not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset {exc.start})"


def _binary(path: Path, offset: int) -> str:
    # NUL is valid UTF-8, but no text a user hands memrl holds one: a binary file, or a zero-filled one.
    return f"{path}: not UTF-8 text (binary: a NUL character at offset {offset})"


def read_text(path: str | Path, error: type[MemrlError] = MemrlError, limit: int = MAX_TEXT_BYTES) -> str:
    """The file's UTF-8 text; a missing, unreadable, non-text or larger than `limit` file, or something other than
    a file, raises `error` with the path and the cause."""
    path = Path(path)
    check_file(path, error, limit)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(_not_text(path, exc)) from None
    except OSError as exc:
        raise error(describe_os_error(exc, path)) from None
    if (nul := text.find("\0")) >= 0:
        raise error(_binary(path, nul))
    return text


def read_json(path: str | Path, error: type[MemrlError] = MemrlError) -> Any:
    """The parsed file; an unreadable file, a non-text file or invalid JSON raises `error` with the path and cause."""
    path = Path(path)
    return parse_json(read_text(path, error), str(path), error)


def parse_json(text: str | bytes, where: str, error: type[MemrlError] = MemrlError, *, line: bool = True) -> Any:
    """`json.loads(text)`, strictly; invalid JSON raises `error`: `WHERE: not valid JSON (why, line N)` (`line=False`
    leaves out the line, for a JSONL line whose WHERE is `PATH:N` already). Nesting deeper than Python's stack is
    hostile input, not data: it says so instead of raising RecursionError. NaN, Infinity and numbers too large for a
    float (1e309) are no JSON: Python's reader would take them as floats that then pass as text ("nan", "inf")."""
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg}{f', line {exc.lineno}' if line else ''})") from None
    except NotJson as exc:
        raise error(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None


class NotJson(ValueError):
    """What Python's JSON reader accepts but JSON is not (NaN, Infinity, a number past a float's range)."""


def _constant(name: str) -> Any:
    raise NotJson(f"{name} is no JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJson(f"the number {text[:40]} is too large")
    return value


class WrittenObject(dict[str, Any]):
    """A decoded JSON object that remembers its keys as written: json keeps only the last of a repeated key."""

    written: tuple[str, ...] = ()

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> WrittenObject:
        obj = cls(pairs)
        obj.written = tuple(key for key, _ in pairs)
        return obj


_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_constant)
_WRITTEN = json.JSONDecoder(parse_float=_finite, parse_constant=_constant, object_pairs_hook=WrittenObject.from_pairs)


def loads(text: str | bytes, *, as_written: bool = False) -> Any:
    """`json.loads` that raises NotJson for NaN, Infinity and numbers past a float's range (see `parse_json`);
    `as_written`: objects come back as `WrittenObject`s (a repeated key stays visible)."""
    decoder = _WRITTEN if as_written else _DECODER
    return decoder.decode(text.decode("utf-8") if isinstance(text, bytes) else text)


def raw_decode(text: str, start: int, *, as_written: bool = False) -> tuple[Any, int]:
    """`JSONDecoder.raw_decode` with the same refusals (and `as_written`) as `loads`."""
    return (_WRITTEN if as_written else _DECODER).raw_decode(text, start)


# Characters JSON may hold raw inside a string but that break a JSON Lines file or its encoding: line separators
# that str.splitlines() (and other tools' readers) take for line ends, and lone surrogates, which UTF-8 cannot encode.
_UNSAFE = re.compile("[\u0085\u2028\u2029\ud800-\udfff]")


def json_text(data: Any, **kwargs: Any) -> str:
    """`json.dumps(data, ensure_ascii=False)` with the characters above written as `\\uXXXX` escapes: the same JSON,
    one line, always encodable as UTF-8 (a lone surrogate from an endpoint or a JSON file reads back as it was)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(data, ensure_ascii=False, **kwargs))


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split at "\\n" only. JSON strings may hold U+2028 or U+0085 raw, which
    `str.splitlines()` would take for line ends."""
    return text.split("\n")


def read_jsonl(path: str | Path, error: type[MemrlError] = MemrlError, *, torn: bool = True) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, read only (see `numbered_jsonl`)."""
    return [record for _, record in numbered_jsonl(path, error, torn=torn)]


def numbered_jsonl(
    path: str | Path, error: type[MemrlError] = MemrlError, *, torn: bool = True
) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file with their line numbers, read only. A last line without its newline that
    does not parse is the torn write of a killed process and is dropped (`torn=False`, for a file the user wrote:
    it is an error like any other); any other bad line raises `error` naming `PATH:LINE`."""
    path = Path(path)
    text = read_text(path, error)
    lines = jsonl_lines(text.removesuffix("\n"))
    out: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line, f"{path}:{n}", error, line=False)
        except MemrlError:
            if torn and n == len(lines) and not text.endswith("\n"):
                break
            raise
        if not isinstance(record, dict):
            raise error(f"{path}:{n}: expected a JSON object, got {json_type(record)}")
        out.append((n, record))
    return out


def json_type(value: Any) -> str:
    """A JSON value's kind in words: "null", "a list", "a string", "a number", "true", "an object"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    kinds = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return next((words for kind, words in kinds.items() if isinstance(value, kind)), type(value).__name__)


@contextlib.contextmanager
def open_text(path: str | Path, error: type[MemrlError] = MemrlError) -> Iterator[IO[str]]:
    """The file opened for reading UTF-8 text line by line: errors while opening or decoding, raised in the
    `with` body included, become `error` naming the path."""
    path = Path(path)
    check_file(path, error)
    with _opened(path, error) as f:  # a zero-filled file holds no newline: one "line" of its whole size
        if (nul := f.buffer.peek(_HEAD)[:_HEAD].find(b"\0")) >= 0:  # type: ignore[attr-defined]
            raise error(_binary(path, nul))
        yield f


@contextlib.contextmanager
def _opened(path: Path, error: type[MemrlError]) -> Iterator[IO[str]]:
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
    check_folder(path, error)
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
        with naming(path, tmp), tmp.open("w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with naming(path, tmp):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def naming(path: str | Path, *stand_ins: str | Path) -> Iterator[None]:
    """OS errors of the body that name no file (a full disk or a read-only file system fails `write` and `fsync`,
    which know only a descriptor), or name one of `stand_ins` (a temporary file), name `path` instead."""
    try:
        yield
    except OSError as exc:
        named = exc.filename is not None and os.fspath(exc.filename) not in {os.fspath(p) for p in stand_ins}
        if named or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (see `atomic_writer`); returns the path."""
    with atomic_writer(path) as f:
        f.write(text)
    return Path(path)


def write_jsonl(rows: Iterable[Any], path: str | Path) -> Path:
    """One JSON value a line (`json_text`: whatever a string holds, one line of UTF-8), written atomically."""
    with atomic_writer(path) as f:
        for row in rows:
            f.write(json_text(row) + "\n")
    return Path(path)


def atomic_write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write `data` as UTF-8 JSON (non-ASCII kept as is, see `json_text`) with a final newline, atomically."""
    return atomic_write_text(path, json_text(data, indent=indent) + "\n")


class ResumableJsonl:
    """One JSON record per line, each with a unique `key`; `done` holds the keys already on disk.

    Every `append` is one `write` of one whole line on an `O_APPEND` descriptor, then fsync'ed: a process killed at
    any point leaves either the whole line or a torn last line without its newline. Opening drops such a line (with
    a warning naming `PATH:LINE`: its work runs again) and keeps every record before it; any other line that is not
    a JSON object is damage no run leaves, and raises a `MemrlError` naming `PATH:LINE` with the file untouched.
    """

    def __init__(self, path: Path, key: str = "key") -> None:
        self.path = path
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records = self._load()
        self.done: set[str] = {str(r[key]) for r in self._records if key in r}

    def _load(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        check_file(self.path)  # a FIFO planted here would block the read forever
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with its newline
        records = [self._parse(line, n) for n, line in enumerate(lines, 1) if line.strip()]
        if torn.strip():
            try:
                records.append(self._parse(torn, len(lines) + 1))
            except MemrlError:  # a write cut short mid-line: keep everything up to the last whole line
                with self.path.open("r+b") as f:
                    f.truncate(len(data) - len(torn))
                log.warning(f"{self.path}:{len(lines) + 1}: dropped a torn last line (a killed run's unfinished "
                            "write); its work runs again")  # fmt: skip
            else:  # whole but for its newline: complete it, so the next append starts a line of its own
                with self.path.open("ab") as f:
                    f.write(b"\n")
        return records

    def _parse(self, line: bytes, n: int) -> dict[str, Any]:
        """Line `n` as a record; a line that is not one raises naming `PATH:n`."""
        try:
            record = loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise MemrlError(f"{self.path}:{n}: not UTF-8 text; fix or remove that line to resume") from None
        except (ValueError, RecursionError):  # JSONDecodeError and NotJson are ValueErrors
            raise MemrlError(f"{self.path}:{n}: not valid JSON; fix or remove that line to resume") from None
        if not isinstance(record, dict):
            raise MemrlError(f"{self.path}:{n}: not a JSON object; fix or remove that line to resume")
        return record

    def records(self) -> Iterator[dict[str, Any]]:
        yield from self._records

    def latest(self) -> dict[str, dict[str, Any]]:
        """The last record of each key (for logs where a key may come back, such as failed attempts)."""
        return {str(r[self.key]): r for r in self._records if self.key in r}

    def append(self, record: dict[str, Any]) -> None:
        data = (json_text(record) + "\n").encode()  # one line whatever the text holds (see json_text)
        with naming(self.path):  # a full disk fails `write`, which names no file
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(data)
                while view:  # one write for a regular file; the loop only covers a short write
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        self._records.append(record)
        self.done.add(str(record[self.key]))
