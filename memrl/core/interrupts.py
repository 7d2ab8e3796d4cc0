"""Stopping on SIGINT and SIGTERM: one exception, raised in the main thread, that every layer lets pass.

The `memrl` command installs `handle` for both signals before anything else (its imports take seconds on a loaded
machine). A signal becomes `Interrupted`, a KeyboardInterrupt (so `except Exception` anywhere lets it through, and
asyncio and the trainers treat it as Ctrl-C), raised in the main thread wherever it is. Each `with` and `finally` on
the way out ends what it started (requests and episodes in flight, servers, Ray actors and Ray itself), while what
finished is on disk already; the command then prints `line()` and exits 128 + the signal's number (130, 143).

A second signal while stopping is noted, not raised, so cleanup is not cut half-way; if stopping takes more than
STOP_S anyway (a loaded machine, a call that will not return), the process ends itself with the same line and
status, and the Ray and the servers it started die with it (their watchdogs: envs/ray_start.py, rollout/serve.py).
Work running outside the main thread asks `stopping()` to end early (a generation stops at its next token).

Python swallows an exception raised where it can only report it ("Exception ignored in ..."): an at-fork hook
(logging's, while Ray or a server forks), a `__del__`, a weakref callback. A signal landing there would be lost
and the run would sit until the deadline; `install` adds an unraisable hook that delivers it again to the main
thread instead.

Libraries replace handlers: `ray.init` installs its own for SIGTERM (Ray's C++ core worker aborts with a stack
dump), so code that starts one wraps it in `kept()`. This module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_S = 10.0  # how long cleanup may take after the first signal before the process ends itself
REDELIVER_S = 0.05  # after a signal's exception was swallowed, how soon the main thread gets the signal again

_first: int | None = None  # the signal being handled, once one came
_hints: list[str] = []  # how to resume what is running, innermost last
_resume: str | None = None  # how to resume what a signal stopped, kept as the stack unwound past its hint
_swallowed = False  # the first signal's Interrupted was raised where Python could only report it: raise it again


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: stop, keeping what finished."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _signum(exc: BaseException | None) -> int:
    return exc.signum if isinstance(exc, Interrupted) else _first or signal.SIGINT


def exit_code(exc: BaseException | None = None) -> int:
    """128 + the signal's number (`exc`'s, else the one handled), as a shell reports a process a signal ended; 130
    for a bare KeyboardInterrupt."""
    return 128 + _signum(exc)


def line(exc: BaseException | None = None) -> str:
    """The one line a stopped command prints: which signal, and how to resume."""
    resume = _resume or (_hints[-1] if _hints else None)
    hint = f"; resume with: {resume}" if resume else ""
    return f"memrl: stopped by {signal.Signals(_signum(exc)).name}{hint}"


def stopping() -> bool:
    """Whether a signal asked this process to stop (for work outside the main thread, which never sees it raised)."""
    return _first is not None


def handle(signum: int, frame: FrameType | None) -> None:
    global _first, _swallowed
    if _swallowed:  # delivered again by _unraisable: this time it lands where it can unwind the stack
        _swallowed = False
        raise Interrupted(_first or signum)
    if _first is not None:  # stopping already: cleanup runs on, bounded by the deadline below
        return
    _first = signum
    deadline = threading.Timer(STOP_S, _end, (signum,))
    deadline.daemon = True
    deadline.start()
    raise Interrupted(signum)


def _end(signum: int) -> None:
    """The deadline: cleanup did not finish in STOP_S; end the process now, saying so in the same one line."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        os.write(2, (line(Interrupted(signum)) + "\n").encode())
    os._exit(128 + signum)


def _unraisable(report: sys.UnraisableHookArgs, previous: Callable[[sys.UnraisableHookArgs], object]) -> None:
    global _swallowed
    if not isinstance(report.exc_value, Interrupted):
        previous(report)
        return
    _swallowed = True
    # Sent from another thread a moment later: sent now, `handle` would run inside this hook and be swallowed again.
    # Should it land in such a place anyway, this hook runs again and so does the redelivery.
    again = threading.Timer(REDELIVER_S, signal.pthread_kill, (threading.main_thread().ident, report.exc_value.signum))
    again.daemon = True
    again.start()


def install() -> None:
    """Make SIGINT and SIGTERM raise `Interrupted` in the main thread (a no-op elsewhere: Python allows handlers only
    there). SIGINT ignored by the parent (`cmd &` in a script) stays ignored, as a shell expects."""
    if threading.current_thread() is not threading.main_thread():
        return
    if not isinstance(sys.unraisablehook, functools.partial) or sys.unraisablehook.func is not _unraisable:
        sys.unraisablehook = functools.partial(_unraisable, previous=sys.unraisablehook)
    for sig in SIGNALS:
        if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        signal.signal(sig, handle)


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Put back this thread's SIGINT and SIGTERM handlers after the body (a library that replaces them: ray.init)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                # Setting it again also replaces a handler installed in C (Ray's core worker aborts on SIGTERM).
                signal.signal(sig, handler)


@contextlib.contextmanager
def resume_hint(command: str) -> Iterator[None]:
    """While the body runs, `line()` tells a stopped command's user to run `command` to resume."""
    global _resume
    _hints.append(command)
    try:
        yield
    except KeyboardInterrupt:  # kept: the stack unwinds past the hint before the line is printed
        _resume = _resume or command
        raise
    finally:
        _hints.remove(command)
