"""Runtime faults injected for real: a Ray worker SIGKILLed mid-session, an endpoint that drops or stalls requests,
and `memrl eval collab` / `memrl data tod` SIGKILLed mid-run and resumed. No mocked model: a small real HTTP server
in this file answers like an OpenAI-compatible endpoint (workers reach a served model the same way;
test_collab_eval.py runs them against a real `transformers serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import FIXTURES, MEMRL_ARGV, MemrlCLI

SGD = FIXTURES / "sgd"

pytestmark = pytest.mark.slow  # every test here runs `memrl` with Ray workers

# Carries the keys of every collab role (agent reply, retrieval, reflection), so each call parses.
CANNED = json.dumps(
    {
        "user_preferences_reasoning": "The user wants short, direct answers.",
        "reasoning": "Answer directly.",
        "response": "- Step 1: work it out.\n- Step 2: check it.\nI am 80% confident.",
        "relevant_notes": "Keep it short.",
        "agent_notes": "The user prefers short answers with bullet points.",
    }
)


# --- a real OpenAI-compatible endpoint with faults on demand ------------------------------------------------------


class FaultyEndpoint:
    """Answers every chat request with CANNED after `latency` seconds, except requests whose messages contain a
    string of `drop` (the connection is closed without an answer) or of `stall` (no answer for `stall_for` s).
    `hits` counts the chat requests per fault string; `healed = True` turns the faults off; `stall_until` (a hit
    count) stalls a marker's requests only up to that hit, answering the later ones at once."""

    def __init__(self, latency: float = 0.0, stall_for: float = 30.0) -> None:
        self.latency = latency
        self.stall_for = stall_for
        self.drop: list[str] = []
        self.stall: list[str] = []
        self.healed = False
        self.stall_until: int | None = None
        self.hits: Counter[str] = Counter()
        self.served = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=256))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> FaultyEndpoint:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _fault(self, body: bytes) -> tuple[str | None, str | None]:
        if self.healed:
            return None, None
        text = " ".join(str(m.get("content", "")) for m in json.loads(body).get("messages", []))
        for kind, markers in (("drop", self.drop), ("stall", self.stall)):
            for marker in markers:
                if marker in text:
                    return kind, marker
        return None, None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *headers = head.decode("latin-1").split("\r\n")
                length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                if request_line.split(" ")[1].endswith("/chat/completions"):
                    kind, marker = self._fault(body)
                    if marker is not None:
                        self.hits[marker] += 1
                    if kind == "drop":
                        return  # close the connection without a word
                    if kind == "stall" and self.stall_until is not None and self.hits[marker] > self.stall_until:
                        kind = None
                    await asyncio.sleep(self.stall_for if kind == "stall" else self.latency)
                    self.served += 1
                    payload = {
                        "id": "chatcmpl-faulty",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "faulty",
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": CANNED}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                    }
                else:
                    payload = {"status": "ok", "data": [{"id": "faulty", "object": "model"}]}
                data = json.dumps(payload).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def endpoint() -> Iterator[FaultyEndpoint]:
    with FaultyEndpoint(latency=0.05) as server:
        yield server


# --- processes ----------------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    """RAY_ADDRESS=local unless set: each run starts its own Ray, as `ray_address: null` means, never joining a cluster
    some other process left behind with `ray start` (whose dead address in /tmp/ray would stall ray.init for ages)."""
    return {"RAY_ADDRESS": "local", **os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "RAY_DEDUP_LOGS": "0"}


@contextlib.contextmanager
def started(*args: str | Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`memrl ARGS` in its own process group (stdout and stderr to `log`); whatever is left of it is killed after."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*MEMRL_ARGV, *map(str, args)], stdout=sink, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )
    try:
        yield proc
    finally:
        kill_tree(proc)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process, its group and every descendant (Ray workers run in groups of their own)."""
    try:
        family = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)


def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[bytes], log: Path, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"memrl exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} after {timeout:g}s:\n{log.read_text()[-3000:]}")


def running_session(root: int, not_pid: int | None = None) -> int | None:
    """The pid of a Ray worker under `root` that is running a collab session right now."""
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if p.pid != not_pid and " ".join(p.cmdline()).startswith("ray::SessionRunner.run"):
                    return p.pid
    return None


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def summary_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def planned_problems(users: int, sessions: int) -> dict[tuple[str, int], str]:
    """(user id, session) -> the question the rule user opens with, as `memrl eval collab` plans it."""
    from memrl.envs.collab.config import CollabEvalConfig
    from memrl.envs.collab.runner import assign_problems, select_problems, select_profiles

    cfg = CollabEvalConfig(users=users, sessions=sessions)
    plan = assign_problems(select_profiles(cfg), select_problems(cfg), sessions, cfg.seed)
    return {(user, i): p.question for user, problems in plan.items() for i, p in enumerate(problems)}


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (psutil checks the start time: a reused pid is not them); zombies count as gone."""
    alive = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


@pytest.mark.slow
def test_a_killed_driver_takes_its_local_ray_with_it() -> None:
    """After SIGKILL of a driver, Ray's dashboard and runtime-env agents lived on for 30-90 s."""
    driver = (
        "import contextlib, time; from memrl.envs.ray_start import start_ray; start_ray(None, contextlib.ExitStack()); "
        "print('up', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, env=_env(), text=True)
    ray_processes: list[psutil.Process] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            p.name().startswith("ray::") or "Agent" in " ".join(p.cmdline()) for p in ray_processes
        ):  # the agents start a moment after ray.init returns
            time.sleep(0.5)
            ray_processes = [
                p for p in psutil.Process(proc.pid).children(recursive=True) if "-c" not in p.cmdline()[1:2]
            ]
        assert _alive(ray_processes), "the driver started no Ray processes"
        time.sleep(2)  # a run's agents live as long as it does; the watchdog looks twice a second
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 20
        while _alive(ray_processes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(ray_processes), [p.cmdline()[:1] for p in _alive(ray_processes)]
    finally:
        proc.kill()
        for p in _alive(ray_processes):
            with contextlib.suppress(psutil.Error):
                p.kill()


# --- 1. a Ray worker dies mid-session -----------------------------------------------------------------------------


def test_killed_worker_is_restarted_and_its_session_runs_once_more(endpoint: FaultyEndpoint, tmp_path: Path) -> None:
    endpoint.latency = 0.3  # a session takes a second or two: long enough to be caught running
    out, log = tmp_path / "run", tmp_path / "run.log"
    args = ["eval", "collab", "--model", f"faulty@{endpoint.url}", "--simulator", "rule", "--users", "2"]
    args += ["--sessions", "2"]
    args += ["--max-turns", "2", "--max-tokens", "16", "--workers", "1", "--out", str(out)]
    with started(*args, log=log) as proc:
        victim = wait_for("a running session", lambda: running_session(proc.pid), proc, log, timeout=240)
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(240) == 0, log.read_text()[-3000:]
    output = log.read_text()
    summary = json.loads(next(line for line in output.splitlines() if line.startswith('{"task_success"')))
    assert summary["retried"] >= 1 and summary["sessions"] == 4 and summary["failed"] == 0
    assert "died; running it again on the restarted worker" in output
    keys = [r["key"] for r in lines(out / "sessions.jsonl")]
    assert sorted(keys) == sorted({f"{u}/{s}" for u in {k.split("/")[0] for k in keys} for s in (0, 1)})
    assert len(keys) == 4 == len(set(keys))


def test_a_session_whose_worker_dies_twice_fails_the_run_in_one_line(endpoint: FaultyEndpoint, tmp_path: Path) -> None:
    endpoint.latency = 0.7  # a session takes a few seconds: long enough to kill its worker twice
    out, log = tmp_path / "run", tmp_path / "run.log"
    args = ["eval", "collab", "--model", f"faulty@{endpoint.url}", "--agent", "none", "--users", "1"]
    args += ["--sessions", "1", "--max-turns", "4", "--out", str(out)]
    with started(*args, log=log) as proc:
        first = wait_for("a running session", lambda: running_session(proc.pid), proc, log, timeout=120)
        os.kill(first, signal.SIGKILL)
        second = wait_for("the session again", lambda: running_session(proc.pid, first), proc, log, timeout=120)
        os.kill(second, signal.SIGKILL)
        assert proc.wait(120) == 2
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("memrl: error: user ") and "session 0 failed: its worker died 2 times" in last
    assert not lines(out / "sessions.jsonl")


# --- 2. an endpoint drops connections or stalls past the timeout --------------------------------------------------


def test_endpoint_failures_mark_sessions_failed_and_a_rerun_runs_them(
    endpoint: FaultyEndpoint, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    """A dropped and a stalled request fail their sessions; a rerun with a longer timeout (a change the run folder
    accepts on resumption) runs both, the stalled one now waited for. (A run in which every session failed:
    test_collab_eval.py's test_unreachable_endpoint_fails_in_one_line.)"""
    problems = planned_problems(users=2, sessions=3)
    (first_user, second_user) = sorted({user for user, _ in problems})
    dropped, stalled = problems[first_user, 1], problems[second_user, 1]
    endpoint.drop.append(dropped)
    endpoint.stall.append(stalled)
    endpoint.stall_for = 2.0
    out = tmp_path / "run"
    args = ["eval", "collab", "--model", f"faulty@{endpoint.url}", "--users", "2", "--sessions", "3"]
    args += ["--max-turns", "2", "--max-retries", "1", "--out", str(out)]

    result = memrl_cli(*args, "--request-timeout", "1", env=_env(), start_new_session=True)
    summary = summary_of(result)
    assert summary["sessions"] == 2 and summary["failed"] == 2 and summary["pending"] == 2
    assert endpoint.hits[dropped] == 2 and endpoint.hits[stalled] == 2  # one try and one retry each, then given up
    assert f"user {first_user} session 1 failed: endpoint {endpoint.url} is unreachable" in result.stderr
    assert f"user {second_user} session 1 failed: endpoint {endpoint.url} timed out after 1s" in result.stderr
    finished = lines(out / "sessions.jsonl")
    assert sorted(r["key"] for r in finished) == [f"{first_user}/0", f"{second_user}/0"]
    assert all("status" not in r for r in finished)
    failed = {r["key"]: r for r in lines(out / "failed.jsonl")}
    assert set(failed) == {f"{first_user}/1", f"{second_user}/1"}
    assert {r["status"] for r in failed.values()} == {"failed"} and all(r["error"] for r in failed.values())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sessions"] == 2 and metrics["failed_sessions"] == 2  # averages cover finished sessions only
    assert {f["key"] for f in metrics["failed"]} == set(failed)

    # The endpoint is back, but stalls the stalled session's first request once more, and its retry: only the rerun's
    # longer timeout gets it through.
    endpoint.drop.clear()
    endpoint.stall_until = 4
    summary = summary_of(memrl_cli(*args, "--request-timeout", "30", env=_env(), start_new_session=True))
    assert summary["sessions"] == 6 and summary["failed"] == 0 and summary["pending"] == 0
    assert endpoint.hits[stalled] > 4  # its stalled request was waited for, and the session went on
    keys = [r["key"] for r in lines(out / "sessions.jsonl")]
    assert len(keys) == 6 == len(set(keys))
    assert json.loads((out / "metrics.json").read_text())["failed_sessions"] == 0


# --- 3. the process is killed mid-run; a rerun resumes ------------------------------------------------------------


def _comparable(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["key"]: {k: v for k, v in r.items() if k not in ("started_at", "finished_at", "node")} for r in records}


def test_killed_collab_eval_resumes_without_loss_or_duplicates(
    endpoint: FaultyEndpoint, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    endpoint.latency = 0.3
    args = ["eval", "collab", "--model", f"faulty@{endpoint.url}", "--users", "2", "--sessions", "3"]
    args += ["--max-turns", "2"]
    whole, out, log = tmp_path / "whole", tmp_path / "killed", tmp_path / "killed.log"
    with started(*args, "--out", whole, log=tmp_path / "whole.log") as uninterrupted:  # side by side: saves time
        with started(*args, "--out", out, log=log) as proc:
            wait_for("a finished session", lambda: lines(out / "sessions.jsonl"), proc, log, timeout=120)
            kill_tree(proc)
        assert uninterrupted.wait(180) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    reference = lines(whole / "sessions.jsonl")
    assert len(reference) == 6
    before = lines(out / "sessions.jsonl")
    assert 1 <= len(before) < 6
    summary = summary_of(memrl_cli(*args, "--out", out, env=_env(), start_new_session=True))
    assert summary["sessions"] == 6
    after = lines(out / "sessions.jsonl")
    assert after[: len(before)] == before  # finished work untouched
    keys = [r["key"] for r in after]
    assert len(keys) == len(set(keys)) and set(keys) == {r["key"] for r in reference}
    assert _comparable(after) == _comparable(reference)  # the resumed users carried the right memory on


def test_killed_tod_data_generation_resumes_without_loss_or_duplicates(
    endpoint: FaultyEndpoint, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    endpoint.latency = 0.4  # each individual: two batched attempts of the LLM writer, then the template
    args = ["data", "tod", "--sgd-dir", SGD, "--individuals", "4", "--tasks-per-individual", "2"]
    args += ["--writer", f"faulty@{endpoint.url}"]
    whole = tmp_path / "whole"
    reference = summary_of(memrl_cli(*args, "--out", whole, env=_env(), start_new_session=True))
    progress = Path(".progress") / "sessions.jsonl"

    out, log = tmp_path / "killed", tmp_path / "killed.log"
    with started(*args, "--out", out, log=log) as proc:
        wait_for("a logged session", lambda: lines(out / progress), proc, log, timeout=120)
        kill_tree(proc)
    assert not (out / "stats.json").exists()  # killed mid-run
    resumed = summary_of(memrl_cli(*args, "--out", out, env=_env(), start_new_session=True))
    assert resumed["resumed_sessions"] > 0 or resumed["skipped"] > 0
    keys = [r["key"] for r in lines(out / progress)]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(r["key"] for r in lines(whole / progress))
    assert {k: v for k, v in resumed.items() if k not in ("resumed_sessions", "skipped")} == {
        k: v for k, v in reference.items() if k not in ("resumed_sessions", "skipped")
    }
    for persona in sorted(whole.glob("persona_*.json")):
        assert (out / persona.name).read_bytes() == persona.read_bytes()


# --- two runs on one folder, a torn log (a rerun with more patience: in 2) -------------------------------


def test_two_runs_on_one_folder_one_owns_it_and_sessions_land_once_and_a_torn_last_line_runs_again(
    endpoint: FaultyEndpoint, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    endpoint.latency = 0.2  # long enough that the two runs overlap
    out = tmp_path / "run"
    args = ["eval", "collab", "--model", f"faulty@{endpoint.url}", "--agent", "none", "--simulator", "rule"]
    args += ["--users", "2", "--sessions", "3", "--max-turns", "2", "--out", str(out)]
    with started(*args, log=tmp_path / "a.log") as a, started(*args, log=tmp_path / "b.log") as b:
        codes = {a.pid: a.wait(300), b.pid: b.wait(300)}
    assert sorted(codes.values()) == [0, 2], codes
    winner = next(pid for pid, code in codes.items() if code == 0)
    loser_log = (tmp_path / ("b.log" if winner == a.pid else "a.log")).read_text()
    assert f"memrl: error: {out} is in use by another memrl run (pid {winner})" in loser_log.strip().splitlines()[-1]
    keys = [r["key"] for r in lines(out / "sessions.jsonl")]
    assert len(keys) == 6 == len(set(keys))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sessions"] == 6 and not (out / ".memrl.lock").exists()

    # A killed run's half-written last line: a rerun drops it with a warning, keeps the rest and runs that session
    # again (the last line is its user's latest session, so nothing after it waits on it).
    endpoint.latency = 0.05
    sessions = out / "sessions.jsonl"
    whole = sessions.read_text().splitlines(keepends=True)
    sessions.write_text("".join(whole[:-1]) + whole[-1][: len(whole[-1]) // 2])
    result = memrl_cli(*args, env=_env(), start_new_session=True)
    assert summary_of(result)["sessions"] == 6
    assert f"{sessions}:{len(whole)}: dropped a torn last line" in result.stderr
    again = lines(sessions)
    assert again[:-1] == [json.loads(w) for w in whole[:-1]]
    assert [r["key"] for r in again] == [json.loads(w)["key"] for w in whole]
