"""`memrl eval collab` and `memrl collab ...` as users run them: real servers, real Ray actors, resumable output."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support import MemrlCLI


def _env() -> dict[str, str]:
    """One thread per CLI process, wide enough that rich does not wrap, and (unless RAY_ADDRESS is set) a Ray of its
    own, as `ray_address: null` means, never a cluster some other process left behind with `ray start`, whose dead
    address in /tmp/ray would stall ray.init for minutes."""
    return {"RAY_ADDRESS": "local", **os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]


def test_preferences_lists_the_taxonomy(memrl_cli: MemrlCLI) -> None:
    result = memrl_cli("collab", "preferences", "--json", env=_env())
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 20
    judge_only = {r["id"] for r in rows if not r["checkable"]}
    assert judge_only == {"narrative", "intuitive"}
    table = memrl_cli("collab", "preferences", env=_env())
    assert "three-sentences" in table.stdout
    assert "judge-only" in table.stdout


def test_check_prints_one_verdict(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    response = tmp_path / "r.txt"
    response.write_text("One. Two. Three. Four.")
    result = memrl_cli(
        "collab", "check", "--preference", "three-sentences", "--response-file", str(response), env=_env()
    )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["preference"] == "three-sentences"
    assert verdict["verdict"] == "violated"
    assert verdict["reason"]
    response.write_text("Here is the plan. We split the cost. Key takeaways: share the bill.")
    wound = memrl_cli(
        "collab", "check", "--preference", "takeaways", "--response-file", str(response), "--winding-down", env=_env()
    )
    assert json.loads(wound.stdout)["verdict"] == "satisfied"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["collab", "check", "--preference", "bulets", "--response-file", "x"], "did you mean 'bullets'"),
        (["collab", "check", "--preference", "bullets", "--response-file", "/nonexistent"], "response file not found"),
        (["eval", "collab", "--task", "mathh", "--out", "o"], "unknown task"),
        (["eval", "collab", "--agent", "memroy", "--out", "o"], "agent"),
        (["eval", "collab", "--simulator", "human", "--out", "o"], "simulator"),
        (["eval", "collab", "--reply", "yaml", "--out", "o"], "reply"),
        (["eval", "collab", *[f"--preferences={p}" for p in ("polite", "blunt", "direct")], "--out", "o"], "span 2"),
        (["eval", "collab", *[f"--preferences={p}" for p in ("polit", "direct", "bullets")], "--out", "o"], "polite"),
    ],
)
def test_bad_input_fails_in_one_line(args: list[str], message: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(*[a.replace("o", str(tmp_path / "o")) if a == "o" else a for a in args], env=_env())
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("memrl: error:")
    assert message in lines[0]


@pytest.mark.slow
def test_unreachable_endpoint_fails_in_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """Every session failed: the run fails in one line, after writing metrics that say so (no retries: the client's
    backoff only adds seconds to the same verdict)."""
    out = tmp_path / "o"
    result = memrl_cli(
        "eval", "collab", "--users", "1", "--sessions", "1", "--model", "m@http://127.0.0.1:9/v1", "--max-retries",
        "0", "--out", str(out), env=_env(),
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("memrl: error: eval collab: 1 of 1 sessions failed (first: user ")
    assert "unreachable" in last
    metrics = json.loads((out / "metrics.json").read_text())  # written, though the run failed
    assert metrics["sessions"] == 0 and metrics["failed_sessions"] == 1


@pytest.mark.slow
def test_eval_runs_on_ray_resumes_and_never_duplicates(tiny_qwen2: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """The first run puts its users on two Ray actors sharing a served model (`--workers 2`); the rerun takes the
    default for an in-process model on a local run, one worker in the driver's process batching both users."""
    out = tmp_path / "run"
    base = ["eval", "collab", "--model", tiny_qwen2, "--users", "2", "--max-turns", "2", "--max-tokens", "16"]
    base += ["--reflection-max-tokens", "16"]
    first = memrl_cli(*base, "--sessions", "1", "--workers", "2", "--out", str(out), env=_env())
    assert first.returncode == 0, first.stderr[-2000:]
    summary = json.loads(first.stdout)
    assert summary["sessions"] == 2
    assert summary["users"] == 2
    records = _records(out)
    assert sorted(r["session"] for r in records) == [0, 0] and len({r["user_id"] for r in records}) == 2
    assert all(r["node"] for r in records) and (out / "logs" / "serve-0.log").exists()  # on Ray, served
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"task_success", "user_effort", "length", "per_session"} <= metrics.keys()
    assert (out / "sessions.png").stat().st_size > 1000

    # A crash mid-write leaves a torn last line; the rerun drops it, keeps the rest and runs only what is missing,
    # each user's next session starting from the memory its finished one left on disk.
    with (out / "sessions.jsonl").open("a") as f:
        f.write('{"key": "torn')
    again = memrl_cli(*base, "--sessions", "2", "--out", str(out), env=_env())
    assert again.returncode == 0, again.stderr[-2000:]
    after = _records(out)
    assert after[:2] == records  # finished work untouched
    assert len(after) == 4 and len({r["key"] for r in after}) == 4
    assert {r["session"] for r in after[2:]} == {1}
    assert all(r["node"] is None for r in after[2:])  # in the driver's process: no Ray node
    for r in after[2:]:  # each user's memory flows from one session into the next
        previous = next(p for p in records if p["user_id"] == r["user_id"])
        assert r["notes_before"] == previous["notes_after"]
    assert len(json.loads((out / "metrics.json").read_text())["per_session"]) == 2

    other = memrl_cli(*base, "--sessions", "2", "--agent", "none", "--out", str(out), env=_env())
    assert other.returncode == 2
    assert "holds a run with different agent" in other.stderr


@pytest.mark.slow
def test_llm_simulator_against_a_local_transformers_serve(
    smollm2_server: Any, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    model = f"{smollm2_server.name}@{smollm2_server.url}"
    out = tmp_path / "llm"
    result = memrl_cli(
        "eval", "collab", "--simulator", "llm", "--agent", "oracle", "--model", model, "--users", "1",
        "--sessions", "1", "--max-turns", "2", "--max-tokens", "32", "--user-max-tokens", "48", "--out", str(out),
        env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    [record] = _records(out)
    assert record["agent"] == "oracle"
    assert 2 <= record["length"] <= 5
    assert record["turns"][0]["role"] == "user"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sessions"] == 1
    assert set(metrics["parse_failures"]) == {"agent", "user", "retrieval", "reflection"}
    # The user's eight-field JSON does not fit in 48 tokens: every cut reply is counted.
    assert metrics["truncations"]["user"] == record["truncations"]["user"] >= 1


@pytest.mark.slow
def test_unreachable_ray_cluster_fails_in_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    from memrl.rollout.serve import free_port

    address = f"127.0.0.1:{free_port()}"
    # An endpoint model: nothing to serve before Ray is reached (the default in-process model would start a server).
    result = memrl_cli(
        "eval", "collab", "--users", "1", "--model", "m@http://127.0.0.1:9/v1", "--ray-address", address, "--out",
        tmp_path / "o", timeout=120, env=_env(),
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"memrl: error: cannot connect to the Ray cluster at {address}")
    )
