"""An output folder a run owns: one run at a time (`hold`), and one setup for every run that resumes in it (`claim`).

Two runs appending to one folder would record every piece of work twice; a run resumed with another setup would mix
two experiments in one file. `hold` takes an exclusive `flock` on the folder itself, which the kernel releases when
the process ends however it ends, so a killed run never leaves a lock behind; the holder's pid sits in `LOCK_FILE`
only to name it in the refusal (a file left by a killed run is simply taken over).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memrl.core.errors import ConfigError, MemrlError
from memrl.core.files import atomic_write_text, read_json

LOCK_FILE = ".memrl.lock"
CONFIG_FILE = "config.json"

# How a run is carried out, never what it measures: these may change on resumption wherever they sit (a model
# endpoint's timeout and retries, say), so that work that timed out can be rerun with more patience.
RUNTIME_KEYS = frozenset(
    {"workers", "max_in_flight", "ray_address", "timeout", "max_retries", "max_concurrency", "api_key"}
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
        pid_file.write_text(f"{os.getpid()}\n")
        try:
            yield
        finally:
            pid_file.unlink(missing_ok=True)
            if created:  # a run that failed before writing anything leaves no empty folder behind
                with contextlib.suppress(OSError):
                    folder.rmdir()
    finally:
        os.close(fd)  # releases the lock


def _owner(folder: Path) -> str:
    try:
        return f"pid {int((folder / LOCK_FILE).read_text())}"
    except (OSError, ValueError):
        return "its pid not written yet"  # it took the lock a moment ago


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
    now = json.loads(cfg.model_dump_json())
    if saved.exists():
        before = read_json(saved, ConfigError)
        if not isinstance(before, dict):
            raise ConfigError(f"{saved}: not a run's config (a JSON object); fix it or use another --out")
        old, new = _setup(before, {*RUNTIME_KEYS, *may_change}), _setup(now, {*RUNTIME_KEYS, *may_change})
        changed = sorted(k for k in new if old.get(k) != new[k])
        if changed:
            raise ConfigError(f"{out} holds a run with different {', '.join(changed)}; use another --out")
    atomic_write_text(saved, cfg.model_dump_json(indent=2) + "\n")
