"""Everything memrl starts listens on 127.0.0.1 unless told otherwise: the listening sockets of every process a
command starts (its own, its servers', its Ray's, its launcher's and ranks'), sampled while it runs
(`support.Listeners`), must all be loopback ones. `memrl serve --host 0.0.0.0` is the deliberate opening, and shows
that the sampling sees a socket that is not.

Online RL on Ray actors is watched by tests/app/test_signals.py (every stopped run's sockets are checked there).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import MEMRL_ARGV, Listeners, memrl_in_process
from test_judger_recipes import DISTRIBUTED

pytestmark = pytest.mark.slow


def _from_a_terminal() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_serve_listens_where_it_is_told(host: str, tiny_qwen2: str) -> None:
    from memrl.rollout.serve import free_port

    port = free_port()
    argv = [*MEMRL_ARGV, "serve", "--model", "tiny-qwen2", "--port", str(port), "--engine", "transformers"]
    proc = subprocess.Popen(
        [*argv, *(["--host", host] if host != "127.0.0.1" else [])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=_from_a_terminal,
    )  # fmt: skip
    try:
        with Listeners(proc.pid) as listeners:
            assert proc.stdout is not None and f":{port}/v1" in proc.stdout.readline()  # serving
        ports = {address.rpartition(":")[2] for _, _, address in listeners.found}
        assert str(port) in ports, listeners.found
        if host == "127.0.0.1":
            assert not listeners.exposed(), listeners.exposed()
        else:  # what the user asked for, and only that
            assert [address for _, _, address in listeners.exposed()] == [f"0.0.0.0:{port}"], listeners.exposed()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_eval_with_workers_on_ray_listens_on_loopback_only(tiny_qwen2: str, tmp_path: Path) -> None:
    """A served model and a local Ray of two actors: every process of both."""
    args = ["eval", "collab", "--model", "tiny-qwen2", "--users", "2", "--sessions", "1", "--max-turns", "1",
            "--workers", "2", "--max-tokens", "8", "--reflection-max-tokens", "8",
            "--out", tmp_path / "out"]  # fmt: skip
    proc = subprocess.Popen([*MEMRL_ARGV, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with Listeners(proc.pid) as listeners:
        out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["sessions"] == 2
    commands = " ".join(command for _, command, _ in listeners.found)
    assert "gcs_server" in commands and "raylet" in commands and "serve" in commands, listeners.found  # all seen
    assert not listeners.exposed(), listeners.exposed()


def test_the_judgers_torchrun_listens_on_loopback_only(
    mstod_judger_data: Path, tmp_path: Path, tiny_qwen2: str
) -> None:
    """torchrun's rendezvous and store, and the two ranks' gloo sockets (the run is in this process: its tree)."""
    import os

    (tmp_path / "two.yaml").write_text(DISTRIBUTED)
    started = time.monotonic()
    with Listeners(os.getpid(), every=0.1) as listeners:
        code, stderr = memrl_in_process(
            ["run", "two.yaml", f"data={mstod_judger_data}", "output_dir=run", "--stage", "judger"], cwd=tmp_path
        )
    assert code == 0, stderr[-3000:]
    commands = " ".join(command for _, command, _ in listeners.found)
    assert "memrl.train.loopback torchrun" in commands, (listeners.found, time.monotonic() - started)
    assert not listeners.exposed(), listeners.exposed()
