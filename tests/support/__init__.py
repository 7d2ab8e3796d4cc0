"""What tests share beyond fixtures (those are in tests/conftest.py): the CLI as a subprocess or in-process, the
fixtures folder, stopping a Ray cluster, and the reflection-rows writer's type. `pythonpath` in pyproject puts
tests/ on the path, so a test imports these as `from support import ...`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from memrl.envs.collab.next_session import NextSessionRow

MEMRL_ARGV = (sys.executable, "-m", "memrl")
FIXTURES = Path(__file__).parents[1] / "fixtures"
"""The CLI as a subprocess: `python -m memrl` in this interpreter. Tests that must kill it `Popen` this argv."""


class MemrlCLI(Protocol):
    """What the `memrl_cli` fixture returns; see `run_memrl`."""

    def __call__(
        self,
        *args: object,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 600,
        check: bool = False,
        start_new_session: bool = False,
    ) -> subprocess.CompletedProcess[str]: ...


def run_memrl(
    *args: object,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    check: bool = False,
    start_new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`memrl ARGS...` (each arg str()-ed) with its text output captured; `check` raises on a non-zero exit."""
    return subprocess.run(
        [*MEMRL_ARGV, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=None if env is None else dict(env),
        timeout=timeout,
        check=check,
        start_new_session=start_new_session,
    )


def memrl_in_process(argv: list[object], cwd: Path | None = None, *, stdout: bool = False) -> tuple[int, str]:
    """`memrl ARGV` in this process (`memrl.app.cli.main.main`, as the `memrl` script runs it), from `cwd`:
    (exit code, stderr, with stdout in it too if `stdout`). Saves a fresh interpreter's start-up where a test needs
    no process of its own."""
    import contextlib
    import io

    from memrl.app.cli.main import main

    err = io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(contextlib.redirect_stdout(err if stdout else io.StringIO()))
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


def ray_pids(roots: list[Path]) -> list[int]:
    """Every process of the Ray clusters under `roots` (their temp dirs): by command line, or by an open file (Ray's
    agents rename themselves, `ray::DashboardAgent`, but their open logs still say which cluster they serve)."""
    marks, pids = [str(r) for r in roots], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            texts = [(entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")]
            texts += [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(mark in text for text in texts for mark in marks):
            pids.append(int(entry.name))
    return pids


def stop_ray(roots: list[Path]) -> None:
    """Stop exactly the Ray clusters under `roots` (TERM, then KILL) and remove their temp dirs."""
    import contextlib
    import shutil
    import signal
    import time

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        for pid in ray_pids(roots):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while ray_pids(roots) and time.monotonic() < deadline:
            time.sleep(0.2)
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


class ReflectionRows(Protocol):
    def __call__(self, rows: Sequence[NextSessionRow]) -> Path: ...
