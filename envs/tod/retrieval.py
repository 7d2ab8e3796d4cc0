"""Intent-aligned retrieval over a memory bank's QA pairs: dense (MiniLM), BM25, or both; and score fusion.

Units (one per earlier session) are first ranked by how close their intent description is to the current intent
query, and only the best `top_units` are kept; their QA pairs are then scored against the same query (min-max
normalised per query). `fuse` puts the retrieval and judger scores of one query on one scale before weighting them:
ranks by default (scale-free: a judger whose probabilities sit in a narrow band still reorders), z-scores, or
`minmax`, the earlier behaviour (min-max retrieval score plus the raw probability).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

RetrieverKind = Literal["dense", "bm25", "hybrid"]
RETRIEVERS: tuple[str, ...] = ("dense", "bm25", "hybrid")
Fusion = Literal["rank", "zscore", "minmax"]
DEFAULT_ALPHA = 0.5  # without a judger-chosen alpha


@dataclass(frozen=True)
class Candidate:
    """One stored QA pair and the memory unit (session) it belongs to."""

    key: str
    unit: int  # the session id the pair was stored from
    intent_description: str
    slot: str
    question: str
    answer: str

    def text(self) -> str:
        """What the retrievers index: the unit's intent, then the pair."""
        return f"{self.intent_description}. {self.question} {self.answer}"


class Retriever(Protocol):
    def score(self, query: str, docs: Sequence[str]) -> list[float]:
        """One score per doc; higher means closer to the query."""
        ...


class DenseRetriever:
    """Cosine similarity of sentence embeddings (the process-wide cached MiniLM by default)."""

    def __init__(self, model: str = "all-minilm-l6-v2") -> None:
        self.model = model

    def score(self, query: str, docs: Sequence[str]) -> list[float]:
        from memrl.rollout.embedding import get_embedder

        if not docs:
            return []
        # Each distinct text scored once, in float64: a float32 matrix-vector product rounds a row by where it sits
        # in the batch, and two identical docs must tie (ties keep memory order).
        distinct = list(dict.fromkeys(docs))
        vectors = get_embedder(self.model).encode([query, *distinct]).astype("float64")
        scores = dict(zip(distinct, (float(x) for x in vectors[1:] @ vectors[0]), strict=True))
        return [scores[d] for d in docs]


_WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class BM25Retriever:
    """BM25+ over the docs of one call (the corpus is one query's candidates, so it is rebuilt per call).

    BM25+ rather than Okapi: on a corpus of a handful of docs Okapi's idf turns negative for words most docs share.
    """

    def score(self, query: str, docs: Sequence[str]) -> list[float]:
        from rank_bm25 import BM25Plus

        corpus = [tokenize(d) for d in docs]
        if not any(corpus):
            return [0.0] * len(docs)
        return [float(x) for x in BM25Plus(corpus).get_scores(tokenize(query))]


class HybridRetriever:
    """The mean of the min-max normalised dense and BM25 scores."""

    def __init__(self, dense: Retriever | None = None, bm25: Retriever | None = None) -> None:
        self.dense = dense or DenseRetriever()
        self.bm25 = bm25 or BM25Retriever()

    def score(self, query: str, docs: Sequence[str]) -> list[float]:
        dense = minmax(self.dense.score(query, docs))
        sparse = minmax(self.bm25.score(query, docs))
        return [(a + b) / 2 for a, b in zip(dense, sparse, strict=True)]


def build_retriever(kind: RetrieverKind | str) -> Retriever:
    if kind == "dense":
        return DenseRetriever()
    if kind == "bm25":
        return BM25Retriever()
    if kind == "hybrid":
        return HybridRetriever()
    raise ValueError(f"unknown retriever {kind!r}; expected one of {', '.join(RETRIEVERS)}")


def minmax(scores: Sequence[float]) -> list[float]:
    """Scale to [0, 1]; equal scores (one candidate, or ties everywhere) all become 1."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high - low <= 1e-12:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


def retrieve(
    query: str, candidates: Sequence[Candidate], retriever: Retriever, top_units: int | None = None
) -> list[tuple[Candidate, float]]:
    """The QA pairs of the `top_units` units closest to `query` (all units when None), best first, with s_pre."""
    if not candidates:
        return []
    units: dict[int, str] = {}
    for cand in candidates:
        units.setdefault(cand.unit, cand.intent_description)
    if top_units is not None and top_units < len(units):
        ids = list(units)
        unit_scores = retriever.score(query, [units[u] for u in ids])
        order = sorted(range(len(ids)), key=lambda i: -unit_scores[i])  # stable: ties keep memory order
        keep = {ids[i] for i in order[:top_units]}
        candidates = [c for c in candidates if c.unit in keep]
    s_pre = minmax(retriever.score(query, [c.text() for c in candidates]))
    order = sorted(range(len(candidates)), key=lambda i: -s_pre[i])
    return [(candidates[i], s_pre[i]) for i in order]


def rank_scale(scores: Sequence[float]) -> list[float]:
    """Ranks scaled to [0, 1] (best 1, worst 0), equal scores sharing their mean rank; one score becomes 1."""
    from scipy.stats import rankdata

    if len(scores) < 2:
        return [1.0] * len(scores)
    return [float(r - 1) / (len(scores) - 1) for r in rankdata(scores, method="average")]


def zscore(scores: Sequence[float]) -> list[float]:
    """(s - mean) / std per query; all 0 when the scores do not vary."""
    if not scores:
        return []
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
    return [0.0] * len(scores) if std <= 1e-12 else [(s - mean) / std for s in scores]


Scaling = Callable[[Sequence[float], Sequence[float]], tuple[Sequence[float], Sequence[float]]]
SCALES: dict[str, Scaling] = {
    "rank": lambda pre, judged: (rank_scale(pre), rank_scale(judged)),
    "zscore": lambda pre, judged: (zscore(pre), zscore(judged)),
    # The earlier behaviour: retrieval min-max scaled, the judger's raw probability (a judger whose probabilities
    # span a narrow band barely moves the ranking).
    "minmax": lambda pre, judged: (minmax(pre), judged),
}


def fuse(s_pre: Sequence[float], s_judger: Sequence[float], alpha: float, scale: Fusion | str = "rank") -> list[float]:
    """alpha * s_pre + (1 - alpha) * s_judger, pair by pair, after putting both on one per-query `scale` (`SCALES`)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if scale not in SCALES:
        raise ValueError(f"unknown fusion {scale!r}; expected one of {', '.join(SCALES)}")
    pre, judged = SCALES[scale](s_pre, s_judger)
    return [alpha * p + (1 - alpha) * j for p, j in zip(pre, judged, strict=True)]


def resolve_alpha(alpha: float | None, judger: str | Path | None) -> tuple[float, str]:
    """The fusion weight and where it came from: `alpha` when given, else the one the judger chose on its training
    split (`JudgerInfo.alpha`, with the rule that chose it where the file records one), else DEFAULT_ALPHA."""
    if alpha is not None:
        return alpha, "given"
    if judger is not None:
        from memrl.rollout.judger.scorer import JUDGER_FILE, JudgerInfo, judger_folder

        folder = judger_folder(judger)
        info = JudgerInfo.read(folder)
        if info.alpha is not None:
            where = folder / JUDGER_FILE
            if info.alpha_rule:
                return float(info.alpha), f"chosen on the judger's training split, {where}: {info.alpha_rule}"
            return float(info.alpha), f"chosen on the judger's training split ({where})"
        return DEFAULT_ALPHA, f"default: {folder / JUDGER_FILE} holds no alpha"
    return DEFAULT_ALPHA, "default: no judger"
