"""What every environment driver shares: Ray start-up, local model servers, actor errors and safe resumption."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from memrl.core.errors import MemrlError, first_line
from memrl.core.jsonl import ResumableJsonl
from memrl.core.secrets import redact
from memrl.rollout.config import HFModelConfig, ModelConfig, OpenAIModelConfig, VLLMModelConfig
from memrl.rollout.serve import LocalServer, free_port, pick_engine, shared_server_args

# The opening of an HTTP/2 connection (the client preface, then an empty SETTINGS frame): Ray's GCS is a gRPC
# server, and a gRPC server answers it with a SETTINGS frame of its own at once.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the type of an HTTP/2 frame, its 4th byte
RAY_PROBE_S = 5.0


def probe_ray(address: str | None, timeout: float = RAY_PROBE_S) -> None:
    """Fail fast, in one line, on an address that is no Ray cluster: where nothing listens, or where a server that
    is not Ray (a web server, say) accepts the connection; ray.init would keep retrying for minutes. Takes the
    GCS's `HOST:PORT` and a Ray client's `ray://HOST:PORT` (both gRPC servers); `auto` (a cluster Ray finds) and
    `local` (a new one) are Ray's own."""
    if not address or address in ("auto", "local"):
        return
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme != "ray":
        raise MemrlError(
            f"Ray address {address!r}: give the cluster's GCS address HOST:PORT (as `ray start --head` printed it), "
            "auto, or ray://HOST:PORT"
        )
    host, _, port = rest.rpartition(":")
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")  # the handshake below is cleartext HTTP/2
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            if tls:
                return
            sock.sendall(_HTTP2_PREFACE)
            head = _read(sock, 9)
    except (OSError, ValueError, OverflowError) as exc:  # OverflowError: a port past 65535
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {exc or type(exc).__name__}") from None
    if len(head) < 9 or head[3] != _SETTINGS:
        raise MemrlError(
            f"{address} is not a Ray cluster: the server there does not speak gRPC, as Ray's GCS does (give the "
            "address `ray start --head` printed, HOST:6379 by default)"
        )


def _read(sock: socket.socket, n: int) -> bytes:
    """Up to `n` bytes: fewer when the peer closes first."""
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data


def start_ray(address: str | None, stack: contextlib.ExitStack) -> None:
    """Connect to `address` (or start a local Ray) unless Ray is up already; the stack shuts down what it started."""
    import ray

    if ray.is_initialized():
        return
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    try:
        probe_ray(address or os.environ.get("RAY_ADDRESS"))  # ray.init reads RAY_ADDRESS when given no address
    except MemrlError as exc:
        raise MemrlError(f"{exc} (from $RAY_ADDRESS)" if not address else str(exc)) from None
    local = (address or os.environ.get("RAY_ADDRESS") or "local") == "local"  # a new Ray of this driver's own
    if local:
        # Ray's memory monitor kills the newest workers when the machine runs short, whoever holds the memory: on a
        # shared machine that is our sessions for another job's use. The kernel's OOM killer picks the hog instead.
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    try:
        context = ray.init(address=address, include_dashboard=False, runtime_env={"env_vars": env})
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {first_line(exc)}") from exc
    if local:
        session_dir = cast(Any, context).address_info["session_dir"]  # ray.init starts a local Ray: a RayContext
        stack.callback(_reaper(session_dir))  # runs after ray.shutdown, registered next
    stack.callback(ray.shutdown)


# Notes the driver's Ray processes twice a second (those naming the session folder, and Ray's agents and workers, titled
# `ray::...`) until its stdin closes, which happens when the driver exits however it exits (SIGKILL included), then
# kills those still running (psutil checks each one's start time, so a reused pid is spared).
_REAPER = """
import os, select, sys, psutil
driver, session, seen = psutil.Process(int(sys.argv[1])), sys.argv[2], {}
def note(p):
    try:
        line = " ".join(p.cmdline())
    except psutil.Error:  # gone already
        return
    if p.pid != os.getpid() and (session in line or line.startswith("ray::")):
        seen[p.pid] = p
while not (select.select([0], [], [], 0.5)[0] and not os.read(0, 1)):
    try:
        children = driver.children(recursive=True)
    except psutil.Error:  # the driver is gone
        break
    for p in children:
        note(p)
for p in seen.values():
    try:
        p.kill()
    except psutil.Error:
        pass
"""


def _reaper(session_dir: str) -> Callable[[], None]:
    """A watchdog for the local Ray this driver started: a killed driver could leave Ray's dashboard and runtime-env
    agents alive for a minute (each reporting to the dead GCS), holding memory and CPU that the rerun needs. Returns
    what releases it on a normal exit (after `ray.shutdown`)."""
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(os.getpid()), session_dir], stdin=subprocess.PIPE, start_new_session=True
    )
    stdin = watchdog.stdin
    assert stdin is not None

    def release() -> None:
        stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(10)  # what ray.shutdown left, if anything, is gone

    return release


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
        # A worker knows none of the driver's secrets (the ${VAR}s it resolved): its error text is masked here.
        record = {**record, "error": redact(str(record["error"]))}
        ResumableJsonl(self.out / FAILED_FILE, key="key").append(record)
        self.now.append((what, record))
        line = f"{what} failed: {record['error']} (a rerun runs it again)"
        self.console.print(line, style="red", markup=False, highlight=False)

    @staticmethod
    def outstanding(out: Path, done: Collection[str]) -> list[dict[str, Any]]:
        """The last failed attempt of every piece of work no run has finished since."""
        path = out / FAILED_FILE
        if not path.exists():
            return []
        return [r for key, r in ResumableJsonl(path, key="key").latest().items() if key not in done]


# How a worker waits on a server this run started. transformers serve queues whatever it is sent and finishes a
# non-streamed request whose client gave up, so a timeout plus a retry ran it twice and load lengthened the queue:
# its requests stream (the server stops a streamed request whose connection closed) and only the server's silence
# fails them. vLLM aborts any request whose connection closes: a timeout and a retry, as for any endpoint.
LOCAL_DEADLINES: dict[str, dict[str, Any]] = {
    "transformers": {"deadline": "progress", "timeout": 600.0},
    "vllm": {},
}


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
            engine = pick_engine("auto")
            log = log_dir / f"serve-{len(served)}.log"
            server = LocalServer(cfg.model, port=free_port(), log=log, extra_args=shared_server_args(engine))
            stack.enter_context(server)
            served[cfg.model] = OpenAIModelConfig(
                backend="openai",
                model=server.name,
                endpoint=server.url,
                max_concurrency=per_worker,
                **LOCAL_DEADLINES[engine],
            )
        return served[cfg.model]

    return endpoint
