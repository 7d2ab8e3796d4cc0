"""asyncio helpers shared by the layers: run a coroutine from sync code, run blocking work off the event loop, and
gather single requests into batches."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Generic, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")
Request = TypeVar("Request")
Result = TypeVar("Result")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def close_loop(loop: asyncio.AbstractEventLoop, timeout: float = 5.0) -> None:
    """Close an event loop this code runs by hand (`run_until_complete`): its tasks still pending (a run stopped by
    a signal or an error mid-way) are cancelled and given `timeout` seconds in all to end first, as `asyncio.run`
    does, so none is destroyed pending (asyncio's "Task was destroyed but it is pending!") and none holds a
    connection. Tasks started while the first ones end (a timer's batch, a cleanup's call) are cancelled in turn."""
    if loop.is_closed():
        return
    deadline = time.monotonic() + timeout
    while (pending := [task for task in asyncio.all_tasks(loop) if not task.done()]) and (
        left := deadline - time.monotonic()
    ) > 0:
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.wait(pending, timeout=left))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


async def in_own_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` in a thread that ends with the call, for blocking work that runs torch.

    torch's OpenMP runtime (libgomp) keeps a thread pool for every thread that ran a parallel op, for as long as that
    thread lives. Once the live pools' threads outnumber the cores, every pool sleeps between ops instead of spinning,
    and a small model's many small ops pay a wake-up each: on 2 cores, decoding next to one idle pool of a long-lived
    worker (asyncio's default executor) took 15-16 s instead of 13 s and kept 1.2 cores busy instead of 1.9
    (benchmarks/README.md, "No second OpenMP thread pool"). A thread that ends frees its pool.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memrl-work")
    try:
        call = partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(pool, call)
    finally:
        pool.shutdown(wait=False)  # the thread ends when the call returns, also when the awaiting task was cancelled


class MicroBatcher(Generic[Request, Result]):
    """Collects single requests made on one event loop within `wait_s` (at most `max_batch`) and hands them to
    `score` together: verl calls a reward function once per sample, a batch feeds the judge or the env in one go."""

    def __init__(
        self, score: Callable[[list[Request]], Awaitable[list[Result]]], wait_s: float, max_batch: int = 256
    ) -> None:
        self.score = score
        self.wait_s = wait_s
        self.max_batch = max_batch
        self.pending: list[tuple[Request, asyncio.Future[Result]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.running: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones

    async def submit(self, request: Request) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self.pending.append((request, future))
        if len(self.pending) >= self.max_batch:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # A caller cancelled while it waited (a stopping run) left its future done: nothing to compute for it.
        batch, self.pending = [(r, f) for r, f in self.pending if not f.done()], []
        if batch:
            task = asyncio.ensure_future(self._run(batch))
            self.running.add(task)
            task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if not task.cancelled():
            # Only a signal's KeyboardInterrupt ends a batch with an error (`_run` hands the others to its callers),
            # and it left the loop's run already: seen, so asyncio does not print it again as never retrieved.
            task.exception()

    async def _run(self, batch: list[tuple[Request, asyncio.Future[Result]]]) -> None:
        try:
            results = await self.score([request for request, _ in batch])
        except Exception as exc:  # hand the error to every waiting caller instead of losing it in a task
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # a signal raised here: it leaves the loop's run once; the callers stop waiting
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
