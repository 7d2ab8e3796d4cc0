"""`in_own_thread`: blocking work off the loop in a thread that ends with the call, freeing torch's OpenMP pool."""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from memrl.core.asyncs import in_own_thread

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
from memrl.core.asyncs import in_own_thread

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
