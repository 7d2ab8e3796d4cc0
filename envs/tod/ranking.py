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
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from memrl.core.stats import paired_difference
from memrl.envs.tod.values import normalise_value

Facts = Mapping[str, Hashable]  # pair key -> the fact it carries; a key left out is a fact of its own


def fact_of(slot: str, value: str) -> tuple[str, str]:
    """The fact a QA pair carries: its slot and its normalised value, the comparison the gold labels use
    (`values.same_value`), so two pairs labelled gold for one slot are one fact."""
    return slot, normalise_value(value)


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


def brier(labels: Sequence[int], probs: Sequence[float]) -> float:
    """Mean squared gap between P(relevant) and the label; NaN without pairs."""
    from sklearn.metrics import brier_score_loss

    if not labels:
        return math.nan
    return float(brier_score_loss(list(labels), list(probs), pos_label=1))


def ece(labels: Sequence[int], probs: Sequence[float], bins: int = 10) -> float:
    """Expected calibration error over `bins` equal-width probability bins: the pair-weighted mean of
    |positive rate - mean probability| per bin; NaN without pairs."""
    if not labels:
        return math.nan
    groups: dict[int, list[tuple[int, float]]] = {}
    for y, p in zip(labels, probs, strict=True):
        groups.setdefault(min(int(p * bins), bins - 1), []).append((y, p))
    gap = sum(abs(sum(y for y, _ in g) - sum(p for _, p in g)) for g in groups.values())
    return gap / len(labels)


# The rankings `memrl eval judger` and `memrl eval tod` set side by side: metric key prefix per row.
RANKINGS = {"retrieval": "retrieval_", "judger": "judger_", "fused": "", "ceiling": "ceiling_"}
GAIN_K = 5


def side_by_side(metrics: Mapping[str, object], ks: Sequence[int]) -> dict[str, dict[str, float | None]]:
    """Row per ranking (retrieval alone, judger alone, fused, and the ceiling), `recall@k` and `pair_recall@k`
    columns, read from the flat metric keys (`retrieval_recall@5`, ...); None where a run lacks one."""
    table: dict[str, dict[str, float | None]] = {}
    for row, prefix in RANKINGS.items():
        values = {name: metrics.get(prefix + name) for name in recall_names(ks)}
        table[row] = {k: v if isinstance(v, int | float) else None for k, v in values.items()}
    return table


def judger_gain(metrics: Mapping[str, object], k: int = GAIN_K) -> float | None:
    """Fused recall@k minus retrieval alone; None where either is missing."""
    fused, alone = metrics.get(f"recall@{k}"), metrics.get(f"retrieval_recall@{k}")
    if not isinstance(fused, int | float) or not isinstance(alone, int | float):
        return None
    return round(fused - alone, 4)


def gain_interval(fused: Sequence[float], alone: Sequence[float]) -> dict[str, object]:
    """The gain's paired bootstrap over queries (per-query fused and retrieval-alone recall@k, NaN where a query
    has no gold): `ci95` as [low, high] and the `queries` it rests on; a null interval under two queries."""
    found = paired_difference(fused, alone)
    queries = sum(1 for f, a in zip(fused, alone, strict=True) if not (math.isnan(f) or math.isnan(a)))
    ci = None if found is None else [round(found[1][0], 4), round(found[1][1], 4)]
    return {"ci95": ci, "queries": queries}


ALPHA_RULE = (
    "the smallest alpha whose per-query recall@5 is within the dev noise of the best alpha's: "
    "its paired bootstrap 95% interval against the best reaches 0"
)


@dataclass(frozen=True)
class AlphaChoice:
    """What `alpha_within_noise` chose and on what: the chosen `alpha` (None: no query has gold), the `best` alpha
    by mean, the `sweep` of means, each alpha's `against_best` (`difference` and `ci95`, None under two queries) and
    the `queries` with gold; alphas as strings, as JSON keys them."""

    alpha: float | None
    best: float | None
    sweep: dict[str, float | None]
    against_best: dict[str, dict[str, float | list[float] | None]]
    queries: int


def alpha_within_noise(per_query: Mapping[float, Sequence[float]]) -> AlphaChoice:
    """Choose the fusion alpha from a sweep's per-query recall (alpha -> one value per query, NaN where a query has
    no gold; every alpha over the same queries, in one order): the best alpha by mean (ties: the smaller), each
    alpha's paired bootstrap interval against it, and the smallest alpha (the least retrieval) whose interval
    reaches 0 (`ALPHA_RULE`). On a flat sweep that is the smallest alpha of the flat part, however noise orders the
    means; on a peaked one, the peak or an alpha below it that the data cannot tell from it. Under two queries with
    gold there is no noise to measure: the best."""
    alphas = sorted(per_query)
    columns = [per_query[a] for a in alphas]
    if len({len(c) for c in columns}) > 1:
        raise ValueError("alpha_within_noise: every alpha must be scored on the same queries")
    names = [str(a) for a in alphas]
    by_name = mean_scores((dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)), names)
    means = {a: by_name[str(a)] for a in alphas}
    sweep = {str(a): None if math.isnan(m) else round(m, 4) for a, m in means.items()}
    scored = [a for a in alphas if not math.isnan(means[a])]
    if not scored:
        return AlphaChoice(None, None, sweep, {}, 0)
    best = max(scored, key=lambda a: (round(means[a], 9), -a))
    against: dict[str, dict[str, float | list[float] | None]] = {}
    within = [best]
    for a in scored:
        found = paired_difference(per_query[a], per_query[best])
        if found is None:
            against[str(a)] = {"difference": None, "ci95": None}
            continue
        difference, (low, high) = found
        against[str(a)] = {"difference": round(difference, 4), "ci95": [round(low, 4), round(high, 4)]}
        if high >= -1e-9:  # the interval reaches 0: this alpha cannot be told from the best
            within.append(a)
    queries = sum(1 for v in per_query[best] if not math.isnan(v))
    return AlphaChoice(min(within), best, sweep, against, queries)


def table_lines(table: Mapping[str, Mapping[str, float | None]]) -> list[str]:
    """`side_by_side` as aligned text lines ('-' for a missing value), each column as wide as its name."""
    names = list(next(iter(table.values())))
    lines = ["".ljust(10) + " ".join(names)]
    for row, values in table.items():
        cells = ("-" if v is None else f"{v:.3f}" for v in values.values())
        lines.append(row.ljust(10) + " ".join(c.rjust(len(n)) for c, n in zip(cells, names, strict=True)))
    return lines
