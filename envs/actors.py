"""What every environment driver shares: Ray start-up, local model servers, actor errors and safe resumption."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from memrl.core.errors import MemrlError, first_line
from memrl.core.jsonl import ResumableJsonl
from memrl.rollout.config import HFModelConfig, ModelConfig, OpenAIModelConfig, VLLMModelConfig
from memrl.rollout.serve import LocalServer, free_port, pick_engine, shared_server_args


def probe_ray(address: str | None) -> None:
    """Fail fast on a `host:port` where nothing listens: ray.init would keep retrying for minutes."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {exc}") from exc


def start_ray(address: str | None, stack: contextlib.ExitStack) -> None:
    """Connect to `address` (or start a local Ray) unless Ray is up already; the stack shuts down what it started."""
    import ray

    if ray.is_initialized():
        return
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    probe_ray(address)
    try:
        ray.init(address=address, include_dashboard=False, runtime_env={"env_vars": env})
    except (ConnectionError, RuntimeError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {first_line(exc)}") from exc
    stack.callback(ray.shutdown)


def actor_error_cause(exc: BaseException) -> BaseException:
    """The exception raised inside an actor, not Ray's wrapper around it."""
    return getattr(exc, "cause", None) or exc


ACTOR_RESTARTS = 4  # how often Ray brings a worker back after its process died (killed, OOM, segfault)


def spawn_workers(cls: type, n: int, *args: Any) -> list[Any]:
    """`n` actors of `cls(*args)`, dealt round-robin over the cluster's live CPU nodes, restarted when they die.

    Ray's SPREAD strategy, and even soft node affinity, are preferences that often put every zero-CPU actor on one
    node; each actor is pinned to its node instead. A killed worker restarts on its node and `InFlight` runs its
    calls once more; a node that dies takes its workers with it, the run stops in one line after `InFlight` waits for
    a restart, and a rerun (finished work is on disk) deals the workers over the nodes left.
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


def actor_died(exc: BaseException) -> bool:
    """Whether a call failed because its worker process or node went away (not because the work raised)."""
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError

    return isinstance(exc, RayActorError | WorkerCrashedError | NodeDiedError)


T = TypeVar("T")


class InFlight(Generic[T]):
    """Actor calls in flight, each tagged with the work it does.

    `submit(tag, actor, *args)` calls `actor.run(*args)`; `next()` waits for any call. A call whose actor died is
    made once more on the same handle, once Ray has restarted the actor, and counted in `retried`; a second death of
    the same work, or an exception raised by the work itself, fails the run with one line naming the work
    (`name(tag)`). Whatever finished before is already on disk, so a rerun resumes from there.
    """

    def __init__(
        self,
        name: Callable[[T], str],
        retries: int = 1,
        warn: Callable[[str], None] | None = None,
        restart_timeout: float = 600.0,
    ) -> None:
        self.name = name
        self.retries = retries
        self.warn = warn
        self.restart_timeout = restart_timeout
        self.retried = 0
        self._calls: dict[Any, tuple[T, Any, tuple[Any, ...], int]] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def submit(self, tag: T, actor: Any, *args: Any, attempt: int = 0) -> None:
        self._calls[actor.run.remote(*args)] = (tag, actor, args, attempt)

    def _await_restart(self, actor: Any) -> None:
        """Block until `actor` answers again (a call made while it restarts would fail at once)."""
        import ray
        from ray.exceptions import ActorUnavailableError

        deadline = time.monotonic() + self.restart_timeout
        while True:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except ActorUnavailableError:  # still restarting
                if time.monotonic() > deadline:
                    return  # the call made next fails and says why
                time.sleep(0.2)
            except Exception:
                return  # dead for good (restarts used up): the call made next fails and says why

    def next(self) -> tuple[T, Any]:
        import ray

        while True:
            ready, _ = ray.wait(list(self._calls), num_returns=1)
            tag, actor, args, attempt = self._calls.pop(ready[0])
            try:
                return tag, ray.get(ready[0])
            except Exception as exc:
                cause = actor_error_cause(exc)
                if not actor_died(exc):
                    raise MemrlError(f"{self.name(tag)} failed: {first_line(cause)}") from cause
                if attempt >= self.retries:
                    raise MemrlError(
                        f"{self.name(tag)} failed: its worker died {attempt + 1} times ({first_line(exc)})"
                    ) from exc
                self.retried += 1
                if self.warn is not None:
                    self.warn(f"the worker running {self.name(tag)} died; running it again on the restarted worker")
                self._await_restart(actor)
                self.submit(tag, actor, *args, attempt=attempt + 1)


FAILED_FILE = "failed.jsonl"  # work a model endpoint could not serve, one line per failed attempt


@dataclass
class EnvRun:
    """What a run left in its folder: finished records, work still failed, and this run's worker retries."""

    records: list[dict[str, Any]]
    failed: list[dict[str, Any]] = field(default_factory=list)
    planned: int = 0
    retried: int = 0

    @property
    def pending(self) -> int:
        """Planned work neither finished nor failed (what waits on a user's failed session or task)."""
        return self.planned - len(self.records) - len(self.failed)


class FailedWork:
    """Work whose model endpoint still failed after the client's retries: logged in `failed.jsonl`, said on the
    console, and run again by a rerun (it never reaches the finished records)."""

    def __init__(self, out: Path, console: Any) -> None:
        self.out = out
        self.console = console
        self.now: list[tuple[str, dict[str, Any]]] = []  # (what failed, its record), this run

    def add(self, what: str, record: dict[str, Any]) -> None:
        ResumableJsonl(self.out / FAILED_FILE, key="key").append(record)
        self.now.append((what, record))
        line = f"{what} failed: {record['error']} (a rerun runs it again)"
        self.console.print(line, style="red", markup=False, highlight=False)

    def check(self, finished: int) -> None:
        """A run in which work failed and none finished (an endpoint down from the start) fails in one line."""
        if self.now and not finished:
            what, record = self.now[0]
            raise MemrlError(f"{what} failed: {record['error']}")

    @staticmethod
    def outstanding(out: Path, done: Collection[str]) -> list[dict[str, Any]]:
        """The last failed attempt of every piece of work no run has finished since."""
        path = out / FAILED_FILE
        if not path.exists():
            return []
        return [r for key, r in ResumableJsonl(path, key="key").latest().items() if key not in done]


def endpoint_server(
    stack: contextlib.ExitStack, log_dir: Path, per_worker: int
) -> Callable[[ModelConfig | None], OpenAIModelConfig | None]:
    """A function mapping each model a run needs to an endpoint all workers share.

    An in-process model is served once (`transformers serve` with continuous batching on CPU, `vllm serve` with a
    GPU) so that requests from every worker batch together; an endpoint passes through with its share of the
    in-flight budget.
    """
    served: dict[str, OpenAIModelConfig] = {}

    def endpoint(cfg: ModelConfig | None) -> OpenAIModelConfig | None:
        if cfg is None:
            return None
        if isinstance(cfg, OpenAIModelConfig):
            return cfg.model_copy(update={"max_concurrency": per_worker})
        assert isinstance(cfg, HFModelConfig | VLLMModelConfig)
        if cfg.model not in served:
            extra = shared_server_args(pick_engine("auto"))
            log = log_dir / f"serve-{len(served)}.log"
            server = stack.enter_context(LocalServer(cfg.model, port=free_port(), log=log, extra_args=extra))
            served[cfg.model] = OpenAIModelConfig(
                backend="openai", model=server.name, endpoint=server.url, max_concurrency=per_worker
            )
        return served[cfg.model]

    return endpoint
