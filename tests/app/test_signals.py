"""SIGINT and SIGTERM stop a run within seconds, in one line, and it resumes: nothing finished lost or repeated.

Each test chains real runs of a bundled recipe on tiny models (`memrl` as a subprocess, signalled by pid as a
terminal's Ctrl-C or a scheduler's preemption signal would be): a run is stopped mid-stage, `memrl resume` stops it
again later on, and the last resume finishes. Each stop must: end the process within STOP_S (memrl's own deadline,
memrl.core.interrupts.STOP_S, plus slack for a loaded machine) with 130 or 143 and one last line naming the signal
and `memrl resume RUN`; print no traceback, no stack dump (Ray's C++ handler aborts on SIGTERM), no asyncio
"Task was destroyed"; and leave none of its processes (Ray's included) alive 10 s later. While it runs, every
socket its processes listen on must be a loopback one (online RL on Ray actors: the collaborator chain). The reruns
check that the records finished before a stop are kept and none is written twice, and that training resumed from
the checkpoint the stop left (each optimizer step logged once).

Stage kinds: data (reflection_data), sft, grpo, eval (eval_reflector) in the quickstart chain, collab_grpo (on Ray
actors) in the collaborator chain, judger and eval_judger in the judger chain, and an action command on Ray workers
with a served model (`memrl eval collab --workers 2`, resumed by running it again); each gets SIGINT or SIGTERM,
and the chains between them send both to every kind of process memrl runs (in-process models, Ray, a model
server, a trainer).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from support import MEMRL_ARGV, Listeners

from memrl.core.checkpoints import trainer_saved
from memrl.core.interrupts import STOP_S

pytestmark = pytest.mark.slow
# memrl ends itself STOP_S after the signal (wall time); the rest is for a process starved on a loaded machine
STOP_BOUND_S = STOP_S + 50
GONE_S = 10.0  # how soon every process a stopped run started must be gone
NOISE = ("Traceback", "Task was destroyed", "*** SIGTERM received", "Exception ignored", "Fatal Python error")


@dataclass
class Stopped:
    code: int
    stderr: str
    took: float  # seconds from the signal to the exit


def _from_a_terminal() -> None:
    """SIGINT reaches the child as from a shell (the test process may have it blocked or ignored)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


Ready = Callable[[int], bool]  # given the run's pid: whether it is where the signal should reach it


def stop_when(args: list[object], ready: Ready, sig: signal.Signals, cwd: Path) -> Stopped:
    """Run `memrl ARGS`; once `ready(pid)` holds, send `sig` to it; check how it stops (see the module doc)."""
    log = cwd / f"stopped-{sig.name}-{time.monotonic_ns()}.log"
    seen: dict[int, psutil.Process] = {}
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*MEMRL_ARGV, *map(str, args)], cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_from_a_terminal
        )
        try:
            with Listeners(proc.pid) as listeners:  # everything it starts listens on loopback only
                deadline = time.monotonic() + 900
                while not ready(proc.pid):
                    assert proc.poll() is None, f"exited ({proc.returncode}) early:\n{log.read_text()[-3000:]}"
                    assert time.monotonic() < deadline, "never got there"
                    _note(proc.pid, seen)
                    time.sleep(0.1)
                _note(proc.pid, seen)
                sent = time.monotonic()
                proc.send_signal(sig)
                proc.wait(STOP_BOUND_S + 60)
                took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = log.read_text()
    print(f"{' '.join(map(str, args[:2]))}: {sig.name} stopped it in {took:.1f} s")  # -s shows how long each took
    assert not listeners.exposed(), listeners.exposed()
    assert took < STOP_BOUND_S, f"took {took:.0f} s to stop:\n{stderr[-2000:]}"
    assert proc.returncode == 128 + sig, stderr[-3000:]
    assert not [n for n in NOISE if n in stderr], stderr[-3000:]
    left = psutil.wait_procs(list(seen.values()), timeout=GONE_S)[1]
    assert not left, f"still running {GONE_S:.0f} s after the exit: {[' '.join(p.cmdline())[:80] for p in left]}"
    return Stopped(proc.returncode, stderr, took)


def _note(pid: int, seen: dict[int, psutil.Process]) -> None:
    """Every process of the run's tree so far (Ray's reparent themselves once their parent dies: noted early)."""
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            seen.setdefault(p.pid, p)
    except psutil.Error:
        pass


def last_line(stopped: Stopped, sig: signal.Signals, run: Path) -> None:
    lines = [line for line in stopped.stderr.splitlines() if line.strip()]
    assert lines[-1] == f"memrl: stopped by {sig.name}; resume with: memrl resume {run.resolve()}", lines[-3:]


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def keys(paths: list[Path]) -> list[str]:
    return [str(r["key"]) for p in paths for r in records(p)]


def has_lines(pattern: str, root: Path) -> Ready:
    return lambda _: any(p.stat().st_size > 0 for p in root.glob(pattern) if p.is_file())


def checkpoint_saved(stage: Path) -> Ready:
    return lambda _: any(trainer_saved(p) for p in stage.glob("checkpoint-*"))


def ray_starting(pid: int) -> bool:
    """A process of a local Ray (or the watchdog memrl starts just before it) runs under the run's process."""
    marks = ("ray::", "gcs_server", "raylet", "/session_")
    try:
        below = psutil.Process(pid).children(recursive=True)
        return any(mark in " ".join(p.cmdline()) for p in below for mark in marks)
    except psutil.Error:
        return False


def steps_logged(stage: Path) -> list[int]:
    """The optimizer steps the finished stage's log holds, each once if training resumed where it stopped."""
    history = json.loads((stage / "log_history.json").read_text())
    return sorted(int(row["step"]) for row in history if "loss" in row)


def test_quickstart_stages_stop_and_resume(tmp_path: Path) -> None:
    """data (SIGINT), sft (SIGTERM), grpo (SIGINT) and eval (SIGTERM), one after another."""
    run = tmp_path / "run"
    first = [
        "run", "quickstart", "--smoke", f"output_dir={run}", "stages.sft.max_steps=4",
        "stages.sft.checkpoints.save_steps=1", "stages.grpo.max_steps=3", "stages.eval.reward.outcome=null",
    ]  # fmt: skip
    stopped = stop_when(first, has_lines("collab-train/sessions.jsonl", run / "data"), signal.SIGINT, tmp_path)
    last_line(stopped, signal.SIGINT, run)
    before = keys(sorted((run / "data").glob("collab-*/sessions.jsonl")))
    assert before

    stopped = stop_when(["resume", run], checkpoint_saved(run / "sft"), signal.SIGTERM, tmp_path)
    last_line(stopped, signal.SIGTERM, run)
    sessions = sorted((run / "data").glob("collab-*/sessions.jsonl"))
    after = keys(sessions)
    assert set(before) <= set(after) and len(after) == len(set(after))  # kept, and none written twice
    assert not (run / "sft" / "final").exists()

    stopped = stop_when(["resume", run], checkpoint_saved(run / "grpo"), signal.SIGINT, tmp_path)
    last_line(stopped, signal.SIGINT, run)
    assert steps_logged(run / "sft") == [1, 2, 3, 4]  # resumed from its checkpoint: every step once

    stopped = stop_when(["resume", run], has_lines("*/generations.jsonl", run / "eval"), signal.SIGTERM, tmp_path)
    last_line(stopped, signal.SIGTERM, run)
    assert steps_logged(run / "grpo") == [1, 2, 3]
    generated = sorted((run / "eval").glob("*/generations.jsonl"))
    done = {p: keys([p]) for p in generated}

    finished = subprocess.run([*MEMRL_ARGV, "resume", run], capture_output=True, text=True, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert keys(sessions) == after  # the data stage was finished: nothing ran again
    for path, kept in done.items():
        now = keys([path])
        assert set(kept) <= set(now) and len(now) == len(set(now))
    assert (run / "report.json").is_file()


def test_collab_grpo_on_ray_stops_and_resumes(tmp_path: Path) -> None:
    """collab_grpo with its episodes on Ray actors: SIGINT while Ray starts, SIGTERM mid-training."""
    run = tmp_path / "run"
    args = ["run", "collaborator-quickstart", "--smoke", f"output_dir={run}", "--stage", "pull", "--stage", "collab"]

    stopped = stop_when(args, ray_starting, signal.SIGINT, tmp_path)
    last_line(stopped, signal.SIGINT, run)

    stopped = stop_when(
        ["resume", run, "--stage", "collab"], checkpoint_saved(run / "collab"), signal.SIGTERM, tmp_path
    )
    last_line(stopped, signal.SIGTERM, run)
    assert not (run / "collab" / "final").exists()

    finished = subprocess.run(
        [*MEMRL_ARGV, "resume", run, "--stage", "collab"], capture_output=True, text=True, cwd=tmp_path
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert steps_logged(run / "collab") == [1, 2]
    episodes = records(run / "collab" / "episodes.jsonl")
    per_step = {step: sum(1 for e in episodes if e["step"] == step) for step in (1, 2)}
    assert per_step == {1: 4, 2: 4}  # batch 2 x rollouts 2 per step, each step's episodes in the file once


def test_judger_stops_and_resumes(tmp_path: Path, mstod_judger_data: Path) -> None:
    """judger (SIGTERM after a checkpoint) and eval_judger (SIGINT), then the run finishes."""
    run = tmp_path / "run"
    first = [
        "run", "judger-minilm-cpu", "--smoke", f"data={mstod_judger_data}", f"output_dir={run}",
        "stages.judger.max_steps=4", "stages.judger.checkpoints.save_steps=1",
    ]  # fmt: skip
    stopped = stop_when(first, checkpoint_saved(run / "judger"), signal.SIGTERM, tmp_path)
    last_line(stopped, signal.SIGTERM, run)
    stopped = stop_when(["resume", run], lambda _: (run / "eval").is_dir(), signal.SIGINT, tmp_path)
    last_line(stopped, signal.SIGINT, run)
    assert steps_logged(run / "judger") == [1, 2, 3, 4]
    finished = subprocess.run([*MEMRL_ARGV, "resume", run], capture_output=True, text=True, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (run / "eval" / "metrics.json").is_file()


def test_an_eval_command_on_ray_workers_stops_and_resumes(tmp_path: Path, tiny_qwen2: str) -> None:
    """`memrl eval collab --workers 2` (a served model, a local Ray of two actors): SIGTERM once sessions are on
    disk, then the same command finishes the rest, none twice."""
    out = tmp_path / "out"
    args: list[object] = [
        "eval", "collab", "--model", "tiny-qwen2", "--users", "4", "--sessions", "2", "--max-turns", "2",
        "--workers", "2", "--max-tokens", "8", "--reflection-max-tokens", "8", "--out", out,
    ]  # fmt: skip
    stopped = stop_when(args, has_lines("sessions.jsonl", out), signal.SIGTERM, tmp_path)
    lines = [line for line in stopped.stderr.splitlines() if line.strip()]
    assert lines[-1] == f"memrl: stopped by SIGTERM; resume with: the same command (what finished is kept in {out})"
    before = keys([out / "sessions.jsonl"])
    assert before
    finished = subprocess.run([*MEMRL_ARGV, *map(str, args)], capture_output=True, text=True, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    after = keys([out / "sessions.jsonl"])
    assert set(before) <= set(after) and len(after) == len(set(after)) == 8  # 4 users x 2 sessions, each once
