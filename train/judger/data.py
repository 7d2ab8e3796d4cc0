"""Judger data on disk (`J/<split>/pairs.jsonl`, one row per (query, stored QA pair)) and its training batches."""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.outcomes import require_data
from memrl.data_gen.judger_pairs import JudgerPair
from memrl.envs.tod.retrieval import build_retriever, retrieve
from memrl.rollout.judger.heads import Head
from memrl.rollout.judger.inputs import JudgerInput

PAIRS_FILE = "pairs.jsonl"


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


def by_query(rows: Sequence[JudgerPair]) -> dict[str, list[JudgerPair]]:
    """Rows grouped by query, in file order."""
    queries: dict[str, list[JudgerPair]] = {}
    for row in rows:
        queries.setdefault(row.query_id, []).append(row)
    return queries


def split_dev(rows: Sequence[JudgerPair], fraction: float, seed: int) -> tuple[list[JudgerPair], list[JudgerPair]]:
    """(train, dev): a seeded `fraction` of the individuals (`persona_id`) goes to dev, whole, so nothing of a dev
    individual is trained on. Fraction 0, or a single individual (nothing would be left to train on): no dev."""
    if fraction <= 0:
        return list(rows), []
    people = sorted({r.persona_id for r in rows}, key=str)
    if len(people) < 2:
        return list(rows), []
    n_dev = min(len(people) - 1, max(1, round(fraction * len(people))))
    dev = set(random.Random(seed).sample(people, n_dev))
    return [r for r in rows if r.persona_id not in dev], [r for r in rows if r.persona_id in dev]


def retrieved_keys(
    rows: Sequence[JudgerPair], retriever: str, top_units: int, cache: Path | None = None
) -> dict[str, list[str]]:
    """Per query, the keys of the pairs `retrieve` keeps (its `top_units` units), as evaluation computes them.

    Dense retrieval embeds every query's units (about a minute on the release on 2 cores), so the result is cached
    in `cache`, valid while what retrieval reads of the rows is the same."""
    queries = by_query(rows)
    # What retrieval reads, row by row: a rebuilt data folder with the same keys but other texts is recomputed.
    read = (json.dumps([r.key, r.query_id, r.intent_query, r.memory_session_id, r.memory_intent, r.question, r.answer])
            for r in rows)  # fmt: skip
    digest = hashlib.sha256("\n".join(read).encode()).hexdigest()
    ident = {"retriever": retriever, "top_units": top_units, "keys": digest}
    if cache is not None and cache.is_file():
        try:
            saved = json.loads(cache.read_text())
            if saved.get("ident") == ident:
                return {str(q): [str(k) for k in keys] for q, keys in saved["kept"].items()}
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
            pass  # a broken cache is recomputed
    ranker = build_retriever(retriever)
    kept = {
        qid: [c.key for c, _ in retrieve(qr[0].intent_query, [r.candidate() for r in qr], ranker, top_units)]
        for qid, qr in queries.items()
    }  # fmt: skip
    if cache is not None:
        try:
            tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")  # processes of one torchrun may race here
            tmp.write_text(json.dumps({"ident": ident, "kept": kept}))
            tmp.replace(cache)
        except OSError:
            pass  # a read-only data folder: recompute next time
    return kept


@dataclass(frozen=True)
class SelectionCounts:
    queries: int
    rows: int
    positives: int

    @property
    def positive_rate(self) -> float:
        return self.positives / self.rows if self.rows else 0.0

    def line(self) -> str:
        return f"{self.queries} queries, {self.rows} pairs, {self.positives} positive ({self.positive_rate:.1%})"


def select_pairs(
    rows: Sequence[JudgerPair],
    *,
    require_positive: bool,
    kept: Mapping[str, Sequence[str]] | None,
    random_negatives: int,
    seed: int,
    where: str = "selection",
) -> list[JudgerPair]:
    """The training rows: per query (with a positive, when required) the pairs of its `kept` units (all pairs when
    `kept` is None), every positive, and up to `random_negatives` other negatives drawn with a per-query seed.
    A selection without a positive is refused: BCE would only learn to say no."""
    selected: list[JudgerPair] = []
    for qid, query_rows in by_query(rows).items():
        if require_positive and not any(r.label == 1 for r in query_rows):
            continue
        if kept is None:
            selected += query_rows
            continue
        hard = set(kept.get(qid, ()))
        # Positives outside the kept units still teach what answers a slot; they are too few to leave out.
        chosen = [r for r in query_rows if r.key in hard or r.label == 1]
        rest = [r for r in query_rows if r.key not in hard and r.label == 0]
        extra = random.Random(f"{seed}/{qid}").sample(rest, min(random_negatives, len(rest)))
        picked = {id(r) for r in (*chosen, *extra)}
        selected += [r for r in query_rows if id(r) in picked]  # file order
    if not any(r.label == 1 for r in selected):
        raise ConfigError(f"{where}: the selected training pairs hold no positive ({counts(rows).line()} before)")
    return selected


def counts(rows: Sequence[JudgerPair]) -> SelectionCounts:
    return SelectionCounts(len(by_query(rows)), len(rows), sum(1 for r in rows if r.label == 1))


@dataclass(frozen=True)
class Example:
    item: JudgerInput
    label: float


class PairsDataset:
    """A map-style dataset the HF Trainer samples from; tokenisation happens per batch in the collator."""

    def __init__(self, rows: Sequence[JudgerPair]) -> None:
        self.examples = [Example(r.judger_input(), float(r.label)) for r in rows]

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
