"""One pool of Ray actors for every user (the driver's workers, online RL's episode actors, the next-session reward's
players), with one fault rule: a call whose actor died is made once more on the restarted actor, after an optional
replay of what the new actor must redo first (online RL replays the episode's earlier steps; the others need none)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Generic, TypeVar

from memrl.core.asyncs import close_loop
from memrl.core.errors import MemrlError, first_line

R = TypeVar("R")
T = TypeVar("T")

ACTOR_RESTARTS = 4  # how often Ray brings a worker back after its process died (killed, OOM, segfault)


def actor_error_cause(exc: BaseException) -> BaseException:
    """The exception raised inside an actor, not Ray's wrapper around it."""
    return getattr(exc, "cause", None) or exc


def actor_died(exc: BaseException) -> bool:
    """Whether a call failed because its worker process or node went away (not because the work raised)."""
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError

    return isinstance(exc, RayActorError | WorkerCrashedError | NodeDiedError | ActorLost)


class ActorLost(RuntimeError):
    """The actor answered without the state the call needs: it restarted since (an attempt raises it)."""


class ActorDied(RuntimeError):
    """A call's actor died again on the restarted actor: the call fails (`why`: the last death, in one line)."""

    def __init__(self, deaths: int, why: str) -> None:
        super().__init__(f"its worker died {deaths} times ({why})")
        self.why = why


def death(exc: BaseException) -> str:
    """Why an actor died, in one line a user reads: Ray's message without its colour codes and the actor's id (a
    32-digit hex string that says nothing to anyone but Ray)."""
    return " ".join(_RAY_ID.sub("", first_line(exc)).split())


_RAY_ID = re.compile(r"\b[0-9a-f]{16,}\b")


def spawn_workers(cls: type, n: int, *args: Any) -> list[Any]:
    """`n` actors of `cls(*args)`, dealt round-robin over the cluster's live CPU nodes, restarted when they die.

    Ray's SPREAD strategy, and even soft node affinity, are preferences that often put every zero-CPU actor on one
    node; each actor is pinned to its node instead. A killed worker restarts on its node and `ActorPool.call` makes
    its call once more; a node that dies takes its workers with it, the call fails in one line after the pool waited
    for a restart, and a rerun (finished work is on disk) deals the workers over the nodes left.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0]
    nodes = sorted(node["NodeID"] for node in alive)
    actor: Any = ray.remote(cls)
    workers = []
    for i in range(n):
        strategy: Any = NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=False) if nodes else "SPREAD"
        options = actor.options(num_cpus=0, scheduling_strategy=strategy, max_restarts=ACTOR_RESTARTS)
        workers.append(options.remote(*args))
    return workers


class ActorPool:
    """`n` actors of `cls(*args)` (`spawn_workers`), addressed by index; Ray restarts one whose process died."""

    def __init__(self, cls: type, n: int, *args: Any, restart_timeout: float = 600.0) -> None:
        self.actors = spawn_workers(cls, n, *args)
        self.restart_timeout = restart_timeout
        self._restarts: dict[int, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self.actors)

    async def call(
        self,
        actor: int,
        attempt: Callable[[Any], Awaitable[R]],
        *,
        died: Callable[[str], None] | None = None,
        replay: Callable[[], Awaitable[None]] | None = None,
    ) -> R:
        """`attempt(handle)` on actor `actor`. When the actor dies under it (Ray's error, or `ActorLost`), `died(why)`
        is told (it may raise: its caller's own rule), the call waits for the restart (`ready`), runs `replay()` and
        attempts once more; a second death raises `ActorDied`. An error of the work itself is raised as the actor
        raised it."""
        deaths = 0
        while True:
            try:
                return await attempt(self.actors[actor])
            except Exception as exc:
                cause = actor_error_cause(exc)
                if not actor_died(exc):
                    if cause is exc:
                        raise
                    raise cause from exc
                deaths += 1
                if deaths > 1:
                    raise ActorDied(deaths, death(exc)) from exc
                if died is not None:
                    died(death(exc))
                await self.ready(actor)
                if replay is not None:
                    await replay()

    async def ready(self, actor: int) -> None:
        """Wait until Ray has restarted `actor` (a call made while it restarts fails at once); every caller waiting
        on one actor shares one wait, so their calls go out together."""
        waiting = self._restarts.get(actor)
        if waiting is None or waiting.done():
            waiting = self._restarts[actor] = asyncio.ensure_future(self._answers(self.actors[actor]))
        await waiting

    async def _answers(self, handle: Any) -> None:
        from ray.exceptions import ActorUnavailableError

        deadline = time.monotonic() + self.restart_timeout
        while time.monotonic() < deadline:
            try:
                await handle.__ray_ready__.remote()
                return
            except ActorUnavailableError:  # still restarting
                await asyncio.sleep(0.2)
            except Exception:
                return  # dead for good (restarts used up): the call made next fails and says why

    async def run(self, actor: int, *args: Any, died: Callable[[str], None] | None = None) -> Any:
        """Actor `actor`'s `run(*args)`, under the pool's fault rule (`call`)."""
        return await self.call(actor, lambda handle: handle.run.remote(*args), died=died)

    def close(self, before: str | None = None) -> None:
        """End the actors, each after its method `before` (the actor's own clients) where given."""
        import ray

        if not ray.is_initialized():
            return
        for handle in self.actors:
            if before is not None:
                with contextlib.suppress(Exception):
                    ray.get(getattr(handle, before).remote(), timeout=10)
            ray.kill(handle, no_restart=True)


class LocalPool:
    """`n` workers of `cls(*args)` in this process, for a run that needs no other (its models load in-process, and
    their sessions batch there): calls run on the caller's event loop, and nothing dies apart from the caller."""

    def __init__(self, cls: type, n: int, *args: Any) -> None:
        self.workers = [cls(*args) for _ in range(n)]

    async def run(self, actor: int, *args: Any, died: Callable[[str], None] | None = None) -> Any:
        return await self.workers[actor].run(*args)


class InFlight(Generic[T]):
    """Calls on a pool's actors in flight, each tagged with the work it does, for a caller without an event loop.

    `submit(tag, actor, *args)` calls actor `actor`'s `run(*args)`; `next()` waits for any call. A call whose actor
    died runs once more on the restarted actor (`ActorPool.call`), said through `warn` and counted in `retried`; a
    second death of the same work, or an exception raised by the work itself, fails the run with one line naming
    the work (`name(tag)`). Whatever finished before is already on disk, so a rerun resumes from there.
    """

    def __init__(
        self, pool: ActorPool | LocalPool, name: Callable[[T], str], warn: Callable[[str], None] | None = None
    ) -> None:
        self.pool = pool
        self.name = name
        self.warn = warn
        self.retried = 0
        self._loop = asyncio.new_event_loop()
        self._calls: dict[asyncio.Task[Any], T] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def submit(self, tag: T, actor: int, *args: Any) -> None:
        call = self.pool.run(actor, *args, died=partial(self._died, tag))
        self._calls[self._loop.create_task(call)] = tag

    def _died(self, tag: T, why: str) -> None:
        self.retried += 1
        if self.warn is not None:
            self.warn(f"the worker running {self.name(tag)} died; running it again on the restarted worker")

    def next(self) -> tuple[T, Any]:
        done, _ = self._loop.run_until_complete(asyncio.wait(self._calls, return_when=asyncio.FIRST_COMPLETED))
        # The oldest finished call, not the set's first: a set of tasks iterates in memory-address order, which moves
        # from run to run, and the order calls are taken decides which requests the next batch holds together (in a
        # local run, rows that sit beside each other round alike): a seeded local run writes the same texts again.
        task = next(t for t in self._calls if t in done)
        tag = self._calls.pop(task)
        try:
            return tag, task.result()
        except Exception as exc:
            raise MemrlError(f"{self.name(tag)} failed: {first_line(exc)}") from exc

    def close(self) -> None:
        """Cancel the calls still in flight (a run that stops early) and end the event loop."""
        self._calls.clear()
        close_loop(self._loop)
