"""Append-only JSONL that survives a killed process: whole-line writes, and a torn last line is dropped."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ResumableJsonl:
    """One JSON record per line, each with a unique `key`; `done` holds the keys already on disk.

    Every `append` is one `write` of one whole line on an `O_APPEND` descriptor, then fsync'ed: a process killed at
    any point leaves either the whole line or a torn last line without its newline, which the next open drops.
    """

    def __init__(self, path: Path, key: str = "key") -> None:
        self.path = path
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()
        self.done: set[str] = {str(r[key]) for r in self.records() if key in r}

    def _drop_torn_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            # A write interrupted mid-line: keep everything up to the last complete line.
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    def latest(self) -> dict[str, dict[str, Any]]:
        """The last record of each key (for logs where a key may come back, such as failed attempts)."""
        return {str(r[self.key]): r for r in self.records() if self.key in r}

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:  # one write for a regular file; the loop only covers a short write
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.done.add(str(record[self.key]))
