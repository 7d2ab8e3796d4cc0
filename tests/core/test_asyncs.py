"""`in_own_thread`: blocking work off the loop in a thread that ends with the call, freeing torch's OpenMP pool."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memrl.core.asyncs import MicroBatcher, close_loop, in_own_thread

REQUEST = contextvars.ContextVar("REQUEST", default="none")


def test_returns_the_result_raises_the_error_and_carries_the_context() -> None:
    def work(x: int, *, y: int) -> tuple[int, str, bool]:
        return x + y, REQUEST.get(), threading.current_thread() is threading.main_thread()

    def fail() -> None:
        raise ValueError("boom")

    async def main() -> tuple[int, str, bool]:
        REQUEST.set("r1")
        with pytest.raises(ValueError, match="boom"):
            await in_own_thread(fail)
        return await in_own_thread(work, 2, y=3)

    assert asyncio.run(main()) == (5, "r1", False)


# Counts the process's OS threads (OpenMP workers included) after each way of running a parallel torch op off the loop.
_PROBE = """
import asyncio, os, sys, time
import torch
from memrl.core.asyncs import MicroBatcher, close_loop, in_own_thread

def parallel_op():
    (torch.randn(4_000_000) * 2).sum()  # far above torch's grain size: runs on the thread's OpenMP pool

def threads():
    return len(os.listdir("/proc/self/task"))

def settled(want):
    deadline = time.monotonic() + 5
    while threads() != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads()

parallel_op()  # the main thread's own pool, as a trainer has
base = threads()

async def main():
    for _ in range(3):
        await in_own_thread(parallel_op)
    own = settled(base)
    await asyncio.to_thread(parallel_op)  # asyncio's default executor: its worker, and that worker's pool, stay
    print(base, own, threads())

asyncio.run(main())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through Linux's /proc")
def test_the_threads_openmp_pool_ends_with_the_call() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    base, own, default_executor = map(int, out.stdout.split())
    assert own == base  # the worker and its OpenMP pool are gone
    assert default_executor >= base + 2  # the contrast: a long-lived worker keeps a second pool alive


def test_no_module_runs_blocking_work_on_asyncios_default_executor() -> None:
    root = Path(__file__).resolve().parents[2]
    layers = ("memrl", "rollout", "rewards", "envs", "data_gen", "train")
    sources = [p for layer in layers for p in (root / layer).rglob("*.py")]
    assert len(sources) > 50
    offenders = [
        str(p.relative_to(root))
        for p in sources
        if "asyncio.to_thread(" in (text := p.read_text(encoding="utf-8")) or "run_in_executor(None" in text
    ]
    assert offenders == []  # use memrl.core.asyncs.in_own_thread: a long-lived worker keeps a second OpenMP pool


# ---- MicroBatcher and close_loop: a run stopped mid-batch leaves nothing for asyncio to complain about -------------


def _watched_loop() -> tuple[asyncio.AbstractEventLoop, list[str]]:
    """A loop whose exception handler keeps what asyncio would print ("Task was destroyed but it is pending!")."""
    loop = asyncio.new_event_loop()
    said: list[str] = []
    loop.set_exception_handler(lambda _loop, context: said.append(str(context["message"])))
    return loop, said


def test_a_batch_due_while_the_loop_closes_ends_with_it() -> None:
    """A signal cancels the callers while their batch still waits for its timer: the timer must start no work that
    outlives the loop, where asyncio would report it "destroyed but pending" (`memrl run quickstart` on SIGINT)."""
    started: list[int] = []

    async def score(batch: list[int]) -> list[int]:
        started.append(len(batch))
        await in_own_thread(threading.Event().wait, 0.5)
        return batch

    held = [MicroBatcher(score, wait_s=0.05)]  # dropped before collecting: it keeps its running batches

    async def episode() -> int:
        try:
            return await held[0].submit(1)
        finally:
            await asyncio.sleep(0.2)  # its cleanup outlasts the batch's timer

    loop, said = _watched_loop()
    caller = loop.create_task(episode())
    loop.run_until_complete(asyncio.sleep(0))  # the request waits for the timer
    close_loop(loop)
    del caller
    held.clear()
    time.sleep(0.6)  # a batch still running in its thread holds the task until the thread ends
    gc.collect()
    assert said == []
    assert started == []  # every caller of that batch was gone: nothing to score


def test_a_signal_inside_a_batch_reaches_the_caller_once() -> None:
    """KeyboardInterrupt raised inside a batch's task (a signal landing there) leaves run_until_complete once; its
    callers end, and asyncio prints no "Task exception was never retrieved" for the task later."""

    async def score(batch: list[int]) -> list[int]:
        raise KeyboardInterrupt

    loop, said = _watched_loop()
    batcher = MicroBatcher(score, wait_s=0.0)
    waiting = [loop.create_task(batcher.submit(i)) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(asyncio.wait(waiting))
    close_loop(loop)
    assert all(task.cancelled() for task in waiting)
    del waiting, batcher
    gc.collect()
    assert said == []


def test_close_loop_also_ends_the_tasks_a_cancelled_one_starts() -> None:
    loop, said = _watched_loop()

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        finally:  # a cleanup that starts more work, as a stopped episode closing its environment does
            loop.create_task(asyncio.sleep(60))

    loop.create_task(work())
    loop.run_until_complete(asyncio.sleep(0))
    close_loop(loop)
    gc.collect()
    assert said == []
    assert loop.is_closed()
