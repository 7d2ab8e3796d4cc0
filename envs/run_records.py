"""What an environment run leaves in its folder: finished records, and work a model endpoint failed (`failed.jsonl`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.core.files import ResumableJsonl
from memrl.core.secrets import redact

FAILED_FILE = "failed.jsonl"  # work a model endpoint could not serve, one line per failed attempt


@dataclass
class EnvRun:
    """What a run left in its folder: finished records, work still failed, and this run's worker retries."""

    records: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)
    planned: int = 0
    retried: int = 0

    @property
    def pending(self) -> int:
        """Planned work neither finished nor failed (what waits on a user's failed session or task)."""
        return self.planned - len(self.records) - len(self.failed)


class FailedWork:
    """Work whose model endpoint still failed after the client's retries: logged in `failed.jsonl`, said on the
    console, and run again by a rerun (it never reaches the finished records)."""

    def __init__(self, out: Path, console: Any) -> None:
        self.out = out
        self.console = console
        self.now: list[tuple[str, dict[str, Any]]] = []  # (what failed, its record), this run

    def add(self, what: str, record: dict[str, Any]) -> None:
        # A worker knows none of the driver's secrets (the ${VAR}s it resolved): its error text is masked here.
        record = {**record, "error": redact(str(record["error"]))}
        ResumableJsonl(self.out / FAILED_FILE, key="key").append(record)
        self.now.append((what, record))
        line = f"{what} failed: {record['error']} (a rerun runs it again)"
        self.console.print(line, style="red", markup=False, highlight=False)

    @staticmethod
    def outstanding(out: Path, done: Collection[str]) -> list[dict[str, Any]]:
        """The last failed attempt of every piece of work no run has finished since."""
        path = out / FAILED_FILE
        if not path.exists():
            return []
        return [r for key, r in ResumableJsonl(path, key="key").latest().items() if key not in done]
