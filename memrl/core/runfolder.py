"""An output folder a run owns: one run at a time (`hold`), and one setup for every run that resumes in it (`claim`).

Two runs appending to one folder would record every piece of work twice; a run resumed with another setup would mix
two experiments in one file. `hold` takes an exclusive `flock` on the folder itself, which the kernel releases when
the process ends however it ends, so a killed run never leaves a lock behind; the holder's pid sits in `LOCK_FILE`
only to name it in the refusal (a file left by a killed run is simply taken over, and a link planted there is
replaced, never written through).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memrl.core.errors import ConfigError, MemrlError
from memrl.core.files import atomic_write_text, describe_os_error, naming, read_json
from memrl.core.secrets import redact

LOCK_FILE = ".memrl.lock"
CONFIG_FILE = "config.json"

# How a run is carried out, never what it measures: these may change on resumption wherever they sit (a model
# endpoint's timeout and retries, say), so that work that timed out can be rerun with more patience.
RUNTIME_KEYS = frozenset(
    {"workers", "max_in_flight", "ray_address", "timeout", "max_retries", "max_concurrency", "api_key", "deadline"}
)


@contextlib.contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Own `folder` (made if missing) for the `with` body; a run already holding it fails this one in one line."""
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by the run's subprocesses (O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MemrlError(
                f"{folder} is in use by another memrl run ({_owner(folder)}): wait for it to end, or use another "
                "output folder"
            ) from None
        pid_file = folder / LOCK_FILE
        _write_pid(pid_file)
        try:
            yield
        finally:
            # Best effort: on a full or read-only disk the error to report is the run's own, not this file's.
            with contextlib.suppress(OSError):
                pid_file.unlink(missing_ok=True)
            if created:  # a run that failed before writing anything leaves no empty folder behind
                with contextlib.suppress(OSError):
                    folder.rmdir()
    finally:
        os.close(fd)  # releases the lock


def _write_pid(path: Path) -> None:
    """Put this process's pid at `path` whole: written to a file of its own (O_EXCL never follows a link), then
    renamed over whatever was there (a killed run's file, a link planted to make memrl overwrite its target: a
    rename replaces the link itself), so a run refused a moment later reads a whole pid, never a half-written one."""
    staged = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        staged.unlink(missing_ok=True)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with naming(path):  # a full disk fails `write`, which names no file
                os.write(fd, f"{os.getpid()}\n".encode())
        finally:
            os.close(fd)
        os.replace(staged, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
        raise MemrlError(f"cannot write the run folder's lock file {describe_os_error(exc, path)}") from None


def _owner(folder: Path, patience: float = 2.0) -> str:
    """The holder's pid, as its lock file names it. The holder writes it just after taking the lock, so a run
    refused in between waits for it a moment."""
    deadline = time.monotonic() + patience
    while True:
        try:
            # Not following a link, nor waiting on a FIFO planted there; a pid is a few bytes.
            fd = os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                return f"pid {int(os.read(fd, 32))}"
            finally:
                os.close(fd)
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return "its pid not written yet"  # it took the lock a moment ago
            time.sleep(0.02)


def _setup(config: Any, ignored: Collection[str]) -> Any:
    """`config` (a JSON value) without the keys in `ignored` at its top, nor RUNTIME_KEYS at any depth."""
    if isinstance(config, dict):
        return {k: _setup(v, RUNTIME_KEYS) for k, v in config.items() if k not in ignored}
    if isinstance(config, list):
        return [_setup(v, RUNTIME_KEYS) for v in config]
    return config


def claim(out: Path, cfg: BaseModel, may_change: Collection[str] = ()) -> None:
    """Save the run's config in `out`, refusing a folder that holds a run with another setup.

    `may_change` names the top-level keys that say how much to run (users, sessions); they and RUNTIME_KEYS may
    differ on resumption. Anything else would mix the work of two experiments in one file.
    """
    saved = out / CONFIG_FILE
    # Redacted by value, as saved: an endpoint may hold a key (`?auth=${JUDGE_AUTH}`, `http://user:KEY@host`), and
    # a resumption compares what it would save with what was saved.
    now = _redacted(json.loads(cfg.model_dump_json()))
    if saved.exists():
        before = read_json(saved, ConfigError)
        if not isinstance(before, dict):
            raise ConfigError(f"{saved}: not a run's config (a JSON object); fix it or use another --out")
        # `before` redacted too: a folder saved before its secrets were masked holds them in full.
        old, new = _setup(_redacted(before), {*RUNTIME_KEYS, *may_change}), _setup(now, {*RUNTIME_KEYS, *may_change})
        changed = sorted(k for k in new if old.get(k) != new[k])
        if changed:
            raise ConfigError(
                f"{out} holds a run with different {', '.join(changed)}; use another output folder (--out, output_dir)"
            )
    atomic_write_text(saved, json.dumps(now, indent=2, ensure_ascii=False) + "\n")


def _redacted(config: Any) -> Any:
    """`config` (a JSON value) with every known secret masked in its strings."""
    if isinstance(config, dict):
        return {k: _redacted(v) for k, v in config.items()}
    if isinstance(config, list):
        return [_redacted(v) for v in config]
    return redact(config) if isinstance(config, str) else config
