"""`memrl eval tod` as users run it, on the shipped MS-TOD fixture: Ray actors, resumable output, real models."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, MemrlCLI

DATA = FIXTURES / "mstod"
RELEASE = FIXTURES / "mstod_release"
SGD = FIXTURES / "sgd"
RECALLS = tuple(f"{prefix}{measure}@{k}" for prefix in ("", "ceiling_") for measure in ("recall", "pair_recall")
                for k in (1, 3, 5))  # fmt: skip
METRICS = ("jga", "slot_accuracy", "dte", "success_rate", *RECALLS)


def _env() -> dict[str, str]:
    """One thread per CLI process, and wide enough that rich does not wrap."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]


def _confirming(persona_ids: set[int]) -> set[str]:
    keys = set()
    for path in DATA.glob("persona_*.json"):
        ind = json.loads(path.read_text())
        if ind["persona_id"] in persona_ids:
            keys |= {f"{ind['persona_id']}/{s['session_id']}" for s in ind["sessions"] if s["confirmation_state"]}
    return keys


def _check_ranges(metrics: dict[str, Any], max_turns: int) -> None:
    for key in ("jga", "slot_accuracy", "success_rate", *RECALLS):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert 1.0 <= metrics["dte"] <= max_turns
    for measure in ("recall", "pair_recall", "ceiling_recall", "ceiling_pair_recall"):
        assert metrics[f"{measure}@1"] <= metrics[f"{measure}@3"] <= metrics[f"{measure}@5"], measure
    for k in (1, 3, 5):  # no ranking beats its ceiling
        assert metrics[f"recall@{k}"] <= metrics[f"ceiling_recall@{k}"]
        assert metrics[f"pair_recall@{k}"] <= metrics[f"ceiling_pair_recall@{k}"]


@pytest.fixture
def judger(mstod_judger: Path) -> Path:
    return mstod_judger


@pytest.fixture
def judger_data(mstod_judger_data: Path) -> Path:
    return mstod_judger_data


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_template_run_writes_metrics_and_resumes_without_recomputing(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "run"
    base = ["eval", "tod", "--data", str(DATA), "--schema", str(DATA / "schema.json"), "--reader", "template",
            "--judger", "none", "--retriever", "bm25", "--individuals", "2", "--out", str(out)]  # fmt: skip
    first = memrl_cli(*base, env=_env())
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout)
    metrics = json.loads((out / "metrics.json").read_text())
    assert summary == metrics
    assert set(METRICS) <= metrics.keys()
    _check_ranges(metrics, max_turns=10)
    records = _records(out)
    assert {r["key"] for r in records} == _confirming({1, 2})
    assert metrics["sessions"] == len(records) == metrics["sessions_with_gold"]
    assert metrics["individuals"] == 2
    assert metrics["failures"] == {"intent": 0, "reader": 0, "reasoner": 0, "supervisor": 0, "user": 0}
    assert metrics["setup"]["reader"] == "template"
    assert metrics["problems"]["dropped_slots"]["count"] == metrics["problems"]["skipped_files"]["count"] == 0
    assert metrics["success_rate"] == 1.0  # the rule user fixes one slot a turn; the template restates it
    for r in records:
        assert r["dte"] == 1 + len(r["outstanding"][0])
        assert r["jga"] == float(not r["outstanding"][0])
        assert len(r["a_core"]) == 5
        assert r["turns"][0]["speaker"] == "assistant"
        assert all(s["judger"] is None for s in r["ranked"])

    # A crash mid-write leaves a torn last line: the rerun drops it and recomputes nothing that was finished.
    before = (out / "sessions.jsonl").read_bytes()
    with (out / "sessions.jsonl").open("a") as f:
        f.write('{"key": "torn')
    again = memrl_cli(*base, env=_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "sessions.jsonl").read_bytes() == before
    assert json.loads(again.stdout) == metrics
    assert "Ray" not in again.stderr  # nothing left to run: no cluster started

    other = memrl_cli(*base[:-2], "--max-turns", "3", "--out", str(out), env=_env())
    assert other.returncode == 2
    assert "holds a run with different max_turns" in other.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_release_folder_with_bare_names_and_a_broken_file(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """The release as published: bare service names resolved against an SGD folder, a foreign slot, a bad file."""
    data = tmp_path / "release"
    data.mkdir()
    for path in RELEASE.glob("persona_*.json"):
        (data / path.name).write_text(path.read_text())
    (data / "persona_3.json").write_text('{"persona_id": 3, "sessions": [')
    base = ["eval", "tod", "--data", str(data), "--schema", str(SGD), "--reader", "template", "--judger", "none",
            "--retriever", "bm25", "--sessions", "3"]  # fmt: skip
    result = memrl_cli(*base, "--out", str(tmp_path / "run"), env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout)
    _check_ranges(metrics, max_turns=10)
    assert metrics["sessions"] == 3
    dropped, skipped = metrics["problems"]["dropped_slots"], metrics["problems"]["skipped_files"]
    assert dropped["count"] == 1 and dropped["slots"][0]["slot"] == "number_of_seats"
    assert dropped["slots"][0]["file"] == str(data / "persona_1.json") and dropped["slots"][0]["session_id"] == 4
    assert skipped["count"] == 1 and skipped["files"][0]["file"] == str(data / "persona_3.json")
    assert {r["service"] for r in _records(tmp_path / "run")} <= {"Restaurants", "RideSharing"}
    ride = next(r for r in _records(tmp_path / "run") if r["key"] == "1/4")
    assert "number_of_seats" not in ride["goal"]

    strict = memrl_cli(*base, "--strict", "--out", str(tmp_path / "strict"), env=_env())
    lines = [line for line in strict.stderr.splitlines() if line.strip()]
    assert strict.returncode == 2 and len(lines) == 1, strict.stderr
    assert "persona_1.json: sessions[3].confirmation_state.slot_values.number_of_seats" in lines[0]


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_smollm2_reader_and_a_trained_judger_on_the_eval_split(
    judger: Path, judger_data: Path, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    """The default reader, served once for both workers, with a judger fused into the ranking (alpha 0.3)."""
    out = tmp_path / "judged"
    result = memrl_cli(
        "eval", "tod", "--data", str(DATA), "--reader", "smollm2", "--judger", str(judger.parent), "--alpha", "0.3",
        "--fusion", "minmax",  # the earlier scale, whose scores the check below recomputes pair by pair
        "--split-from", str(judger_data), "--top-units", "4", "--sessions", "2", "--max-turns", "1",
        "--max-tokens", "16", "--workers", "2", "--out", str(out), env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout)
    _check_ranges(metrics, max_turns=1)
    assert metrics["sessions"] == 2
    assert metrics["setup"]["reader"] == "smollm2"
    assert metrics["setup"]["judger"] == str(judger.parent)
    eval_ids = set(json.loads((judger_data / "stats.json").read_text())["individuals"]["eval"])
    records = _records(out)
    assert {r["key"] for r in records} <= _confirming(eval_ids)
    assert (out / "logs" / "serve-0.log").is_file()  # one server, shared by both workers
    assert not (out / "logs" / "serve-1.log").exists()
    for r in records:
        assert len({s["key"].split("/")[2] for s in r["ranked"]}) <= 4  # pairs of the 4 closest units only
        for s in r["ranked"]:
            assert 0.0 <= s["judger"] <= 1.0
            assert s["final"] == pytest.approx(0.3 * s["retrieval"] + 0.7 * s["judger"], abs=2e-4)
        assert [s["final"] for s in r["ranked"]] == sorted((s["final"] for s in r["ranked"]), reverse=True)
        # The model wrote the confirmation (an empty one is counted, never fatal).
        assert [t["utterance"] for t in r["turns"]] == [r["confirmation"]]
        assert r["failures"]["reader"] == int(not r["confirmation"])
        assert not r["confirmation"].startswith("Welcome back! Let me confirm")
        assert r["dte"] == 1 and r["success"] == (not r["outstanding"][0])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "/nonexistent"], "--data /nonexistent: not a folder"),
        (["--retriever", "sparse"], "retriever: expected 'dense', 'bm25' or 'hybrid'"),
        (["--judger", "/nonexistent"], "--judger /nonexistent: not a folder"),
        (["--reader", "template", "--reasoner", "llm"], "name one with --llm"),
        (["--split-from", "/"], "stats.json: not found"),
        (["--schema", "/nonexistent"], "/nonexistent: no schema"),
    ],
)
def test_bad_input_fails_in_one_line(args: list[str], message: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    flags = dict(zip(args[::2], args[1::2], strict=True))
    flags.setdefault("--data", str(DATA))
    result = memrl_cli(
        "eval", "tod", *(x for kv in flags.items() for x in kv), "--out", str(tmp_path / "o"), env=_env()
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("memrl: error:")
    assert message in lines[0]
    assert not (tmp_path / "o").exists()  # rejected before anything was written


# --- sessions that cannot be scored, and what the template reader asks (in-process: no Ray) -----------------------

UNSCORED = FIXTURES / "mstod_unscored"


def test_unscored_sessions_are_left_out_and_named(tmp_path: Path) -> None:
    import asyncio

    from memrl.envs.tod.config import TodEvalConfig
    from memrl.envs.tod.formats import LoadProblems
    from memrl.envs.tod.runner import SessionRunner, WorkerSpec, needed_roles, plan_jobs
    from memrl.envs.tod.schema import TodDataError

    cfg = TodEvalConfig(data=UNSCORED, reader="template", retriever="bm25")
    problems = LoadProblems()
    plan = plan_jobs(cfg, problems)
    # 7/2 confirms only a ride's slots (dropped: an empty goal would score perfect); 7/4's confirmation id is the
    # user's echo, so its context already holds the assistant's summary.
    assert [j.key for j in plan.jobs] == ["7/3", "8/2"]
    assert [(u["session_id"], u["why"].split()[0]) for u in problems.summary()["unscored_sessions"]["sessions"]] == [
        (2, "confirmation_state.slot_values"),
        (4, "confirmation_state.confirmation_utterance_id"),
    ]
    runner = SessionRunner(WorkerSpec(cfg, needed_roles(cfg), plan.schemas))
    hotel = asyncio.run(runner.run(plan.jobs[0]))
    text = hotel["confirmation"]
    assert "the the" not in text.lower()
    assert "whether the inn offers wifi" in text  # the True/False slot, asked as a condition
    assert "stars" not in text and "pets" not in text  # slots no confirmation of the folder uses are never asked
    with pytest.raises(TodDataError, match="session_id 4"):
        plan_jobs(cfg.model_copy(update={"strict": True, "data": _without_session(UNSCORED, tmp_path, 7, 2)}))


def _without_session(folder: Path, tmp_path: Path, persona: int, session: int) -> Path:
    for path in folder.iterdir():
        (tmp_path / path.name).write_text(path.read_text())
    record = json.loads((folder / f"persona_{persona}.json").read_text())
    record["sessions"] = [s for s in record["sessions"] if s["session_id"] != session]
    (tmp_path / f"persona_{persona}.json").write_text(json.dumps(record))
    return tmp_path


def test_template_reader_asks_each_name_once_and_never_doubles_an_article() -> None:
    import asyncio

    from memrl.envs.tod.formats import Turn
    from memrl.envs.tod.pipeline import Scored, Selection
    from memrl.envs.tod.reader import ReaderRequest, TemplateReader, phrases
    from memrl.envs.tod.retrieval import Candidate
    from memrl.envs.tod.schema import load_schemas

    schemas = load_schemas(UNSCORED / "schema.json")  # Hotels_1 and Hotels_3 merged: two slots name the town
    context = [Turn(speaker="user", utterance="An inn in Lakeport, please.")]
    names = phrases(schemas, "Hotels", "SearchHotel")
    assert names["destination"] == names["location"] == "town where the inn is"
    assert names["has_wifi"] == "whether the inn offers wifi"
    missing = ["destination", "number_of_rooms", "has_wifi", "star_rating"]
    # Memory remembers another town under the other version's slot: the town the context just gave stands.
    old_town = Candidate("7/3/1/destination", 1, "look for an inn", "destination", "Which town?", "Harbortown")
    selection = Selection((Scored(old_town, 1.0, None, 1.0),), 5)
    request = ReaderRequest(context, [], selection, missing, {"location": "Lakeport"}, names)
    reply = asyncio.run(TemplateReader().respond(request))
    text = reply.text
    assert "town where the inn is: Lakeport" in text and "Harbortown" not in text
    assert text.count("town where the inn is") == 1  # the context just gave the town: not asked again
    assert reply.slots == {"location": "Lakeport"}
    assert "Could you also tell me the count of rooms to hold and whether the inn offers wifi and the stars" in text
