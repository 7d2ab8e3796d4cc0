"""Append-only JSONL that survives a killed process: whole-line writes, and a torn last line is dropped."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError
from memrl.core.files import check_file, json_text, loads, naming

log = logging.getLogger(__name__)


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
        data = (json_text(record) + "\n").encode()  # one line whatever the text holds (see core.files.json_text)
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
