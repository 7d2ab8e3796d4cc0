"""The one rule for work that came to nothing: all of it failed (or less than a stated share finished), or the data a
stage was given is empty. Either is an error in one line, never a success that leaves the next stage an empty file.

Producers (data stages, `eval ...`, `data ...`) call `require_success` before they write what a later stage reads;
consumers (training and evaluation stages) call `require_data` on each file before a library reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memrl.core.errors import ConfigError, MemrlError, first_line
from memrl.core.files import describe_kind


class NothingDoneError(MemrlError):
    """Work whose items all failed (or too few finished), or that left a dataset nothing to hold."""


@dataclass(frozen=True)
class Outcome:
    """How a piece of work went: `planned` items, of which `finished` and `failed` (the rest waited on a failure)."""

    noun: str  # what the items are, plural: "sessions", "tasks", "train sessions"
    planned: int
    finished: int
    failed: int
    first_failure: str | None = None  # "user u session 0: endpoint ... timed out"

    @property
    def waiting(self) -> int:
        return max(self.planned - self.finished - self.failed, 0)


def shortfall(outcome: Outcome, min_share: float = 0.0) -> str | None:
    """Why `outcome` is not enough, or None: work failed and none finished, or fewer than `min_share` of the planned
    items finished. Work that did not fail is enough (a rerun with nothing left to do, too)."""
    o = outcome
    if not o.failed or (o.finished and o.finished >= min_share * o.planned):
        return None
    lines = (o.first_failure or "").strip().splitlines()
    first = f" (first: {lines[0]})" if lines else ""
    waited = f", {o.waiting} more waited on them" if o.waiting else ""
    if not o.finished:
        return f"{o.failed} of {o.planned} {o.noun} failed{waited}{', none finished' if waited else ''}{first}"
    return (
        f"only {o.finished} of {o.planned} {o.noun} finished, fewer than the {min_share:.0%} required: "
        f"{o.failed} failed{waited}{first}"
    )


def require_success(what: str, outcome: Outcome, min_share: float = 0.0, then: str = "") -> None:
    """Raise NothingDoneError naming `what` (the stage or command) when `shortfall` says the work is not enough;
    `then` says what that means, e.g. "no dataset written; a rerun runs the failed sessions again"."""
    why = shortfall(outcome, min_share)
    if why is not None:
        raise NothingDoneError(f"{what}: {why}" + (f"; {then}" if then else ""))


def require_data(path: Path, what: str, hint: str = "") -> Path:
    """`path` if it is a data file holding at least one row (JSONL, JSON list or object, parquet); otherwise a
    ConfigError naming it, what it is instead, and `hint` (how to make it). Cheap: reading stops at the first row."""
    kind = describe_kind(path)  # never opened unless a regular file: a FIFO would wait for a writer forever
    if kind == "not found":
        problem = "does not exist"
    elif kind != "a file":
        problem = f"is {kind}, not a data file" if kind.startswith("a ") else f"cannot be read: {kind}"
    elif not _has_rows(path):
        problem = "is empty (no rows)"
    else:
        return path
    raise ConfigError(f"{what} {path} {problem}" + (f": {hint}" if hint else ""))


def _has_rows(path: Path) -> bool:
    """Whether the file holds content (a reader counts and checks its rows): read in chunks only up to its first
    bytes of content, so a huge file of blanks streams through and a huge file of data stops at once."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise ConfigError(f"{path}: not a parquet file ({first_line(exc)})") from None
    head = _content_head(path, 2)
    empty = (b"", b"[]", b"{}") if path.suffix == ".json" else (b"",)  # a JSON file: an empty list or object too
    return head not in empty


def _content_head(path: Path, n: int, chunk: int = 1 << 20) -> bytes:
    """The first `n` bytes of `path` that are not ASCII whitespace."""
    head = b""
    with path.open("rb") as f:
        while len(head) < n and (block := f.read(chunk)):
            head += b"".join(block.split())[: n - len(head)]
    return head
