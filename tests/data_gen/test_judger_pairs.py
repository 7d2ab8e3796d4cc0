"""The judger pair: one writer (`write_pairs`), one reader (`read_pairs`), strict on memrl's own files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import bad_row

from memrl.core.errors import ConfigError
from memrl.data_gen.judger_pairs import read_pairs, write_pairs

# A line of pairs.jsonl as `memrl data judger` wrote it before the pair was typed (key order included).
WRITTEN = (
    '{"key": "7/3/1/date", "query_id": "7/3", "persona_id": 7, "session_id": 3, "service": "Restaurants_1", '
    '"intent": "ReserveRestaurant", "context": [{"speaker": "user", "utterance": "A table at Café Z, please."}], '
    '"intent_query": "reserve a table at a restaurant; restaurant name Café Z", "missing_slots": ["date"], '
    '"missing_descriptions": ["Date of the reservation"], "memory_session_id": 1, "memory_intent": "reserve a table", '
    '"memory_service": "Restaurants_1", "slot": "date", "question": "What date?", "answer": "March 3rd", "label": 1, '
    '"negative": null}'
)


def test_a_written_line_reads_back_and_writes_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(WRITTEN + "\n")
    [pair] = read_pairs(path)
    assert (pair.key, pair.persona_id, pair.label, pair.negative) == ("7/3/1/date", 7, 1, None)
    assert pair.candidate().text() == "reserve a table. What date? March 3rd"
    item = pair.judger_input()
    assert (item.missing, item.slot, item.task) == (("date",), "date", pair.intent_query)
    copy = write_pairs([pair], tmp_path / "copy" / "pairs.jsonl")
    assert copy.read_text() == json.dumps(json.loads(WRITTEN), ensure_ascii=False) + "\n"
    assert read_pairs(copy) == [pair]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slot": None}, "judger pair lacks slot"),
        ({"persona_id": "7"}, "judger pair's `persona_id` must be an integer, got a string"),
        ({"context": [{"speaker": "user"}]}, "judger pair's `context` must be a list of turns"),
        ({"missing_slots": "date"}, "judger pair's `missing_slots` must be a list of texts, got a string"),
        ({"label": 2}, "judger pair's `label` must be 0 or 1, got 2"),
        ({"label": True}, "judger pair's `label` must be 0 or 1, got True"),
        ({"negative": 3}, "judger pair's `negative` must be text, got a number"),
    ],
)
def test_a_bad_row_is_one_line_naming_file_line_and_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(f"{WRITTEN}\n{bad_row(WRITTEN, change)}\n")
    with pytest.raises(ConfigError) as exc:
        read_pairs(path)
    assert str(exc.value).startswith(f"{path}:2: {message}")
    assert "\n" not in str(exc.value)


def test_a_file_without_pairs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n")
    with pytest.raises(ConfigError, match=rf"^{path}: no judger pairs$"):
        read_pairs(path)
