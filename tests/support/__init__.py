"""What tests share beyond fixtures (those are in tests/conftest.py): the CLI as a subprocess or in-process, the
fixtures folder, starting a local Ray as memrl does and stopping a Ray cluster, and the reflection-rows writer's
type. `pythonpath` in pyproject puts
tests/ on the path, so a test imports these as `from support import ...`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from memrl.envs.collab.next_session import NextSessionRow
    from memrl.envs.pahf.records import TaskRecord
    from memrl.envs.tod.records import TodSessionRecord

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


@contextlib.contextmanager
def local_ray(**init: Any) -> Iterator[None]:
    """A local Ray in this process for the body, started as memrl starts one (`envs/ray_start.local_ray`: every
    port on 127.0.0.1, a token of this process's), then shut down. `init`: more of ray.init's arguments."""
    import ray

    from memrl.envs.ray_start import local_ray as setup

    with setup() as options:
        ray.init(address="local", **(options | init))
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def ray_head_node(auth: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """A Ray head started with `ray start` (as a user starts a cluster), on 127.0.0.1 only, every port picked free
    and a temp dir of its own, so it never meets another Ray on this host; `auth`: RAY_AUTH_MODE (and the token).
    Yields the variables that make a CLI's `ray.init()` join it; its processes are killed after."""
    import tempfile

    from memrl.rollout.serve import free_port

    root = Path(tempfile.mkdtemp(prefix="mrt", dir="/tmp"))  # socket paths must stay under 107 characters
    env = {**auth, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    flags = ("--ray-client-server-port", "--node-manager-port", "--object-manager-port", "--metrics-export-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")  # fmt: skip
    argv = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--port", str(port), "--include-dashboard",
        "false", "--node-ip-address", "127.0.0.1", "--num-cpus", "4", "--object-store-memory", str(200 * 2**20),
        "--temp-dir", str(root), "--disable-usage-stats", *(x for flag in flags for x in (flag, str(free_port()))),
    ]  # fmt: skip
    try:
        head = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=180
        )
        assert head.returncode == 0, head.stderr[-2000:]
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        stop_ray([root])


class Listeners:
    """The TCP sockets every process of a tree listens on, sampled in a thread while the `with` body runs (and once
    more at its end): `found` holds (pid, command, address). A process of the tree started and ended between two
    samples is missed; memrl's servers and Ray's processes live for the whole run."""

    def __init__(self, root: int, every: float = 0.2) -> None:
        self.root, self.every = root, every
        self.found: set[tuple[int, str, str]] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Listeners:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.sample()

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            self.sample()

    def sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.root)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in tree:
            try:
                listening = [c for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
                command = " ".join(p.cmdline())[:100]
            except psutil.Error:
                continue
            self.found |= {(p.pid, command, f"{c.laddr.ip}:{c.laddr.port}") for c in listening}

    def exposed(self) -> list[tuple[int, str, str]]:
        """The sockets that listen beyond this machine (any address but loopback)."""
        return sorted(f for f in self.found if not _loopback(f[2].rpartition(":")[0]))


def _loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as a dual-stack socket reports it
    return (mapped or address).is_loopback


@contextlib.contextmanager
def announced(args: Sequence[object], prefix: str, **popen: Any) -> Iterator[str]:
    """`memrl ARGS` as a server process; yields the first line it prints once that line starts with `prefix` (its
    announcement), then terminates it (killed if it has not ended 30 s later)."""
    proc = subprocess.Popen([*MEMRL_ARGV, *map(str, args)], stdout=subprocess.PIPE, text=True, **popen)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(prefix), (line, proc.poll())
        yield line
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bad_row(line: str, change: Mapping[str, Any]) -> str:
    """A record's JSON `line` with `change` applied (a None value deletes the key), as one JSON line."""
    import json

    row = json.loads(line)
    for key, value in change.items():
        if value is None:
            del row[key]
        else:
            row[key] = value
    return json.dumps(row)


def tod_session(**row: Any) -> TodSessionRecord:
    """A TOD session record of `row`'s values, the keys it leaves out empty (a goal, a ranking, turns of none)."""
    from memrl.envs.tod.records import TodSessionRecord

    empty = {"key": "1/1", "persona_id": 1, "session_id": 1, "reference_dialogue_id": "", "service": "", "intent": "",
             "goal": {}, "context_turns": 0, "memory_units": 0, "intent_query": "", "missing_slots": [],
             "reasoning": "", "ranked": [], "a_core": [], "gold": [], "confirmation": "", "turns": [],
             "outstanding": [], "jga": 1.0, "slot_accuracy": 1.0, "correct_slots": {}, "dte": 1, "success": True,
             "failures": {}}  # fmt: skip
    return TodSessionRecord.from_dict(empty | row, "test")


def pahf_task(**row: Any) -> TaskRecord:
    """A PAHF task record of `row`'s values, the keys it leaves out empty (no options, question, writes or notes)."""
    from memrl.envs.pahf.records import TaskRecord

    empty = {"key": "1/u/0/0", "phase": 1, "user": "u", "index": 0, "pass": 0, "instruction": "", "options": {},
             "gold": "A", "choice": None, "correct": False, "thought": "", "question": None, "answer": None,
             "feedback": None, "used_feedback": False, "retrieved": [], "summary": "", "writes": [], "failures": {},
             "notes": []}  # fmt: skip
    return TaskRecord.from_dict(empty | row, "test")


class ReflectionRows(Protocol):
    def __call__(self, rows: Sequence[NextSessionRow]) -> Path: ...
