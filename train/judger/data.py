"""Judger data on disk (`J/<split>/pairs.jsonl`, one row per (query, stored QA pair)) and its training batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import open_text, parse_json
from memrl.core.outcomes import require_data
from memrl.rollout.judger.heads import Head
from memrl.rollout.judger.inputs import JudgerInput

PAIRS_FILE = "pairs.jsonl"
REQUIRED = ("key", "query_id", "context", "missing_slots", "question", "answer", "label")


def pairs_file(ref: Path, split: str) -> Path:
    """`ref` may be the dataset folder (J), a split folder (J/eval) or the pairs file itself."""
    if ref.is_file():
        return ref
    for path in (ref / split / PAIRS_FILE, ref / PAIRS_FILE):
        if path.is_file():
            return path
    return ref / split / PAIRS_FILE


def require_pairs(ref: Path, split: str) -> Path:
    hint = f"build judger data with `memrl data judger --tod-dir O --out {ref}`"
    return require_data(pairs_file(ref, split), "judger data", hint)


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """Rows of a pairs file; a malformed row fails with its line number and the field."""
    rows: list[dict[str, Any]] = []
    with open_text(path, ConfigError) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = parse_json(line, f"{path}:{n}", ConfigError, line=False)
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{n}: not a JSON object")
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                raise ConfigError(f"{path}:{n}: judger pair lacks field {missing[0]!r}")
            if row["label"] not in (0, 1):
                raise ConfigError(f"{path}:{n}: label must be 0 or 1, got {row['label']!r}")
            rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: no judger pairs")
    return rows


@dataclass(frozen=True)
class Example:
    item: JudgerInput
    label: float


class PairsDataset:
    """A map-style dataset the HF Trainer samples from; tokenisation happens per batch in the collator."""

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        self.examples = [Example(JudgerInput.from_pair(r), float(r["label"])) for r in rows]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    @property
    def labels(self) -> list[float]:
        return [e.label for e in self.examples]


class Collator:
    def __init__(self, head: Head) -> None:
        self.head = head

    def __call__(self, examples: Sequence[Example]) -> dict[str, Any]:
        import torch

        batch = self.head.encode([e.item for e in examples])
        batch["labels"] = torch.tensor([e.label for e in examples], dtype=torch.float32)
        return batch
