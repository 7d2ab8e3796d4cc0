"""The one environment driver: an environment's work, as chains, run on Ray workers into one records file.

An environment says what to run and on what: `Chain`s (each user's sessions or tasks in order; independent work is
chains of one item), a `Schedule` (how an item is keyed, named and sent, how a finished record advances its chain)
and a `World` (the worker class, the model roles it needs, its spec). `drive` does the rest, the same way for every
environment:

- the records file: each finished record is appended (fsync'ed) once, as it comes, so a crash loses nothing
  finished; a rerun skips finished items, and a chain resumes from the state its last finished item left;
- the workers: a local run whose models all load in-process runs one worker in this process, its sessions'
  requests batched in the model (`World.in_process`); otherwise how many (`workers`, else min(chains, CPUs, 8),
  never more than the chains left) and each one's share of `max_in_flight` requests per model endpoint, with
  in-process models served once for them all;
- Ray (not for a run in this process): started (or joined at `ray_address`) only when work is left, workers
  spawned (`ActorPool`), a call whose worker died run once more on the restarted worker (`InFlight`);
- faults: an item whose model endpoint failed after the client's retries goes to `failed.jsonl` and stops its
  chain for this run (later items need its state); a rerun runs it again; a run where items failed and none
  finished returns a `DrivenRun` whose `check()` raises one line with the counts and the first failure
  (`core.outcomes`, after the caller has written its metrics, so that they say what the folder holds);
- a records file holding a key twice (written by an older memrl, or two runs at once before folders were held)
  counts it once;
- a progress bar over all planned items, and the `DrivenRun` the caller reports from.

What any environment run leaves in its folder is here too: `EnvRun` (finished records, failed work) and
`FailedWork` (`failed.jsonl`, which TOD and PAHF runs keep as well).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from rich.console import Console

from memrl.core.files import ResumableJsonl
from memrl.core.outcomes import Outcome, require_success, shortfall
from memrl.core.progress import progress
from memrl.core.secrets import redact
from memrl.envs.endpoints import endpoint_server
from memrl.envs.pool import ActorPool, InFlight, LocalPool
from memrl.envs.ray_start import start_ray
from memrl.rollout.config import HFModelConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Item = TypeVar("Item")
State = TypeVar("State")
Roles = TypeVar("Roles", bound="DataclassInstance")

MAX_DEFAULT_WORKERS = 8
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


@dataclass(frozen=True)
class Chain(Generic[Item, State]):
    """Work that runs in order, each item on the state the item before it left (independent work: one item)."""

    id: str
    items: Sequence[Item]  # every planned item, finished ones included: the driver skips what is on disk
    state: State  # what the first item needs


@dataclass(frozen=True)
class Schedule(Generic[Item, State]):
    """How an environment's items run: everything the driver needs to know about them."""

    key: Callable[[Item], str]  # the `key` of the item's record (finished or failed)
    name: Callable[[Item], str]  # the item in messages: "user u session 3"
    args: Callable[[Item, State], tuple[Any, ...]]  # what the worker's `run` gets for the item
    advance: Callable[[State, dict[str, Any]], State] | None = None  # the chain's state after a record (None: kept)
    pinned: bool = True  # every item of a chain runs on the chain's worker (else: the workers in turn)
    at_once: int | None = None  # chains in flight at once (None: all)


@dataclass(frozen=True)
class World(Generic[Roles]):
    """What the work runs on."""

    worker: type  # the actor class: built once per worker with `spec(roles)`; `run(*args)` does one item
    roles: Roles  # a dataclass whose fields are the model configs the run needs (None: not needed)
    spec: Callable[[Roles], Any]  # the worker's spec, from the roles as served

    def in_process(self, cfg: Spread) -> bool:
        """Whether the run's one worker runs in this process, with no server and no Ray: a local run (no
        `ray_address`, no `workers`) whose models are all transformers models loaded here. Their requests batch in
        the model itself (`HFBackend.achat`), as they would on a server; a server and Ray would add only their
        start-up, and a second worker would load a second copy on the same cores. `workers: N` runs N Ray actors
        sharing one served model instead."""
        if cfg.workers is not None or cfg.ray_address is not None:
            return False
        models = [getattr(self.roles, f.name) for f in dataclasses.fields(self.roles)]
        return all(model is None or isinstance(model, HFModelConfig) for model in models)


class Spread(Protocol):
    """How a run spreads its work (every environment's config says it)."""

    @property
    def workers(self) -> int | None: ...

    @property
    def max_in_flight(self) -> int: ...

    @property
    def ray_address(self) -> str | None: ...


@dataclass
class DrivenRun(EnvRun):
    """What a run left in its folder, and how this run's own work went (`ran`: what was left to do)."""

    ran: Outcome | None = None

    @property
    def fault(self) -> str | None:
        """Why the run failed as a whole (work failed and none finished), or None."""
        return shortfall(self.ran) if self.ran is not None else None

    def check(self, what: str = "run", min_share: float = 0.0, then: str = "") -> None:
        """Raise one line naming `what` (the command or stage) when this run's work failed and none finished, or
        less than `min_share` of it did (`core.outcomes.require_success`); the caller reports the folder first."""
        if self.ran is not None:
            require_success(what, self.ran, min_share, then)


@dataclass
class _Left(Generic[Item, State]):
    """A chain's items still to run this run, and the state the next one needs."""

    items: deque[Item]
    state: State
    worker: int = 0  # the chain's worker, in the pool


def resume(
    chains: Sequence[Chain[Item, State]], schedule: Schedule[Item, State], done: dict[str, dict[str, Any]]
) -> list[_Left[Item, State]]:
    """The chains with items left, each past its finished items (`done`: key -> record) and on the state they left."""
    left = []
    for chain in chains:
        state, items = chain.state, deque[Item]()
        for item in chain.items:
            record = done.get(schedule.key(item))
            if record is None:
                items.append(item)
            elif schedule.advance is not None:
                state = schedule.advance(state, record)
        if items:
            left.append(_Left(items, state))
    return left


def serve_roles(roles: Roles, stack: contextlib.ExitStack, log_dir: Path, per_worker: int) -> Roles:
    """Every role on an endpoint all workers share; an in-process model is served once (roles in field order)."""
    endpoint = endpoint_server(stack, log_dir, per_worker)
    served = {f.name: endpoint(getattr(roles, f.name)) for f in dataclasses.fields(roles)}
    return dataclasses.replace(roles, **served)


def drive(
    cfg: Spread,
    out: Path,
    console: Console,
    *,
    records: str,
    label: str,
    chains: Sequence[Chain[Item, State]],
    schedule: Schedule[Item, State],
    world: World[Roles],
) -> DrivenRun:
    """Run (or resume) `chains` into `out / records`; `label` names the work on the progress bar."""
    out.mkdir(parents=True, exist_ok=True)
    sink = ResumableJsonl(out / records, key="key")
    todo = resume(chains, schedule, sink.latest())
    planned = sum(len(chain.items) for chain in chains)
    here = world.in_process(cfg)
    default_workers = 1 if here else min(len(chains), os.cpu_count() or 1, MAX_DEFAULT_WORKERS)
    n_workers = min(cfg.workers or default_workers, max(len(todo), 1))
    failures = FailedWork(out, console)
    retried = 0
    finished = 0
    left = sum(len(chain.items) for chain in todo)

    with contextlib.ExitStack() as stack, progress(console) as bar:
        task = bar.add_task(label, total=planned, completed=planned - left)
        if todo:
            if here:
                pool: ActorPool | LocalPool = LocalPool(world.worker, n_workers, world.spec(world.roles))
            else:
                per_worker = max(1, math.ceil(cfg.max_in_flight / n_workers))
                roles = serve_roles(world.roles, stack, out / "logs", per_worker)
                start_ray(cfg.ray_address, stack)
                pool = ActorPool(world.worker, n_workers, world.spec(roles))
            in_flight: InFlight[tuple[_Left[Item, State], Item]] = InFlight(
                pool,
                lambda tag: schedule.name(tag[1]),
                warn=lambda line: console.print(line, style="yellow", markup=False),
            )
            stack.callback(in_flight.close)  # before Ray shuts down
            waiting, started, sent = deque(todo), 0, 0

            def submit(chain: _Left[Item, State]) -> None:
                nonlocal sent
                item = chain.items.popleft()
                worker = chain.worker if schedule.pinned else sent % n_workers
                in_flight.submit((chain, item), worker, *schedule.args(item, chain.state))
                sent += 1

            def start_chains() -> None:
                nonlocal started
                while waiting and (schedule.at_once is None or len(in_flight) < schedule.at_once):
                    chain = waiting.popleft()
                    chain.worker = started % n_workers
                    started += 1
                    submit(chain)

            start_chains()
            while in_flight:
                (chain, item), record = in_flight.next()
                if record.get("status") == "failed":
                    failures.add(schedule.name(item), record)  # its chain's later items need its state: a rerun
                else:
                    if record["key"] not in sink.done:  # a result never lands twice
                        sink.append(record)
                        finished += 1
                    bar.advance(task)
                    if schedule.advance is not None:
                        chain.state = schedule.advance(chain.state, record)
                    if chain.items:
                        submit(chain)
                start_chains()
            retried = in_flight.retried
    first = f"{failures.now[0][0]}: {failures.now[0][1]['error']}" if failures.now else None
    ran = Outcome(label, left, finished, len(failures.now), first)
    outstanding = FailedWork.outstanding(out, sink.done)
    # The file holds records as they finished, which depends on timing; the run hands them on in the plan's order,
    # so a dataset built from a seeded run is the same run after run.
    plan = {schedule.key(item): i for i, item in enumerate(item for chain in chains for item in chain.items)}
    finished_records = sorted(sink.latest().values(), key=lambda r: plan.get(r["key"], len(plan)))
    return DrivenRun(finished_records, outstanding, planned, retried, ran)
