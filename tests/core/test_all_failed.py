"""Work that all failed, or data that came out empty, is an error in one line (exit 2), never a success that hands the
next stage an empty file; a stage given an empty or missing dataset says so in one line, not a traceback."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import FIXTURES, local_ray, memrl_in_process

from memrl.core.errors import ConfigError
from memrl.core.outcomes import NothingDoneError, Outcome, require_data, require_success, shortfall


def _one_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and lines, err
    assert lines[-1].startswith("memrl: error: "), err
    return lines[-1]


def _dead_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    return f"http://127.0.0.1:{port}/v1"


# --- the rule ------------------------------------------------------------------------------------------------------


def test_the_rule_counts_and_names_the_first_failure() -> None:
    assert shortfall(Outcome("sessions", 3, 3, 0)) is None
    assert shortfall(Outcome("sessions", 0, 0, 0)) is None  # nothing left to do (a resumed run) is no failure
    assert shortfall(Outcome("sessions", 4, 1, 3, "x")) is None  # one finished: enough by default
    assert shortfall(Outcome("sessions", 2, 0, 2, "user a session 0: timed out\ntraceback")) == (
        "2 of 2 sessions failed (first: user a session 0: timed out)"
    )
    assert (
        shortfall(Outcome("sessions", 6, 0, 2, "e"))
        == "2 of 6 sessions failed, 4 more waited on them, none finished (first: e)"
    )
    assert shortfall(Outcome("tasks", 10, 4, 6, "e"), 0.5) == (
        "only 4 of 10 tasks finished, fewer than the 50% required: 6 failed (first: e)"
    )
    with pytest.raises(NothingDoneError, match=r"^data: 1 of 1 sessions failed \(first: e\); no dataset written$"):
        require_success("data", Outcome("sessions", 1, 0, 1, "e"), then="no dataset written")


def _empty_parquet(path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([], schema=pa.schema([("messages", pa.string())])), path)


@pytest.mark.parametrize(
    ("name", "make", "problem"),
    [
        ("train.jsonl", lambda p: None, "does not exist"),
        ("train.jsonl", Path.mkdir, "is a folder, not a data file"),
        ("train.jsonl", os.mkfifo, "is a FIFO (named pipe), not a data file"),  # never opened: no hang
        ("train.jsonl", lambda p: p.write_text(""), "is empty (no rows)"),
        ("train.jsonl", lambda p: p.write_text("\n  \n\t\n"), "is empty (no rows)"),
        ("train.json", lambda p: p.write_text(" [\n ] "), "is empty (no rows)"),
        ("train.parquet", _empty_parquet, "is empty (no rows)"),
    ],
)
def test_require_data_names_the_file_and_what_is_wrong(
    name: str, make: Callable[[Path], object], problem: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    make(path)
    with pytest.raises(ConfigError) as err:
        require_data(path, "SFT data", "run the reflection_data stage first")
    assert str(err.value) == f"SFT data {path} {problem}: run the reflection_data stage first"


def test_require_data_passes_a_file_with_a_row(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("\n" * 3 + '{"messages": []}\n')
    (tmp_path / "a.json").write_text("[{}]")
    assert require_data(tmp_path / "a.jsonl", "x") == tmp_path / "a.jsonl"
    assert require_data(tmp_path / "a.json", "x") == tmp_path / "a.json"


# --- consumers: a stage or command given an empty dataset ------------------------------------------------------


def test_sft_stage_given_an_empty_dataset_fails_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sft").mkdir(parents=True)
    for split in ("train", "eval"):
        (data / "sft" / f"{split}.jsonl").write_text("")
    code, err = memrl_in_process(
        ["run", "quickstart", "--smoke", "--stage", "sft", f"output_dir={tmp_path / 'run'}", f"stages.sft.data={data}"]
    )
    line = _one_line(code, err)
    assert f"training data {data / 'sft' / 'train.jsonl'} is empty (no rows)" in line
    assert "Traceback" not in err and "StopIteration" not in err


def test_eval_judger_given_empty_pairs_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "j" / "eval").mkdir(parents=True)
    (tmp_path / "j" / "eval" / "pairs.jsonl").write_text("\n")
    code, err = memrl_in_process(["eval", "judger", "--data", tmp_path / "j", "--out", tmp_path / "o"])
    assert f"judger data {tmp_path / 'j' / 'eval' / 'pairs.jsonl'} is empty (no rows)" in _one_line(code, err)


# --- producers without Ray: every record skipped ----------------------------------------------------------------


def _session(user: str, problem: str) -> dict[str, object]:
    """A finished collab session that teaches nothing: no enforcing turn, no notes before it."""
    turns = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    return {"user_id": user, "session": 0, "problem_id": problem, "task": "arith", "preferences": [], "turns": turns}


def test_reflection_data_stage_with_nothing_to_learn_writes_no_dataset(tmp_path: Path) -> None:
    paths = {}
    for split, user in (("train", "u1"), ("eval", "u2")):
        paths[split] = tmp_path / f"{split}.jsonl"
        paths[split].write_text(json.dumps(_session(user, f"p-{split}")) + "\n")
    run = tmp_path / "run"
    code, err = memrl_in_process(
        ["run", "quickstart", "--smoke", "--stage", "data", f"output_dir={run}",
         f"stages.data.train_sessions=[{paths['train']}]", f"stages.data.eval_sessions=[{paths['eval']}]"]
    )  # fmt: skip
    line = _one_line(code, err)
    why = "1 with nothing to learn (no preference enforced)"
    assert f"data: no training records: all 1 train sessions were skipped ({why}); no dataset" in line
    assert not (run / "data" / "sft").exists() and not (run / "data" / "train.jsonl").exists()


def test_data_pahf_from_a_run_whose_tasks_all_failed_fails_with_the_count(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    failed = {"key": "1/Mira/0/0", "status": "failed", "error": "endpoint http://127.0.0.1:9/v1 is unreachable"}
    (run / "failed.jsonl").write_text(json.dumps(failed) + "\n")
    code, err = memrl_in_process(["data", "pahf", "--run", run, "--out", tmp_path / "o"])
    line = _one_line(code, err)
    assert f"data pahf: 1 of 1 tasks of {run} failed (first: task 1/Mira/0/0: endpoint http://127.0.0.1:9/v1 is" in line
    assert not (tmp_path / "o").exists()


def test_data_reflection_and_data_judger_with_nothing_usable_fail_in_one_line(tmp_path: Path) -> None:
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps(_session("u1", "p1")) + "\n")
    code, err = memrl_in_process(
        ["data", "reflection", "--train-sessions", sessions, "--eval-sessions", sessions, "--out", tmp_path / "r"]
    )
    assert "all 1 train sessions were skipped (1 with nothing to learn (no preference enforced))" in _one_line(
        code, err
    )
    assert not (tmp_path / "r").exists()
    tod = tmp_path / "tod"
    tod.mkdir()
    for i in (1, 2):
        (tod / f"persona_{i}.json").write_text("{}")
    code, err = memrl_in_process(
        [
            "data",
            "judger",
            "--tod-dir",
            tod,
            "--schema",
            FIXTURES / "mstod" / "schema.json",
            "--out",
            tmp_path / "j",
        ]
    )
    assert "none of its 2 persona_*.json file(s) could be read" in _one_line(code, err)
    assert not list((tmp_path / "j").glob("**/pairs.jsonl"))


# --- producers on Ray: every session's endpoint is down ---------------------------------------------------------


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    """One local Ray in this process for the module: each in-process run joins it instead of starting its own."""

    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with local_ray(num_cpus=2, runtime_env={"env_vars": env}):
        yield


def _argv(command: str, endpoint: str, out: Path) -> list[object]:
    """The command, with every model on `endpoint` and no client retries (they only add seconds to the verdict)."""
    model = f"{{backend: openai, model: m, endpoint: '{endpoint}', max_retries: 0}}"
    if command == "eval collab":
        return ["eval", "collab", "--users", "1", "--sessions", "1", "--model", f"m@{endpoint}", "--max-retries", "0",
                "--out", out]  # fmt: skip
    stage = {  # as recipe stages (the same actions): their endpoint's retries can be set there
        "data stage": ["--smoke", "--stage", "data", "stages.data.train_users=1", "stages.data.eval_users=1",
                       "stages.data.collab.sessions=1", f"stages.data.collab.model={model}"],
        "eval pahf": ["--stage", "pahf", "stages.pahf.kind=eval_pahf", "stages.pahf.domain=shopping",
                      f"stages.pahf.data={FIXTURES / 'pahf'}", "stages.pahf.users=1", "stages.pahf.scenarios=1",
                      "stages.pahf.agent=none", f"stages.pahf.model={model}"],  # no memory: no embedder to load
        "eval tod": ["--stage", "tod", "stages.tod.kind=eval_tod", f"stages.tod.data={FIXTURES / 'mstod'}",
                     "stages.tod.reader=llm", f"stages.tod.reader_model={model}", "stages.tod.retriever=bm25",
                     "stages.tod.individuals=1", "stages.tod.sessions=1"],
    }[command]  # fmt: skip
    return ["run", "quickstart", f"output_dir={out}", *stage]


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("data stage", "data (train split): 1 of 1 sessions failed (first: user "),
        ("eval collab", "eval collab: 1 of 1 sessions failed (first: user "),
        ("eval pahf", "eval pahf: 1 of "),
        ("eval tod", "eval tod: 1 of "),
    ],
)
def test_all_failed_work_exits_2_with_the_count(command: str, said: str, ray_up: None, tmp_path: Path) -> None:
    endpoint = _dead_endpoint()
    code, err = memrl_in_process(_argv(command, endpoint, tmp_path / "o"))
    line = _one_line(code, err)
    assert said in line and endpoint in line, line
    if command == "data stage":
        assert "no dataset written" in line
        assert not list((tmp_path / "o" / "data").glob("*.jsonl")) and not (tmp_path / "o" / "data" / "sft").exists()
