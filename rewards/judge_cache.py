"""On-disk cache of judge verdicts, keyed by (judge model, sha256 of the prompt): one SQLite file.

Only successful verdicts are stored, so a failed item is asked again on the next run. One connection per cache,
shared by every thread and task of the process behind a lock; WAL mode lets other processes read meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

from memrl.rewards.types import JudgeVerdict

_SCHEMA = """CREATE TABLE IF NOT EXISTS verdicts (
    model TEXT NOT NULL, prompt_sha256 TEXT NOT NULL, score REAL NOT NULL, reasoning TEXT NOT NULL,
    PRIMARY KEY (model, prompt_sha256))"""


def prompt_key(messages: object) -> str:
    """sha256 of the prompt exactly as sent (the chat messages, canonical JSON)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class JudgeCache:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30.0)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)
            self._db.commit()
        self.hits = 0
        self.misses = 0

    def get(self, model: str, key: str) -> JudgeVerdict | None:
        with self._lock:
            row = self._db.execute(
                "SELECT score, reasoning FROM verdicts WHERE model = ? AND prompt_sha256 = ?", (model, key)
            ).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return JudgeVerdict(float(row[0]), str(row[1]))

    def put(self, model: str, key: str, verdict: JudgeVerdict) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?)", (model, key, verdict.score, verdict.reasoning)
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
