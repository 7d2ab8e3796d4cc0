"""The MS-TOD session record: one writer (`to_dict`), one reader (`read_session`), strict on memrl's own files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import bad_row

from memrl.core.errors import ConfigError
from memrl.envs.tod.records import read_session

# A line of sessions.jsonl as `memrl eval tod` wrote it before the record was typed (key order included), shortened.
WRITTEN = (
    '{"key": "1/11", "persona_id": 1, "session_id": 11, "reference_dialogue_id": "train-1_00012", "service": '
    '"Restaurants_1", "intent": "ReserveRestaurant", "goal": {"city": "San Francisco", "time": "6:30 pm"}, '
    '"context_turns": 3, "memory_units": 10, "intent_query": "reserve a table at a restaurant", "missing_slots": '
    '["city", "time"], "reasoning": "", "ranked": [{"key": "1/11/7/city", "slot": "city", "answer": "San Francisco", '
    '"retrieval": 1.0, "judger": null, "final": 1.0}], "a_core": ["San Francisco"], "gold": ["1/11/7/city", '
    '"1/11/7/time"], "confirmation": "A table in San Francisco?", "turns": [{"speaker": "assistant", "utterance": '
    '"A table in San Francisco?"}, {"speaker": "user", "utterance": "At 6:30 pm.", "slots": {"time": "6:30 pm"}}], '
    '"outstanding": [["time"], []], "jga": 0.0, "slot_accuracy": 0.5, "correct_slots": {"city": true, "time": false}, '
    '"dte": 2, "success": true, "recall@1": 0.5, "pair_recall@1": 0.5, "ceiling_recall@1": 0.5, '
    '"ceiling_pair_recall@1": 0.5, "retrieval_recall@1": 0.5, "retrieval_pair_recall@1": 0.5, "judger_recall@1": '
    'null, "judger_pair_recall@1": null, "failures": {"intent": 0, "reader": 0, "quality": 0}, "quality": 7}'
)


def test_a_written_line_reads_back_and_writes_the_same_bytes(tmp_path: Path) -> None:
    record = read_session(json.loads(WRITTEN), tmp_path)
    assert (record.key, record.persona_id, record.dte, record.success) == ("1/11", 1, 2, True)
    assert record.gold == ("1/11/7/city", "1/11/7/time") and record.turns[1]["slots"] == {"time": "6:30 pm"}
    assert record.outstanding == (("time",), ()) and record.correct_slots == {"city": True, "time": False}
    assert record.recalls["recall@1"] == 0.5 and record.recalls["judger_recall@1"] is None
    assert (record.rated, record.quality) == (True, 7)
    assert json.dumps(record.to_dict()) == WRITTEN
    unrated = bad_row(WRITTEN, {"quality": None})  # no quality judge: no `quality` key at all
    assert json.dumps(read_session(json.loads(unrated), tmp_path).to_dict()) == unrated
    unusable = read_session(json.loads(WRITTEN) | {"quality": None}, tmp_path)  # the judge's reply was unusable
    assert unusable.rated and unusable.to_dict()["quality"] is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gold": None, "dte": None}, "TOD session record lacks gold, dte"),
        ({"persona_id": "1"}, "TOD session record's `persona_id` must be an integer, got a string"),
        ({"goal": {"city": 3}}, "TOD session record's `goal` must be an object of texts, got an object"),
        ({"ranked": [{"key": "1/11/7/city"}]}, "TOD session record's `ranked` must be a list of objects, each with"),
        ({"outstanding": ["time"]}, "TOD session record's `outstanding` must be a list of lists of texts"),
        ({"correct_slots": {"city": 1}}, "TOD session record's `correct_slots` must be an object of true/false"),
        ({"success": 1}, "TOD session record's `success` must be true or false, got a number"),
        ({"recall@1": "0.5"}, "TOD session record's `recall@1` must be a number, got a string"),
        ({"quality": 7.5}, "TOD session record's `quality` must be an integer, got a number"),
    ],
)
def test_a_bad_row_is_one_line_naming_file_row_and_key(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        read_session(json.loads(bad_row(WRITTEN, change)), tmp_path)
    assert str(exc.value).startswith(f"{tmp_path / 'sessions.jsonl'}: session '1/11': {message}")
    assert "\n" not in str(exc.value)
