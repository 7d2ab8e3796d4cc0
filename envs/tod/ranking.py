"""Ranking metrics of memory activation: Recall@k of the gold QA pairs, and AUC of a judger's scores."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence


def recall_at_k(ranked_keys: Sequence[str], gold_keys: Collection[str], k: int) -> float:
    """|gold in the top k| / |gold| for one query; NaN when it has no gold (`mean_recall_at_k` skips those)."""
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    gold = set(gold_keys)
    if not gold:
        return math.nan
    return len(gold.intersection(ranked_keys[:k])) / len(gold)


def mean_recall_at_k(queries: Iterable[tuple[Sequence[str], Collection[str]]], k: int) -> float:
    """Mean Recall@k over (ranked keys, gold keys) of the queries that have gold; NaN when none has."""
    values = [r for ranked, gold in queries if not math.isnan(r := recall_at_k(ranked, gold, k))]
    return sum(values) / len(values) if values else math.nan


def auc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve; NaN when only one class is present (it is undefined then)."""
    from sklearn.metrics import roc_auc_score

    if len(set(labels)) < 2:
        return math.nan
    return float(roc_auc_score(list(labels), list(scores)))
