"""The collab session record: one writer (`to_dict`), one reader (`read_sessions`), strict on memrl's own files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import bad_row

from memrl.core.errors import ConfigError
from memrl.envs.collab.records import read_sessions

# A line of sessions.jsonl as `memrl eval collab` wrote it before the record was typed (key order included).
WRITTEN = (
    '{"key": "u1/0", "user_id": "u1", "session": 0, "task": "arith", "problem_id": "arith-3", "agent": "memory", '
    '"preferences": ["bullets", "direct"], "turns": [{"role": "user", "content": "What is 2+3?", "enforce": false, '
    '"violated": [], "checker_violated": [], "checker_decided": false}, {"role": "assistant", "content": "5", '
    '"retrieved": null}, {"role": "user", "content": "Use bullets.", "enforce": true, "violated": ["bullets"], '
    '"checker_violated": ["bullets"], "checker_decided": true}], "unsaid_reaction": null, "enforcing_utterances": '
    '["Use bullets."], "draft_answer": "5", "gold_answer": "5", "grade": {"correct": true, "method": "math_verify", '
    '"reasoning": ""}, "task_success": 1, "user_effort": 1, "length": 3, "ended_by": "user", "truncations": '
    '{"user": 0}, "notes_before": "", "notes_after": "- bullets", "reflection_reasoning": "asked for bullets", '
    '"reflection_raw": "{}", "parse_failures": {"agent": 0, "user": 0, "retrieval": 0, "reflection": 0}, "memory": '
    '{"notes": "- bullets", "transcripts": []}, "started_at": 1700000000.5, "finished_at": 1700000003.25, "node": '
    "null}"
)


def test_a_written_line_reads_back_and_writes_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    path.write_text(WRITTEN + "\n")
    [record] = read_sessions(path)
    assert (record.key, record.user_id, record.session, record.problem_id) == ("u1/0", "u1", 0, "arith-3")
    assert record.preferences == ("bullets", "direct")
    assert record.enforcing_utterances == ("Use bullets.",)
    assert record.parse_failures["reflection"] == 0 and record.memory["notes"] == "- bullets"
    assert json.dumps(record.to_dict()) == WRITTEN


def test_records_of_older_runs_and_hand_written_inputs_still_read(tmp_path: Path) -> None:
    """Runs before `truncations`, `unsaid_reaction`, `enforcing_utterances` and `node` were written, and the six
    keys `memrl data reflection` has always required, read with what those keys would have said."""
    old = json.loads(WRITTEN)
    for key in ("truncations", "unsaid_reaction", "enforcing_utterances", "node"):
        del old[key]
    minimal = {k: old[k] for k in ("user_id", "session", "problem_id", "task", "preferences", "turns")}
    path = tmp_path / "sessions.jsonl"
    path.write_text(f"{json.dumps(old)}\n{json.dumps(minimal)}\n")
    older, hand_written = read_sessions(path)
    assert older.truncations == {} and older.unsaid_reaction is None and older.node is None
    assert older.enforcing_utterances == ("Use bullets.",)  # from the turns that enforced
    assert hand_written.key == "u1/0" and hand_written.notes_before == ""
    assert (hand_written.user_effort, hand_written.length) == (1, 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"turns": None, "session": None}, "session record lacks session, turns"),
        ({"session": "0"}, "session record's `session` must be an integer, got a string"),
        ({"session": True}, "session record's `session` must be an integer, got true"),
        ({"preferences": "bullets"}, "session record's `preferences` must be a list of texts, got a string"),
        ({"turns": [{"role": "user"}]}, "session record's `turns` must be a list of turns"),
        ({"parse_failures": {"agent": "1"}}, "session record's `parse_failures` must be an object of counts"),
        ({"memory": []}, "session record's `memory` must be an object, got a list"),
    ],
)
def test_a_bad_row_is_one_line_naming_file_line_and_key(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = tmp_path / "sessions.jsonl"
    path.write_text(f"{WRITTEN}\n\n{bad_row(WRITTEN, change)}\n")
    with pytest.raises(ConfigError) as exc:
        read_sessions(path)
    assert str(exc.value).startswith(f"{path}:3: {message}")
    assert "\n" not in str(exc.value)


def test_what_is_no_session_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sessions file not found"):
        read_sessions(tmp_path / "missing.jsonl")
    path = tmp_path / "sessions.jsonl"
    path.write_text(f"{WRITTEN}\n[1, 2]\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: expected a JSON object, got a list$"):
        read_sessions(path)
    path.write_text(f"{WRITTEN}\n{{not json")  # a file the user names: its last line is no torn write
    with pytest.raises(ConfigError, match=rf"^{path}:2: not valid JSON"):
        read_sessions(path)
