"""Run an external trainer as a child process: its output goes to the console and a log; a failure names its tail."""

from __future__ import annotations

import collections
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from memrl.core.errors import MemrlError


def run_logged(
    argv: Sequence[str], log_path: Path, *, name: str, shown: str, env: Mapping[str, str], tail: int = 20
) -> None:
    """Run `argv`; `shown` is what the log records as the command (secrets stay `${NAME}` references there)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    last: collections.deque[str] = collections.deque(maxlen=tail)
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {shown}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=dict(env),
                bufsize=1,
            )
        except FileNotFoundError as exc:
            raise MemrlError(f"cannot start {argv[0]!r}: {exc.strerror}") from None
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
            last.append(line.rstrip("\n"))
        code = proc.wait()
    if code != 0:
        lines = "\n".join(f"  {line}" for line in last)
        raise MemrlError(f"{name} exited with code {code} (log: {log_path}); its last lines:\n{lines}")
