"""An output folder in a broken state: one run at a time per folder, a damaged resume log or setup file, an
unreachable judge, and a resumption with other runtime settings."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import FIXTURES, MemrlCLI

from memrl.core.errors import ConfigError, MemrlError
from memrl.core.files import ResumableJsonl
from memrl.core.runfolder import LOCK_FILE, claim, hold
from memrl.envs.collab.config import CollabEvalConfig
from memrl.rollout.config import model_from_spec

MSTOD = FIXTURES / "mstod"
DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing listens


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("memrl: error: "), result.stderr[-3000:]
    return last


# --- one run at a time in an output folder ----------------------------------------------------------------


def test_a_second_run_into_a_held_folder_fails_naming_the_owner_pid(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "judger"
    hold_it = "import sys; from pathlib import Path; from memrl.core.runfolder import hold\n"
    hold_it += "with hold(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()"
    owner = subprocess.Popen(
        [sys.executable, "-c", hold_it, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "held\n"
        line = _error_line(memrl_cli("data", "judger", "--tod-dir", MSTOD, "--out", out, env=_env()))
        assert f"{out} is in use by another memrl run (pid {owner.pid})" in line
        assert not (out / "stats.json").exists()  # it wrote nothing
    finally:
        owner.communicate("", timeout=30)  # the owner lets go
    assert owner.returncode == 0
    result = memrl_cli("data", "judger", "--tod-dir", MSTOD, "--out", out, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "stats.json").is_file() and not (out / LOCK_FILE).exists()


def test_a_lock_file_left_by_a_killed_run_is_taken_over(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "judger"
    out.mkdir()
    (out / LOCK_FILE).write_text("999999999\n")  # no such process: the run that wrote it is gone
    result = memrl_cli("data", "judger", "--tod-dir", MSTOD, "--out", out, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "stats.json").is_file() and not (out / LOCK_FILE).exists()


def test_hold_leaves_no_empty_folder_when_the_run_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), hold(tmp_path / "new"):
        raise RuntimeError("bad input")
    assert not (tmp_path / "new").exists()
    with hold(tmp_path / "kept"):
        (tmp_path / "kept" / "result.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["result.json"]


# --- a damaged resume log or setup file -------------------------------------------------------------------


def _log(path: Path, *lines: str) -> Path:
    path.write_text("".join(lines))
    return path


def test_a_torn_last_line_is_dropped_with_a_warning_and_intact_records_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _log(tmp_path / "sessions.jsonl", '{"key": "a"}\n', '{"key": "b"}\n', '{"key": "c", "tur')
    with caplog.at_level(logging.WARNING):
        log = ResumableJsonl(path)
    assert log.done == {"a", "b"}
    assert f"{path}:3: dropped a torn last line" in caplog.text
    assert path.read_text() == '{"key": "a"}\n{"key": "b"}\n'  # the next append starts on a line of its own
    log.append({"key": "c"})
    assert [r["key"] for r in ResumableJsonl(path).records()] == ["a", "b", "c"]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = _log(tmp_path / "sessions.jsonl", '{"key": "a"}\n', '{"key": "b"}')
    ResumableJsonl(path).append({"key": "c"})
    assert [r["key"] for r in ResumableJsonl(path).records()] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("bad", "why"),
    [("{not json\n", "not valid JSON"), ("[1, 2]\n", "not a JSON object"), ("\udcff\n", "not UTF-8 text")],
    ids=["garbage", "array", "binary"],
)
def test_a_damaged_line_in_the_middle_is_an_error_naming_it(tmp_path: Path, bad: str, why: str) -> None:
    path = tmp_path / "sessions.jsonl"
    path.write_bytes(('{"key": "a"}\n' + bad + '{"key": "b"}\n').encode("utf-8", "surrogateescape"))
    before = path.read_bytes()
    with pytest.raises(MemrlError, match=f"sessions.jsonl:2: {why}"):
        ResumableJsonl(path)
    assert path.read_bytes() == before  # never repaired behind the user's back


def test_eval_collab_on_a_damaged_sessions_file_is_one_line_naming_it(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "run"
    out.mkdir()
    sessions = _log(out / "sessions.jsonl", '{"key": "u/0"}\n', "{not json\n", '{"key": "u/1"}\n')
    before = sessions.read_bytes()
    args = ["eval", "collab", "--simulator", "rule", "--agent", "none", "--users", "2", "--sessions", "3"]
    line = _error_line(memrl_cli(*args, "--out", out, env=_env()))
    assert f"{sessions}:2: not valid JSON" in line
    assert sessions.read_bytes() == before


def test_eval_collab_on_a_damaged_config_is_one_line_naming_it(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "run"
    out.mkdir()
    config = out / "config.json"
    config.write_text(CollabEvalConfig().model_dump_json(indent=2)[:40])  # truncated
    args = ["eval", "collab", "--simulator", "rule", "--agent", "none", "--users", "2", "--sessions", "3"]
    line = _error_line(memrl_cli(*args, "--out", out, env=_env()))
    assert f"{config}: not valid JSON" in line and ", line " in line


# --- an unreachable LLM judge -----------------------------------------------------------------------------


def test_reward_score_with_an_unreachable_judge_exits_2(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    reflection = _log(tmp_path / "reflection.txt", "The user wants short answers.\n")
    enforcements = _log(tmp_path / "enforcements.txt", "Keep it short, please.\n")
    args = ["--reflection-file", reflection, "--enforcements-file", enforcements]
    result = memrl_cli("reward", "score", "--judge", "llm", "--endpoint", DEAD, "--model", "x", *args, env=_env())
    assert f"endpoint {DEAD} is unreachable" in _error_line(result)
    assert result.stdout == ""  # no score printed


# --- settings that do not change results may change on resumption ----------------------------------------


def _collab(spec: str, **kw: object) -> CollabEvalConfig:
    return CollabEvalConfig(model=model_from_spec(spec, max_concurrency=4), **kw)  # type: ignore[arg-type]


def test_resuming_with_other_timeouts_retries_or_spread_keeps_the_folder(tmp_path: Path) -> None:
    first = _collab(f"x@{DEAD}", sessions=3)
    claim(tmp_path, first, may_change={"sessions"})
    patient = first.model_copy(
        update={
            "model": first.model.model_copy(update={"timeout": 600.0, "max_retries": 9, "max_concurrency": 64}),
            "workers": 3,
            "max_in_flight": 7,
            "sessions": 5,
        }
    )
    claim(tmp_path, patient, may_change={"sessions"})  # accepted, and saved
    assert json.loads((tmp_path / "config.json").read_text())["model"]["timeout"] == 600.0
    with pytest.raises(ConfigError, match="holds a run with different model, seed"):
        claim(tmp_path, patient.model_copy(update={"model": _collab(f"y@{DEAD}").model, "seed": 1}))
