"""Judger data from the MS-TOD fixture: labels, negative kinds, the split by individual, and `memrl data judger`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support import FIXTURES, MemrlCLI
from typer.testing import CliRunner

from memrl.app.cli.data import data_app
from memrl.core.errors import MemrlError
from memrl.data_gen.config import JudgerDataConfig
from memrl.data_gen.judger import (
    NEGATIVE_KINDS,
    build_judger_dataset,
    check_disjoint,
    individual_rows,
    split_individuals,
)
from memrl.data_gen.judger_pairs import JudgerPair, read_pairs
from memrl.envs.tod.formats import LoadProblems, load_individual, load_tod_dir
from memrl.envs.tod.memory import build_memory_bank
from memrl.envs.tod.schema import load_schemas

MSTOD = FIXTURES / "mstod"
RELEASE = FIXTURES / "mstod_release"
SGD = FIXTURES / "sgd"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("judger")
    return out, build_judger_dataset(JudgerDataConfig(tod_dir=MSTOD, eval_individuals=2, seed=0), out)


def test_labels_follow_task_missing_slot_and_confirmed_value(dataset: tuple[Path, dict[str, Any]]) -> None:
    out, _ = dataset
    individuals = {i.persona_id: i for i in load_tod_dir(MSTOD)}
    rows = read_pairs(out / "train" / "pairs.jsonl") + read_pairs(out / "eval" / "pairs.jsonl")
    assert len({r.key for r in rows}) == len(rows)
    kinds = {r.negative for r in rows if not r.label}
    assert {"same_intent", "other_intent", "filled", "superseded"} <= kinds <= set(NEGATIVE_KINDS)
    queries: dict[str, list[JudgerPair]] = {}
    for row in rows:
        queries.setdefault(row.query_id, []).append(row)
        ind = individuals[row.persona_id]
        by_session = {s.session_id: s for s in ind.sessions}
        query, memory = by_session[row.session_id], by_session[row.memory_session_id]
        assert query.confirming and row.memory_session_id < row.session_id  # causal: earlier sessions only
        assert list(row.context) == [{"speaker": t.speaker, "utterance": t.utterance} for t in query.context()]
        goal = ind.confirmed(query.reference_dialogue_id)
        same_task = memory.reference_dialogue_id == query.reference_dialogue_id
        restated = {s for t in query.context() for s in t.slots}
        if row.label:
            assert same_task and row.slot in row.missing_slots and row.slot not in restated
            assert row.answer == goal[row.slot]
        elif row.negative in ("same_intent", "other_intent"):
            assert not same_task and (memory.intent == query.intent) == (row.negative == "same_intent")
        elif row.negative == "filled":
            assert same_task and row.slot in restated and row.answer == goal[row.slot]
        else:
            assert same_task and row.negative == "superseded" and row.answer != goal[row.slot]
    assert len(queries) == 36
    for query_rows in queries.values():  # every slot the context misses has exactly one gold pair
        goal_missing = {r.slot for r in query_rows if r.label}
        assert goal_missing and len([r for r in query_rows if r.label]) == len(goal_missing)
        for row in query_rows:  # template memory: a unit of the same task is described by the query's anchor
            assert not row.label or row.intent_query.startswith(row.memory_intent)
        assert len(query_rows[0].missing_descriptions) == len(query_rows[0].missing_slots)


def test_split_is_by_individual_and_stats_count_both(dataset: tuple[Path, dict[str, Any]]) -> None:
    out, stats = dataset
    assert json.loads((out / "stats.json").read_text()) == stats
    train_ids, eval_ids = stats["individuals"]["train"], stats["individuals"]["eval"]
    assert len(eval_ids) == 2 and sorted(train_ids + eval_ids) == list(range(1, 7))
    for split, ids in (("train", train_ids), ("eval", eval_ids)):
        rows = read_pairs(out / split / "pairs.jsonl")
        assert {r.persona_id for r in rows} == set(ids)
        s = stats[split]
        assert s["rows"] == len(rows) == s["positives"] + s["negatives"]
        assert s["positives"] == sum(r.label for r in rows)
        assert s["positive_rate"] == round(s["positives"] / s["rows"], 4)
        assert sum(s["negatives_by_kind"].values()) == s["negatives"]
        assert s["queries_without_positive"] == 0
    assert split_individuals(range(1, 7), 2, seed=0) == (train_ids, eval_ids)
    assert split_individuals(range(1, 11), eval_fraction=0.3, seed=0)[1] == sorted(
        split_individuals(range(1, 11), 3, seed=0)[1]
    )


def test_overlapping_splits_are_refused() -> None:
    rows = [SimpleNamespace(persona_id=3), SimpleNamespace(persona_id=5)]
    check_disjoint(rows[:1], rows[1:])  # type: ignore[arg-type]
    with pytest.raises(MemrlError, match=r"train and eval share 1 individual.*persona 3"):
        check_disjoint(rows, [SimpleNamespace(persona_id=3)])  # type: ignore[arg-type]
    with pytest.raises(MemrlError, match="each split needs at least 1 individual"):
        split_individuals([1, 2], 2)


def test_released_file_gives_rows_from_what_was_said() -> None:
    schemas = load_schemas(FIXTURES / "sgd")
    ind = load_individual(RELEASE / "persona_1.json", schemas, LoadProblems())
    rows = individual_rows(ind, build_memory_bank(ind, schemas), schemas)
    gold = {(r.query_id, r.slot, r.answer) for r in rows if r.label}
    assert gold == {
        ("1/4", "number_of_riders", "2"),
        ("1/5", "location", "Emeryville"),
        ("1/5", "number_of_seats", "4"),
        ("1/5", "time", "7:30 pm"),
        ("1/5", "date", "March 8th"),
    }
    # The first session said March 7th; the user moved it to the 8th later, so memory holds a superseded value.
    superseded = [(r.memory_session_id, r.slot, r.answer) for r in rows if r.negative == "superseded"]
    assert superseded == [(1, "date", "March 7th")]


def test_cli_prints_sizes_and_class_balance(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        data_app, ["judger", "--tod-dir", str(MSTOD), "--out", str(tmp_path), "--eval-fraction", "0.34"]
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip())
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert len(stats["individuals"]["eval"]) == 2
    for split in ("train", "eval"):
        assert printed[split]["rows"] == stats[split]["rows"] > 0
        assert printed[split]["positive_rate"] == stats[split]["positive_rate"]
        assert set(printed[split]["negatives_by_kind"]) == set(NEGATIVE_KINDS)


def _judger_cli(*args: object) -> Any:
    return CliRunner().invoke(data_app, ["judger", *map(str, args)])


def test_release_folder_with_bare_names_builds_against_an_sgd_folder(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    tod = tmp_path / "tod"
    tod.mkdir()
    for path in RELEASE.glob("persona_*.json"):
        (tod / path.name).write_text(path.read_text())
    (tod / "persona_3.json").write_text("not json at all")
    result = _judger_cli("--tod-dir", tod, "--schema", SGD, "--out", tmp_path / "j", "--eval-individuals", 1)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip())
    stats = json.loads((tmp_path / "j" / "stats.json").read_text())
    assert printed["problems"] == stats["problems"]
    assert printed["train"]["rows"] + printed["eval"]["rows"] > 0
    dropped, skipped = stats["problems"]["dropped_slots"], stats["problems"]["skipped_files"]
    assert dropped["count"] == 1
    assert dropped["slots"][0] | {"file": ""} == {
        "file": "",
        "session_id": 4,
        "service": "RideSharing",
        "slot": "number_of_seats",
        "where": "confirmation_state.slot_values.number_of_seats",
    }
    assert dropped["slots"][0]["file"].endswith("persona_1.json")
    assert skipped["count"] == 1 and skipped["files"][0]["file"].endswith("persona_3.json")
    assert sorted(stats["individuals"]["train"] + stats["individuals"]["eval"]) == [1, 2]
    rows = read_pairs(tmp_path / "j" / "train" / "pairs.jsonl") + read_pairs(tmp_path / "j" / "eval" / "pairs.jsonl")
    assert {r.service for r in rows} == {"Restaurants", "RideSharing"}
    assert any(r.negative == "superseded" for r in rows)
    # 16 confirmed values; the memory written from the words holds 11 (not the True/False ride sharing, not the
    # lower-case "airport", not the two values persona 2 first states while confirming).
    assert printed["memory"] == stats["memory"]
    assert stats["memory"] | {"writer_failures": 0} == {
        "writer": "text",
        "writer_failures": 0,
        "gold_facts": 16,
        "held": 11,
        "held_rate": 0.6875,
        "in_context": 6,
        "superseded_pairs": 1,
    }

    def strict_error() -> str:
        run = memrl_cli("data", "judger", "--tod-dir", tod, "--schema", SGD, "--out", tmp_path / "s", "--strict")
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("memrl: error: "), run.stderr
        assert not (tmp_path / "s" / "stats.json").exists()
        return lines[0]

    assert "persona_1.json: sessions[3].confirmation_state.slot_values.number_of_seats" in strict_error()
    (tod / "persona_1.json").unlink()
    assert "persona_3.json: not valid JSON" in strict_error()


@pytest.mark.parametrize("schema", ["file", "folder"])
def test_schema_takes_a_file_or_a_folder(schema: str, tmp_path: Path) -> None:
    path = MSTOD / "schema.json" if schema == "file" else SGD
    result = _judger_cli("--tod-dir", MSTOD, "--schema", path, "--out", tmp_path, "--eval-individuals", 2)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip())["problems"]["dropped_slots"]["count"] == 0
    missing = _judger_cli("--tod-dir", MSTOD, "--schema", tmp_path / "nowhere", "--out", tmp_path / "o")
    assert missing.exit_code != 0 and "schema not found" in str(missing.exception)


UNSCORED = FIXTURES / "mstod_unscored"  # a whole goal of another service's slots; a confirmation id on a user turn


def test_sessions_that_cannot_be_scored_are_no_queries(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = _judger_cli("--tod-dir", UNSCORED, "--out", tmp_path / "j", "--eval-individuals", 1)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip())
    rows = read_pairs(tmp_path / "j" / "train" / "pairs.jsonl") + read_pairs(tmp_path / "j" / "eval" / "pairs.jsonl")
    assert {r.query_id for r in rows} == {"7/3", "8/2"}  # not 7/2 (empty goal) nor 7/4 (confirmed by the user)
    unscored = printed["problems"]["unscored_sessions"]
    assert unscored["count"] == 2 and [u["session_id"] for u in unscored["sessions"]] == [2, 4]
    strict = memrl_cli("data", "judger", "--tod-dir", UNSCORED, "--out", tmp_path / "s", "--strict")
    lines = strict.stderr.strip().splitlines()
    assert strict.returncode == 2 and len(lines) == 1, strict.stderr
    assert "persona_7.json: sessions[1].confirmation_state.slot_values.number_of_riders" in lines[0]
