"""Ranking metrics of memory activation: Recall@k of the gold memory, its ceiling, and AUC of a judger's scores.

A query's gold is a set of QA pair keys. Several pairs can carry the same fact: on MS-TOD a value the user gave
once is stored again by every later session of the task. So there are two recalls:
- `recall_at_k(..., facts)`: over the distinct gold facts (slot, value); a fact is recalled at k when any of the
  top k pairs carries it (a pair of another task with the same slot and value counts too: the reader gets the
  value either way). The headline figure.
- `recall_at_k(...)` without `facts`: over the gold pairs, each one counted (the pair recall).
`ceiling_at_k` is the best either can reach at k given the candidates: k top slots cannot hold more than k gold
pairs, so with duplicates the pair recall stays below 1 even for a perfect ranking.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

Facts = Mapping[str, Hashable]  # pair key -> the fact it carries; a key left out is a fact of its own


def fact_of(slot: str, value: str) -> tuple[str, str]:
    """The fact a QA pair carries: its slot and its value up to case, spacing and trailing punctuation, the
    comparison the gold labels use (`labels.same_value`), so two pairs labelled gold for one slot are one fact."""
    return slot, re.sub(r"\s+", " ", value).strip().strip(".,;!?").casefold()


def _facts(keys: Iterable[str], facts: Facts | None) -> set[Hashable]:
    return {facts.get(key, key) for key in keys} if facts is not None else set(keys)


def recall_at_k(ranked_keys: Sequence[str], gold_keys: Collection[str], k: int, facts: Facts | None = None) -> float:
    """|gold facts carried in the top k| / |gold facts| for one query (each gold pair its own fact without `facts`);
    NaN when it has no gold (the means skip those). Gold the ranking lacks counts as missed."""
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    gold = _facts(gold_keys, facts)
    if not gold:
        return math.nan
    return len(gold & _facts(ranked_keys[:k], facts)) / len(gold)


def ceiling_at_k(
    candidate_keys: Collection[str], gold_keys: Collection[str], k: int, facts: Facts | None = None
) -> float:
    """The best `recall_at_k` any ranking of the candidates reaches: each pair carries one fact, so the top k hold
    at most min(k, gold facts some candidate carries) of them. NaN when there is no gold."""
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    gold = _facts(gold_keys, facts)
    if not gold:
        return math.nan
    return min(k, len(gold & _facts(candidate_keys, facts))) / len(gold)


def recall_names(ks: Sequence[int]) -> list[str]:
    """The keys `RankedQuery.recalls` gives, in its order; `ceiling_` before each are those of `ceilings`."""
    return [f"{measure}@{k}" for measure in ("recall", "pair_recall") for k in ks]


@dataclass(frozen=True)
class RankedQuery:
    """One query's ranking, its gold pairs, the facts the pairs carry and the candidates any ranking could order
    (None: every gold pair was available)."""

    ranked: Sequence[str]
    gold: Collection[str]
    facts: Facts
    candidates: Collection[str] | None = None

    def recalls(self, ks: Sequence[int]) -> dict[str, float]:
        """`recall@k` (distinct facts) then `pair_recall@k` for each k; NaN without gold."""
        values = [recall_at_k(self.ranked, self.gold, k, facts) for facts in (self.facts, None) for k in ks]
        return dict(zip(recall_names(ks), values, strict=True))

    def ceilings(self, ks: Sequence[int]) -> dict[str, float]:
        """`ceiling_recall@k` and `ceiling_pair_recall@k`: the best any ranking of the candidates reaches."""
        pool = self.gold if self.candidates is None else self.candidates
        values = [ceiling_at_k(pool, self.gold, k, facts) for facts in (self.facts, None) for k in ks]
        return dict(zip((f"ceiling_{name}" for name in recall_names(ks)), values, strict=True))


def mean_scores(per_query: Iterable[Mapping[str, float]], names: Iterable[str] = ()) -> dict[str, float]:
    """Key by key, the mean over the queries whose value is not NaN (those without gold); NaN when none has one.
    `names` are keys to give (first, NaN at worst) even when there is no query."""
    kept: dict[str, list[float]] = {name: [] for name in names}
    for scores in per_query:
        for key, value in scores.items():
            kept.setdefault(key, [])
            if not math.isnan(value):
                kept[key].append(value)
    return {key: sum(v) / len(v) if v else math.nan for key, v in kept.items()}


def auc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve; NaN when only one class is present (it is undefined then)."""
    from sklearn.metrics import roc_auc_score

    if len(set(labels)) < 2:
        return math.nan
    return float(roc_auc_score(list(labels), list(scores)))
