"""Running an external trainer: its command as a shell takes it, and the child process, whose output goes to the
console and a log (a failure names its tail)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Container, Mapping, Sequence
from pathlib import Path

from memrl.core.envrefs import ENV_REF
from memrl.core.errors import MemrlError
from memrl.rollout.serve import die_with_parent


def format_command(argv: Sequence[str], *, multiline: bool = False, live: Container[int] | None = None) -> str:
    """The command as a shell would take it (for --dry-run and the log). The arguments at the indexes in `live`
    (default: every argument holding a reference) are double-quoted with their `${NAME}` references left live, so the
    shell running the line fills them from its own environment, never with values written here. `multiline` puts the
    launcher up to the entry module (`-m MODULE`) on the first line, then one argument per continuation line."""
    parts = [
        _double_quote_keeping_refs(arg) if (ENV_REF.search(arg) if live is None else i in live) else shlex.quote(arg)
        for i, arg in enumerate(argv)
    ]
    if not multiline:
        return " ".join(parts)
    modules = [i for i, arg in enumerate(argv[:-1]) if arg == "-m"]
    split = modules[-1] + 2 if modules else len(argv)
    return " \\\n    ".join([" ".join(parts[:split]), *parts[split:]])


def _double_quote_keeping_refs(text: str) -> str:
    pieces = []
    last = 0
    for match in ENV_REF.finditer(text):
        pieces.append(_escape_double(text[last : match.start()]))
        pieces.append(match.group(0))
        last = match.end()
    pieces.append(_escape_double(text[last:]))
    return '"' + "".join(pieces) + '"'


def _escape_double(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


STOP_S = 5.0  # how long a launched trainer has to end (its launcher stops its ranks) before it is killed


def _stop(proc: subprocess.Popen[str], signum: int) -> None:
    """Pass the signal to the launch's process group, then kill what is left of it after STOP_S."""
    for sig, wait in ((signum, STOP_S), (signal.SIGKILL, 2.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


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
                # Its own process group, stopped by us (`_stop`) whether the signal reached the terminal's group or
                # this process alone (a scheduler's SIGTERM), and killed with us if we die first.
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except FileNotFoundError as exc:
            raise MemrlError(f"cannot start {argv[0]!r}: {exc.strerror}") from None
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
                last.append(line.rstrip("\n"))
            code = proc.wait()
        except KeyboardInterrupt as exc:  # SIGINT or SIGTERM: the launch gets it too, then has seconds to end
            _stop(proc, getattr(exc, "signum", signal.SIGINT))
            raise
    if code != 0:
        lines = "\n".join(f"  {line}" for line in last)
        raise MemrlError(f"{name} exited with code {code} (log: {log_path}); its last lines:\n{lines}")
