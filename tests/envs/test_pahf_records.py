"""The PAHF task record: one writer (`to_dict`), readers (`read_task`, `read_tasks`) strict on memrl's own files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import bad_row

from memrl.core.errors import ConfigError
from memrl.envs.pahf.agent import Outcome, Task, Write
from memrl.envs.pahf.protocol import Job
from memrl.envs.pahf.records import TaskRecord, read_task, read_tasks

# A line of tasks.jsonl as `memrl eval pahf` wrote it before the record was typed (key order included).
WRITTEN = (
    '{"key": "1/Mira/1/0", "phase": 1, "user": "Mira", "index": 1, "pass": 0, "instruction": "I need a desk lamp", '
    '"options": {"A": "desk lamp with LED panel", "B": "desk lamp with halogen bulb", "D": "buy nothing"}, "gold": '
    '"A", "product": "desk lamp", "choice": "B", "correct": false, "thought": "bright", "question": "Which bulb?", '
    '"answer": "Not halogen.", "feedback": "I said no halogen.", "used_feedback": true, "retrieved": [{"id": 1, '
    '"text": "Mira likes LED panels", "score": 0.91}], "summary": "LED panels", "writes": [{"source": "answer", '
    '"text": "Not halogen.", "salient": true, "note": "Mira avoids halogen", "action": "merge", "note_id": 1, '
    '"similarity": 0.83}, {"source": "feedback", "text": "I said no halogen.", "salient": false, "note": "", '
    '"action": "skip"}], "failures": {"decision": 0, "summary": 0, "salience": 1, "note": 0, "merge": 0}, "notes": '
    '["Mira avoids halogen"]}'
)


def test_a_written_line_reads_back_and_writes_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(f'{WRITTEN}\n{{"key": "torn')  # a killed run's last line is left out
    [record] = read_tasks(path)
    assert (record.key, record.pass_, record.product, record.correct, record.used_feedback) == (
        "1/Mira/1/0",
        0,
        "desk lamp",
        False,
        True,
    )
    assert record.writes[0].note_id == 1 and record.writes[1].action == "skip" and record.retrieved_ids == {1}
    assert record.unusable_decision is None and record.notes == ("Mira avoids halogen",)
    assert json.dumps(record.to_dict()) == WRITTEN
    # An embodied task has no product; a reply that named no action is kept.
    embodied = WRITTEN.replace('"product": "desk lamp", ', "").replace('"choice": "B"', '"choice": null')
    unusable = embodied.replace('"notes": [', '"unusable_decision": "31 83Answers", "notes": [')
    assert json.dumps(read_task(json.loads(unusable), tmp_path).to_dict()) == unusable


def test_the_record_of_an_outcome_counts_every_failure_kind() -> None:
    job = Job("1/Mira/1/0", 1, "Mira", 1, 0, {"product": "desk lamp"}, "persona")
    task = Task("shopping", "Mira", "I need a desk lamp", {"A": "LED", "D": "buy nothing"}, "A")
    outcome = Outcome("A", True, writes=[Write("feedback", "ok", False)], failures=Counter(note=2))
    record = TaskRecord.of(job, task, outcome, ["a note"])
    assert record.failures == {"decision": 0, "summary": 0, "salience": 0, "note": 2, "merge": 0}
    assert (record.product, record.notes, record.used_feedback) == ("desk lamp", ("a note",), False)
    assert "unusable_decision" not in record.to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"notes": None, "pass": None}, "PAHF task record lacks pass, notes"),
        ({"phase": "1"}, "PAHF task record's `phase` must be an integer, got a string"),
        ({"correct": 0}, "PAHF task record's `correct` must be true or false, got a number"),
        ({"options": ["A"]}, "PAHF task record's `options` must be an object of texts, got a list"),
        ({"retrieved": [{"id": 1}]}, "PAHF task record's `retrieved` must be a list of objects, each with text"),
        ({"writes": [{"source": "answer"}]}, "write 0: note write lacks text, salient, note, action"),
        ({"writes": [{"source": "user", "text": "", "salient": True, "note": "", "action": "skip"}]},
         "write 0: note write's `source` must be 'answer' or 'feedback', got 'user'"),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_file_line_and_key(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(f"{WRITTEN}\n{bad_row(WRITTEN, change)}\n")
    with pytest.raises(ConfigError) as exc:
        read_tasks(path)
    assert str(exc.value).startswith(f"{path}:2: {message}")
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'tasks.jsonl'}: task '1/Mira/1/0': "):
        read_task(json.loads(bad_row(WRITTEN, change)), tmp_path)
