"""A signal that lands where Python can only report an exception (a `__del__`, an at-fork hook) still stops the run.

Python swallows an exception raised in a finalizer or an at-fork hook and prints "Exception ignored in ..."; a
SIGINT arriving there (logging's at-fork hook while Ray forks, in CI) was lost and the run sat until memrl's own
deadline. The child below sends itself the signal from inside a finalizer and from inside an at-fork hook; the
main thread must see `Interrupted` right after, and nothing may be reported as ignored.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from memrl.core import interrupts

    interrupts.install()
    where = sys.argv[1]

    def send():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at a bytecode boundary in here: its exception is swallowed
            pass

    class Finalized:
        def __del__(self):
            send()

    try:
        if where == "finalizer":
            Finalized()
        else:
            os.register_at_fork(after_in_parent=send)
            if os.fork() == 0:
                os._exit(0)
        time.sleep(5)
        print("not stopped")
    except interrupts.Interrupted as exc:
        print(f"stopped by {exc}, exit {interrupts.exit_code(exc)}")
    """
)


def _signals_as_a_shell_gives_them() -> None:
    """The child gets SIGINT unblocked and at its default (a test run in the background has it ignored)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("where", ["finalizer", "at-fork"])
def test_a_signal_raised_where_python_swallows_exceptions_still_stops(where: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, where],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
        preexec_fn=_signals_as_a_shell_gives_them,
    )
    assert done.stdout.strip() == "stopped by SIGINT, exit 130", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
