"""Append-only JSONL that survives a killed process: whole-line writes, and a torn last line is dropped."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ResumableJsonl:
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

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.done.add(str(record[self.key]))
