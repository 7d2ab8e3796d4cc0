"""`memrl eval pahf` as users run it, on the shipped fixture: Ray actors, one served model, resumable output."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support import FIXTURES, MemrlCLI

DATA = FIXTURES / "pahf"


def _env() -> dict[str, str]:
    """One thread per CLI process, and wide enough that rich does not wrap."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]


def _check(metrics: dict[str, Any]) -> None:
    assert set(metrics) == {"phases", "failures", "tasks", "setup"}
    tasks = metrics["tasks"]
    assert tasks["finished"] == tasks["planned"] == sum(m["tasks"] for m in metrics["phases"].values())
    assert tasks["failed"] == tasks["retried"] == 0
    assert set(metrics["phases"]) == {"1", "2", "3", "4"}
    for m in metrics["phases"].values():
        assert 0.0 <= m["success_rate"] <= 1.0 and 0.0 <= m["feedback_frequency"] <= 1.0
        assert m["acpe"] and all(0.0 <= x <= 1.0 for x in m["acpe"])
    assert set(metrics["failures"]) == {"decision", "summary", "salience", "note", "merge"}


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_tiny_model_runs_all_phases_and_resumes(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "run"
    base = ["eval", "pahf", "--domain", "shopping", "--agent", "pahf", "--memory", "sqlite", "--users", "2",
            "--scenarios", "2", "--model", "tiny-qwen2", "--max-tokens", "8", "--data", str(DATA),
            "--workers", "1", "--out", str(out)]  # fmt: skip
    # One actor holds tiny-qwen2 in process for both users: two workers would add a model server's start-up
    # (the served-once path is test_tod_eval's smollm2 test; the HTTP client's is the unreachable-endpoint test).
    result = memrl_cli(*base, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout)
    assert metrics == json.loads((out / "metrics.json").read_text())
    _check(metrics)
    records = _records(out)
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == 14  # fixture: 2 users, up to 2 scenarios in each of 4 phases
    assert {r["user"] for r in records} == {"Mira", "Tomas"}
    assert {k.split("/")[0] for k in keys} == {"1", "2", "3", "4"}
    assert metrics["phases"]["1"]["tasks"] == 4 and len(metrics["phases"]["1"]["acpe"]) == 2
    # tiny-qwen2 writes noise: an unusable decision is counted and fails its task, never the run.
    assert metrics["failures"]["decision"] == sum(r["choice"] is None for r in records)
    assert all(r["correct"] == (r["choice"] == r["gold"]) for r in records)
    assert all(r["product"] in ("desk lamp", "kettle") for r in records)
    assert metrics["setup"]["model"] == "tiny-qwen2" and metrics["setup"]["agent"] == "pahf"
    assert (out / "curves_phase1.png").stat().st_size > 0 and (out / "curves_phase3.png").is_file()
    assert (out / "memory" / "Mira.sqlite").is_file()

    # A crash mid-write leaves a torn last line: the rerun drops it and recomputes nothing.
    before = (out / "tasks.jsonl").read_bytes()
    with (out / "tasks.jsonl").open("a") as f:
        f.write('{"key": "torn')
    again = memrl_cli(*base, env=_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "tasks.jsonl").read_bytes() == before
    assert json.loads(again.stdout) == metrics
    assert "Ray" not in again.stderr  # nothing left to run: no cluster started

    other = memrl_cli(*base, "--tau", "0.5", env=_env())
    assert other.returncode == 2 and "holds a run with different tau" in other.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_default_model_path_with_faiss(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """The embedded smollm2 (the default --model), served once, one user and one scenario per phase."""
    out = tmp_path / "smol"
    result = memrl_cli(
        "eval", "pahf", "--domain", "shopping", "--data", str(DATA / "shopping"), "--memory", "faiss",
        "--users", "1", "--scenarios", "1", "--max-tokens", "16", "--out", str(out), env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout)
    _check(metrics)
    assert metrics["setup"]["model"] == "smollm2" and metrics["setup"]["memory"] == "faiss"
    records = _records(out)
    assert len(records) == 4
    # SmolLM2-135M follows the letter format (it is no judge of lamps): its decisions are usable and scored.
    assert sum(r["choice"] is not None for r in records) >= 3
    assert (out / "memory" / "Mira.faiss").is_dir()


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_embodied_domain_with_the_llm_user(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """Embodied, all 4 phases (set A learns, set B tests), post-action corrections from the persona LLM."""
    out = tmp_path / "emb"
    result = memrl_cli(
        "eval", "pahf", "--domain", "embodied", "--agent", "post", "--memory", "faiss", "--user-sim", "llm",
        "--model", "tiny-qwen2", "--writer-model", "tiny-llama", "--max-tokens", "8", "--data", str(DATA),
        "--scenarios", "2", "--workers", "1", "--out", str(out), env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout)
    _check(metrics)
    assert metrics["setup"]["user_sim"] == "llm" and metrics["setup"]["user_model"] == "tiny-qwen2"
    assert metrics["setup"]["writer_model"] == "tiny-llama"  # a trained reflector would stand here
    records = _records(out)
    tests = {r["instruction"] for r in records if r["phase"] in (2, 4)}
    learns = {r["instruction"] for r in records if r["phase"] in (1, 3)}
    assert tests and learns and tests.isdisjoint(learns)  # B scenarios are new requests
    assert all(r["feedback"] is None for r in records if r["phase"] in (2, 4))
    wrong = [r for r in records if r["phase"] in (1, 3) and r["choice"] is not None and not r["correct"]]
    assert all(r["feedback"] for r in wrong)  # the persona LLM corrected every wrong action it saw


def test_bad_inputs_fail_in_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    missing = memrl_cli(
        "eval", "pahf", "--domain", "shopping", "--data", str(tmp_path / "nope"), "--out", str(tmp_path), env=_env()
    )
    assert missing.returncode == 2 and "--data" in missing.stderr and "not a folder" in missing.stderr
    agent = memrl_cli(
        "eval", "pahf", "--domain", "shopping", "--agent", "both", "--data", DATA, "--out", tmp_path, env=_env()
    )
    assert agent.returncode == 2 and "agent" in agent.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")  # join the session's Ray head: no Ray start-up (10-30 s here) per run
def test_unreachable_endpoint_fails_its_tasks_in_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """Every task's endpoint fails after the client's retries: each is logged as failed and the run says why."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    out = tmp_path / "down"
    result = memrl_cli(
        "eval", "pahf", "--domain", "shopping", "--data", str(DATA), "--users", "1", "--scenarios", "1",
        "--model", f"smollm2@http://127.0.0.1:{port}/v1", "--out", str(out), env=_env(),
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("memrl: error: eval pahf: 1 of ") and "(first: task 1/Mira/0/0: " in last
    assert f"127.0.0.1:{port}" in last
    failed = [json.loads(line) for line in (out / "failed.jsonl").read_text().splitlines()]
    assert [f["key"] for f in failed] == ["1/Mira/0/0"] and not (out / "tasks.jsonl").exists()
