"""PAHF runs: each user's tasks in order with its memory carried over, users in parallel on Ray actors.

Each user is a chain for the shared driver (`envs.driver`), pinned to one actor: each finished task is appended to
`tasks.jsonl` (fsync'ed), keyed phase/user/index/pass. Each user's notes live in their own file under `memory/` (a
SQLite file, or a FAISS folder saved after every task), held open by the actor that runs that user. Every task
record also carries the user's notes after the task, and every task sent carries the notes of the user's last
recorded task, so memory is exact whatever died: the actor rebuilds the store when the file disagrees (a crash
between the memory write and the record append, a worker killed mid-task and restarted by Ray, a task whose endpoint
failed half-way).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.core.errors import BackendError, first_line
from memrl.envs.driver import Chain, DrivenRun, Schedule, World, drive
from memrl.envs.pahf.agent import ABILITIES, MemoryWriter, PahfAgent
from memrl.envs.pahf.config import PahfEvalConfig
from memrl.envs.pahf.memory import MemoryStore, build_memory
from memrl.envs.pahf.protocol import Job, LeftOut, build_task, plan_jobs
from memrl.envs.pahf.records import TASKS_FILE, TaskRecord, read_task
from memrl.envs.pahf.users import PersonaLLM
from memrl.rollout.base import ChatBackend
from memrl.rollout.builder import build_backend
from memrl.rollout.config import ModelConfig

MEMORY_DIR = "memory"


@dataclass(frozen=True)
class Roles:
    agent: ModelConfig
    user: ModelConfig | None  # the persona LLM, when --user-sim llm
    writer: ModelConfig | None = None  # the memory writer (e.g. a trained reflector); None: the agent's model


def needed_roles(cfg: PahfEvalConfig) -> Roles:
    return Roles(cfg.model, cfg.user_model_or_default() if cfg.user_sim == "llm" else None, cfg.writer_model)


def memory_path(memory_dir: Path, kind: str, user: str) -> Path:
    """One store per user: no two actors ever write the same file."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", user)
    return memory_dir / (f"{safe}.sqlite" if kind == "sqlite" else f"{safe}.faiss")


# --- workers ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    cfg: PahfEvalConfig
    roles: Roles
    memory_dir: Path


class UserRunner:
    """Builds the backends and embedder once; runs any task it is given, holding each of its users' stores open."""

    def __init__(self, spec: WorkerSpec) -> None:
        cfg = spec.cfg
        self.cfg = cfg
        self.memory_dir = spec.memory_dir
        self._backends: dict[str, ChatBackend] = {}
        sampling = cfg.sampling.agent(cfg.seed)
        backend = self._build(spec.roles.agent)
        writer = backend if spec.roles.writer is None else self._build(spec.roles.writer)
        self.agent = PahfAgent(cfg.agent, backend, MemoryWriter(writer, sampling, cfg.tau), sampling, cfg.top_k)
        user = spec.roles.user
        self.persona = None if user is None else PersonaLLM(self._build(user), cfg.sampling.user_params(cfg.seed))
        self._embedder: Any = None
        self._stores: dict[str, MemoryStore] = {}

    def _build(self, cfg: ModelConfig) -> ChatBackend:
        key = cfg.model_dump_json()
        if key not in self._backends:  # the agent and the persona user often share one endpoint
            self._backends[key] = build_backend(cfg)
        return self._backends[key]

    def _open(self, user: str, fresh: bool = False) -> MemoryStore:
        from memrl.rollout.embedding import get_embedder

        if self._embedder is None:
            self._embedder = get_embedder(self.cfg.embedder)
        path = memory_path(self.memory_dir, self.cfg.memory, user)
        if fresh:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return build_memory(self.cfg.memory, path, self._embedder)

    def store(self, user: str, expected: list[str] | None) -> MemoryStore | None:
        """The user's store; `expected`: the notes it must hold (those after the user's previous recorded task).

        A store that disagrees (a worker killed mid-task, a crash between the memory write and the record) is rebuilt.
        """
        if not ABILITIES[self.cfg.agent].memory:
            return None
        if user not in self._stores:
            self._stores[user] = self._open(user)
        store = self._stores[user]
        if expected is not None and [n.text for n in store.list(user)] != expected:
            store.close()
            store = self._stores[user] = self._open(user, fresh=True)
            for text in expected:  # one at a time, as they were first embedded
                store.add(user, text)
            store.save()
        return store

    async def run(self, job: Job) -> dict[str, Any]:
        task, user = build_task(job, self.cfg.feedback_style, self.persona, self.cfg.seed)
        store = self.store(job.user, job.notes)
        try:
            outcome = await self.agent.run(task, user, store, job.learning)
        except BackendError as exc:  # the endpoint failed after the client's own retries: a failed task
            if store is not None:  # drop what the task half-wrote; the retry starts from the recorded notes
                self.store(job.user, job.notes)
            return {"key": job.key, "phase": job.phase, "user": job.user, "status": "failed", "error": first_line(exc)}
        if store is not None:
            store.save()  # FAISS keeps its index in memory: write it after every task
        notes = [] if store is None else [n.text for n in store.list(job.user)]
        return TaskRecord.of(job, task, outcome, notes).to_dict()


# --- driver -------------------------------------------------------------------------------------------------------


def run_pahf(cfg: PahfEvalConfig, out: Path, console: Console, left_out: LeftOut | None = None) -> DrivenRun:
    """Run (or resume) the protocol into `out`; scenarios the plan leaves out are named in one line and `left_out`.

    Every task carries the notes its user held after their previous recorded task, so a restarted worker (or a
    rerun) rebuilds a store that a killed task left half-written. A task whose endpoint fails after the client's
    retries goes to `failed.jsonl` and its user stops for this run (later tasks need its memory); a run in which
    tasks failed and none finished raises the first failure as one line on `check()`.
    """
    left_out = left_out if left_out is not None else LeftOut()
    plan = plan_jobs(cfg, left_out)
    if (line := left_out.line()) is not None:
        console.print(line, style="yellow", markup=False)
    schedule: Schedule[Job, list[str]] = Schedule(
        key=lambda job: job.key,
        name=lambda job: f"task {job.key}",
        args=lambda job, notes: (replace(job, notes=notes),),
        advance=lambda _, row: list(read_task(row, out).notes),
    )  # each user on one actor, which holds the user's store open
    memory_dir = (out / MEMORY_DIR).resolve()
    world = World(UserRunner, needed_roles(cfg), lambda roles: WorkerSpec(cfg, roles, memory_dir))
    chains = [Chain(user, jobs, list[str]()) for user, jobs in plan.items()]
    run = drive(cfg, out, console, records=TASKS_FILE, label="tasks", chains=chains, schedule=schedule, world=world)
    done = {r["key"]: r for r in run.records}
    return replace(run, records=[done[j.key] for jobs in plan.values() for j in jobs if j.key in done])


def finished_tasks(run: DrivenRun, out: Path) -> list[TaskRecord]:
    """The run's finished tasks, typed: those an earlier run left in `out` are read as strictly as fresh ones."""
    return [read_task(row, out) for row in run.records]
