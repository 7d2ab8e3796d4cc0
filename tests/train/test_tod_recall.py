"""Recall@k over distinct gold facts beside the per-pair figure, and the ceilings that separate a ranking's misses
from what the data allows (`envs.tod.ranking`, used by `memrl eval judger` and `memrl eval tod`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support import tod_session

from memrl.envs.tod.labels import same_value
from memrl.envs.tod.metrics import compute_metrics, session_scores
from memrl.envs.tod.ranking import RankedQuery, ceiling_at_k, fact_of, mean_scores, recall_at_k, recall_names


def _pair(session: int, slot: str) -> str:
    return f"7/9/{session}/{slot}"  # persona/query session/memory session/slot, as the judger data keys pairs


# The user gave the date in sessions 1, 2 and 3 (spelled three ways), the time in 2 and 3, the party size in 3;
# session 4 is another restaurant task whose party size is the same value, session 5 one with another date.
STORED = {
    _pair(1, "date"): ("date", "March 10th"),
    _pair(2, "date"): ("date", "march 10th."),
    _pair(3, "date"): ("date", "March  10th"),
    _pair(2, "time"): ("time", "6 pm"),
    _pair(3, "time"): ("time", "6 PM"),
    _pair(3, "party_size"): ("party_size", "2"),
    _pair(4, "party_size"): ("party_size", "2"),
    _pair(5, "date"): ("date", "March 11th"),
}
FACTS = {key: fact_of(slot, value) for key, (slot, value) in STORED.items()}
GOLD = {key for key in STORED if key.split("/")[2] in {"1", "2", "3"}}  # 6 pairs, 3 facts


def test_fact_of_compares_values_as_the_gold_labels_do() -> None:
    values = ["March 10th", "march 10th.", "March  10th", " MARCH 10TH!", "March 11th", "6 pm", "6pm", "2", "two"]
    for a in values:
        for b in values:
            assert (fact_of("date", a) == fact_of("date", b)) == same_value(a, b), (a, b)
    assert fact_of("date", "2") != fact_of("party_size", "2")  # a fact is a slot and its value
    assert len({FACTS[key] for key in GOLD}) == 3


def test_duplicates_cap_pair_recall_but_not_a_perfect_ranking() -> None:
    """One pair per fact first, then the duplicates: perfect for facts, and the best pairs can do too."""
    ranked = [_pair(1, "date"), _pair(2, "time"), _pair(3, "party_size"), _pair(2, "date"), _pair(3, "time"),
              _pair(3, "date"), _pair(4, "party_size"), _pair(5, "date")]  # fmt: skip
    query = RankedQuery(ranked, GOLD, FACTS, list(STORED))
    scores = query.recalls([1, 3, 5]) | query.ceilings([1, 3, 5])
    assert scores["recall@3"] == scores["recall@5"] == 1.0
    assert scores["pair_recall@3"] == 0.5 and scores["pair_recall@5"] == pytest.approx(5 / 6)
    # The ceiling says the cap is the data's: no ranking of these pairs gets more.
    assert scores["ceiling_pair_recall@3"] == 0.5 and scores["ceiling_pair_recall@5"] == pytest.approx(5 / 6)
    assert scores["ceiling_recall@3"] == scores["ceiling_recall@5"] == 1.0
    # At k=1 a single slot holds one fact of three, whatever the ranking.
    assert scores["recall@1"] == scores["ceiling_recall@1"] == pytest.approx(1 / 3)
    assert scores["pair_recall@1"] == scores["ceiling_pair_recall@1"] == pytest.approx(1 / 6)
    assert list(scores) == [*recall_names([1, 3, 5]), *(f"ceiling_{n}" for n in recall_names([1, 3, 5]))]


def test_a_ranking_that_finds_one_fact_of_two_falls_short_of_its_ceiling() -> None:
    """Gold: the date (sessions 1, 2) and the time (session 2). The top 3 repeat the date and miss the time."""
    gold = {_pair(1, "date"), _pair(2, "date"), _pair(2, "time")}
    ranked = [_pair(1, "date"), _pair(2, "date"), _pair(5, "date"), _pair(2, "time")]
    assert recall_at_k(ranked, gold, 3, FACTS) == 0.5
    assert recall_at_k(ranked, gold, 3) == pytest.approx(2 / 3)  # pairs can score above facts on repeats
    assert ceiling_at_k(STORED, gold, 3, FACTS) == ceiling_at_k(STORED, gold, 3) == 1.0  # a ranking problem
    assert recall_at_k(ranked, gold, 4, FACTS) == recall_at_k(ranked, gold, 4) == 1.0


def test_a_pair_of_another_task_with_the_gold_value_carries_the_fact() -> None:
    gold = {_pair(3, "party_size"), _pair(3, "time")}
    ranked = [_pair(4, "party_size"), _pair(3, "time")]  # session 4's pair states the same party size
    assert recall_at_k(ranked, gold, 1, FACTS) == 0.5 and recall_at_k(ranked, gold, 1) == 0.0
    assert recall_at_k([_pair(5, "date")], {_pair(1, "date")}, 1, FACTS) == 0.0  # another value is another fact


def test_k_beyond_the_candidates() -> None:
    gold = {_pair(1, "date"), _pair(2, "date"), _pair(2, "time")}
    pool = [*gold, _pair(5, "date")]
    ranked = [_pair(5, "date"), _pair(2, "time"), _pair(1, "date"), _pair(2, "date")]
    assert recall_at_k(ranked, gold, 10, FACTS) == recall_at_k(ranked, gold, 10) == 1.0
    assert ceiling_at_k(pool, gold, 10, FACTS) == ceiling_at_k(pool, gold, 10) == 1.0
    # Retrieval kept only two units: the gold pair it dropped is a miss, and the ceiling (over every stored pair)
    # shows that the ranking, not the data, lost it.
    kept = [_pair(5, "date"), _pair(2, "time"), _pair(2, "date")]
    assert recall_at_k(kept, gold, 10) == pytest.approx(2 / 3) and recall_at_k(kept, gold, 10, FACTS) == 1.0
    # Gold that no candidate carries caps the ceiling itself.
    assert ceiling_at_k([_pair(2, "time")], gold, 10, FACTS) == 0.5
    assert ceiling_at_k([_pair(2, "time")], gold, 10) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="k must be positive"):
        ceiling_at_k(pool, gold, 0)


def test_no_gold_is_left_out_of_the_means() -> None:
    empty = RankedQuery(["a"], set(), FACTS)
    assert all(math.isnan(v) for v in (empty.recalls([1]) | empty.ceilings([1])).values())
    found = RankedQuery([_pair(1, "date")], {_pair(1, "date"), _pair(2, "date")}, FACTS)
    means = mean_scores([found.recalls([1]), empty.recalls([1])])
    assert means == {"recall@1": 1.0, "pair_recall@1": 0.5}


def test_tod_session_scores_and_metrics_carry_both_recalls() -> None:
    goal = {"date": "March 10th", "time": "6 pm", "party_size": "2"}
    ranked = [_pair(1, "date"), _pair(2, "date"), _pair(3, "date"), _pair(3, "time"), _pair(2, "time")]
    scores = session_scores("March 10th at 6 pm for 2", goal, 1, True, ranked, GOLD, FACTS, list(STORED))
    assert scores["recall@3"] == pytest.approx(1 / 3) and scores["pair_recall@3"] == 0.5
    assert scores["ceiling_recall@3"] == 1.0 and scores["ceiling_pair_recall@3"] == 0.5
    assert scores["recall@5"] == pytest.approx(2 / 3) and scores["ceiling_recall@5"] == 1.0
    none = session_scores("?", goal, 1, True, ranked, [], FACTS, list(STORED))
    assert none["recall@1"] is None and none["ceiling_pair_recall@5"] is None
    # Without facts each pair is a fact of its own: the two figures agree.
    plain = session_scores("?", goal, 1, True, ["a", "b"], ["b", "c"])
    assert plain["recall@1"] == plain["pair_recall@1"] == 0.0 and plain["recall@3"] == plain["pair_recall@3"] == 0.5
    assert plain["ceiling_recall@1"] == 0.5

    record = tod_session(**scores, persona_id=7, gold=sorted(GOLD))
    metrics = compute_metrics([record, tod_session(**none, persona_id=7)])
    assert metrics["recall@5"] == pytest.approx(2 / 3, abs=1e-4) and metrics["pair_recall@5"] == pytest.approx(
        5 / 6, abs=1e-4
    )
    assert metrics["ceiling_pair_recall@5"] == pytest.approx(5 / 6, abs=1e-4) and metrics["sessions_with_gold"] == 1


def test_a_record_from_before_fact_recall_is_scored_again() -> None:
    """Its `recall@k` was the pair figure; the kept ranking, the gold keys and the goal give both figures."""
    goal = {"date": "March 10th", "time": "6 pm", "party_size": "2"}
    ranked = [_pair(1, "date"), _pair(2, "date"), _pair(2, "time"), _pair(4, "party_size"), _pair(3, "date")]
    old = {
        "persona_id": 7, "jga": 1.0, "correct_slots": {"date": True}, "dte": 1, "success": True, "failures": {},
        "goal": goal, "gold": sorted(GOLD), "recall@1": 1 / 6, "recall@3": 0.5, "recall@5": 4 / 6,
        "ranked": (pairs := [{"key": k, "slot": STORED[k][0], "answer": STORED[k][1], "judger": None} for k in ranked]),
    }  # fmt: skip
    metrics = compute_metrics([tod_session(**old)])
    assert metrics["pair_recall@3"] == 0.5 and metrics["pair_recall@5"] == pytest.approx(4 / 6, abs=1e-4)
    assert metrics["recall@3"] == pytest.approx(2 / 3, abs=1e-4) and metrics["recall@5"] == 1.0
    assert metrics["ceiling_recall@1"] == pytest.approx(1 / 3, abs=1e-4)
    # Ranked without a judger: its ranking was retrieval's, the judger column stays empty.
    assert metrics["retrieval_pair_recall@3"] == 0.5 and metrics["retrieval_recall@5"] == 1.0
    assert metrics["judger_recall@5"] is None and metrics["sessions_without_rankings"] == 0
    fused = [{**p, "judger": 0.5} for p in pairs]  # fused with a judger: retrieval's order is unknown
    again = compute_metrics([tod_session(**old | {"ranked": fused})])
    assert again["retrieval_recall@5"] is None and again["sessions_without_rankings"] == 1


def test_eval_judger_reports_fact_and_pair_recall_with_their_ceilings(tmp_path: Path) -> None:
    """Retrieval alone on one query whose four stored pairs are all gold: two facts, the date stored three times."""
    from memrl.train.judger.evaluate import evaluate_judger

    stored = [(1, "date", "March 10th"), (2, "date", "March 10th"), (3, "date", "march 10th"), (3, "time", "6 pm")]
    rows = [
        {"key": _pair(s, slot), "query_id": "7/9", "persona_id": 7, "session_id": 9, "service": "Restaurants_1",
         "intent": "ReserveRestaurant", "context": [], "intent_query": "reserve a table at Ariake",
         "missing_slots": ["date", "time"], "missing_descriptions": ["the date", "the time"], "memory_session_id": s,
         "memory_intent": "reserve a table at Ariake", "memory_service": "Restaurants_1", "slot": slot,
         "question": f"What {slot}?", "answer": value, "label": 1, "negative": None}
        for s, slot, value in stored
    ]  # fmt: skip
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = evaluate_judger(None, path, tmp_path / "out", retriever="bm25", top_units=None, ks=(1, 5))
    # Any ranking: the top pair is one fact of two and one pair of four; the top 5 hold everything.
    assert (metrics["recall@1"], metrics["pair_recall@1"]) == (0.5, 0.25)
    assert (metrics["ceiling_recall@1"], metrics["ceiling_pair_recall@1"]) == (0.5, 0.25)
    assert metrics["retrieval_recall@5"] == metrics["ceiling_pair_recall@5"] == 1.0
    assert metrics["judger_recall@1"] is None and metrics["queries_with_gold"] == 1
