"""Retrieval over memory QA pairs (dense, BM25, hybrid), intent alignment, fusion, Recall@k and AUC."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memrl.envs.tod.ranking import auc, mean_scores, recall_at_k
from memrl.envs.tod.retrieval import (
    DEFAULT_ALPHA,
    Candidate,
    build_retriever,
    fuse,
    minmax,
    rank_scale,
    resolve_alpha,
    retrieve,
    zscore,
)

DOCS = [
    "book a ride to the airport for two people",
    "reserve a table at Sakura Garden in San Jose for dinner",
    "what is the weather like in Oakland tomorrow",
]


@pytest.mark.parametrize("kind", ["dense", "bm25", "hybrid"])
def test_each_retriever_ranks_the_relevant_doc_first(kind: str) -> None:
    scores = build_retriever(kind).score("a table at Sakura Garden restaurant in San Jose", DOCS)
    assert len(scores) == 3 and max(range(3), key=lambda i: scores[i]) == 1
    assert build_retriever(kind).score("anything", []) == []


def test_unknown_retriever() -> None:
    with pytest.raises(ValueError, match="unknown retriever 'tfidf'"):
        build_retriever("tfidf")


def cand(unit: int, intent: str, slot: str, answer: str) -> Candidate:
    return Candidate(f"{unit}/{slot}", unit, intent, slot, f"What is the {slot}?", answer)


CANDIDATES = [
    cand(1, "book a ride to the airport", "destination", "the airport"),
    cand(1, "book a ride to the airport", "seats", "2"),
    cand(2, "reserve a table at Sakura Garden in San Jose", "date", "March 3rd"),
    cand(2, "reserve a table at Sakura Garden in San Jose", "time", "7 pm"),
    cand(3, "find a dentist in Fremont", "city", "Fremont"),
    cand(4, "reserve a table at Blue Fin in Oakland", "date", "Friday"),
]


def test_intent_alignment_keeps_only_the_top_units() -> None:
    bm25 = build_retriever("bm25")
    query = "reserve a table at a restaurant; restaurant name Sakura Garden; city San Jose"
    top1 = retrieve(query, CANDIDATES, bm25, top_units=1)
    assert {c.unit for c, _ in top1} == {2}
    top2 = retrieve(query, CANDIDATES, bm25, top_units=2)
    assert {c.unit for c, _ in top2} == {2, 4}
    everything = retrieve(query, CANDIDATES, bm25, top_units=None)
    assert len(everything) == len(CANDIDATES)
    scores = [s for _, s in everything]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0 and scores[-1] == 0.0
    assert retrieve(query, [], bm25, top_units=2) == []


def test_fuse_and_minmax() -> None:
    # `minmax`, the earlier fusion: min-max retrieval score plus the raw probability.
    assert fuse([1.0, 0.0], [0.2, 0.8], 0.25, "minmax") == pytest.approx([0.4, 0.6])
    assert fuse([1.0], [0.0], 1.0) == [1.0] and fuse([1.0], [0.0], 0.0) == [1.0]  # one candidate: rank 1 either way
    with pytest.raises(ValueError, match="alpha"):
        fuse([1.0], [1.0], 1.5)
    with pytest.raises(ValueError, match="unknown fusion 'softmax'"):
        fuse([1.0], [1.0], 0.5, "softmax")
    assert minmax([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert minmax([5.0, 5.0]) == [1.0, 1.0] and minmax([]) == []


def test_recall_at_k_and_auc() -> None:
    ranked = ["a", "b", "c", "d"]
    assert recall_at_k(ranked, {"b", "d"}, 1) == 0.0
    assert recall_at_k(ranked, {"b", "d"}, 2) == 0.5
    assert recall_at_k(ranked, {"b", "d"}, 5) == 1.0
    assert recall_at_k(ranked, {"z"}, 3) == 0.0  # gold that retrieval dropped counts as missed
    assert math.isnan(recall_at_k(ranked, set(), 3))
    per_query = [{"r@1": recall_at_k(ranked, gold, 1)} for gold in ({"a"}, set(), {"d"})]
    assert mean_scores(per_query) == {"r@1": 0.5}  # the query without gold is skipped
    assert math.isnan(mean_scores([], ["r@1"])["r@1"])
    assert auc([0, 1, 0, 1], [0.1, 0.9, 0.3, 0.8]) == 1.0
    assert auc([0, 1, 1, 0], [0.9, 0.1, 0.2, 0.8]) == 0.0
    assert math.isnan(auc([1, 1], [0.2, 0.3]))


def _order(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def test_a_judger_with_probabilities_in_a_narrow_band_still_reorders() -> None:
    """The release's collapsed judger: probabilities 0.0944..0.0956 per query. Min-max + raw probability leaves the
    retrieval order at alpha 0.4; on one scale (ranks or z-scores) alpha means what it says."""
    s_pre, s_judger = [1.0, 0.6, 0.0], [0.0944, 0.0950, 0.0956]
    assert _order(fuse(s_pre, s_judger, 0.4, "minmax")) == [0, 1, 2]
    assert _order(fuse(s_pre, s_judger, 0.4)) == [2, 1, 0]
    assert _order(fuse(s_pre, s_judger, 0.4, "zscore")) == [2, 1, 0]
    assert _order(fuse(s_pre, s_judger, 0.6)) == [0, 1, 2]  # retrieval weighs more: its order
    assert _order(fuse(s_pre, s_judger, 1.0)) == [0, 1, 2] and _order(fuse(s_pre, s_judger, 0.0)) == [2, 1, 0]


def test_rank_and_z_scales() -> None:
    assert rank_scale([0.3, 0.9, 0.1]) == [0.5, 1.0, 0.0]
    assert rank_scale([0.2, 0.2, 0.9, 0.1]) == pytest.approx([0.5, 0.5, 1.0, 0.0])  # ties share their mean rank
    assert rank_scale([7.0]) == [1.0] and rank_scale([]) == []
    assert zscore([1.0, 3.0]) == [-1.0, 1.0] and zscore([2.0, 2.0]) == [0.0, 0.0] and zscore([]) == []


def test_identical_docs_tie_whatever_else_is_in_the_batch() -> None:
    """Two units with one description, among differently long ones: a float32 matrix-vector product rounded the
    same text's score by its row, so the tie (and "ties keep memory order") depended on the batch."""
    same = "book the selected house for given dates and number of adults"
    others = [
        "play a song", "reserve car rental for given dates and location; date of return and pickup time",
        "find a dentist", "check the weather in a city on a date, with the forecast for the next days and humidity",
        "buy tickets for an event", "reserve a table at a restaurant", "get a ride to a place",
        "search for a bus between two cities on a date",
    ]  # fmt: skip
    docs = [others[0], same, *others[1:], same]
    scores = build_retriever("dense").score("book a house in Austin for two adults", docs)
    assert scores[1] == scores[-1]
    units = [cand(i, d, "slot", "x") for i, d in enumerate(docs)]
    kept = retrieve("book a house in Austin for two adults", units, build_retriever("dense"), top_units=1)
    assert [c.unit for c, _ in kept] == [1]  # the earlier of the tied units


def test_alpha_defaults_to_the_judgers_own(tmp_path: Path) -> None:
    info = {"head": "cross_encoder", "base": "minilm", "max_length": 64, "adapter": False}
    (tmp_path / "memrl_judger.json").write_text(json.dumps(info | {"alpha": 0.3}))
    assert resolve_alpha(0.8, tmp_path) == (0.8, "given")
    alpha, source = resolve_alpha(None, tmp_path)
    assert alpha == 0.3 and "training split" in source
    (tmp_path / "memrl_judger.json").write_text(json.dumps(info))  # trained before it chose one
    assert resolve_alpha(None, tmp_path)[0] == DEFAULT_ALPHA == resolve_alpha(None, None)[0]
