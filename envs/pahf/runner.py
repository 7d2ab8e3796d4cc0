"""PAHF runs: each user's tasks in order with its memory carried over, users in parallel on Ray actors.

The driver owns the output: each finished task is appended to `tasks.jsonl` (fsync'ed), keyed phase/user/index/pass.
Each user's notes live in their own file under `memory/` (a SQLite file, or a FAISS folder saved after every
task), held open by the actor that runs that user. Every task record also carries the user's notes after the task,
so resumption is exact: the first task a rerun sends for a user carries the notes of that user's last recorded
task, and the actor rebuilds the store from them when the file disagrees (a crash between the memory write and the
record append).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.context import progress
from memrl.envs.actors import endpoint_server, next_finished, start_ray
from memrl.envs.pahf.agent import ABILITIES, MemoryWriter, PahfAgent
from memrl.envs.pahf.config import PahfEvalConfig
from memrl.envs.pahf.memory import MemoryStore, build_memory
from memrl.envs.pahf.protocol import Job, build_task, plan_jobs
from memrl.envs.pahf.users import PersonaLLM
from memrl.jsonl import ResumableJsonl
from memrl.rollout.base import ChatBackend
from memrl.rollout.builder import build_backend
from memrl.rollout.config import ModelConfig

TASKS_FILE = "tasks.jsonl"
MEMORY_DIR = "memory"


@dataclass(frozen=True)
class Roles:
    agent: ModelConfig
    user: ModelConfig | None  # the persona LLM, when --user-sim llm


def needed_roles(cfg: PahfEvalConfig) -> Roles:
    return Roles(cfg.model, cfg.user_model_or_default() if cfg.user_sim == "llm" else None)


def serve_locally(roles: Roles, stack: contextlib.ExitStack, log_dir: Path, per_worker: int) -> Roles:
    """Every role on an endpoint all workers share; an in-process model is served once."""
    endpoint = endpoint_server(stack, log_dir, per_worker)
    agent = endpoint(roles.agent)
    assert agent is not None
    return Roles(agent, endpoint(roles.user))


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
        self.agent = PahfAgent(cfg.agent, backend, MemoryWriter(backend, sampling, cfg.tau), sampling, cfg.top_k)
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
        from memrl.rewards.embedding import get_embedder

        if self._embedder is None:
            self._embedder = get_embedder(self.cfg.embedder)
        path = memory_path(self.memory_dir, self.cfg.memory, user)
        if fresh:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return build_memory(self.cfg.memory, path, self._embedder)

    def store(self, user: str, expected: list[str] | None) -> MemoryStore | None:
        """The user's store; `expected` (first task of a run): the notes it must hold, rebuilt when it does not."""
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
        outcome = await self.agent.run(task, user, store, job.learning)
        if store is not None:
            store.save()  # FAISS keeps its index in memory: write it after every task
        return {
            "key": job.key,
            "phase": job.phase,
            "user": job.user,
            "index": job.index,
            "pass": job.pass_,
            "instruction": task.instruction,
            "options": task.options,
            "gold": task.gold,
            **outcome.to_record(),
            "notes": [] if store is None else [n.text for n in store.list(job.user)],
        }


def _ray_worker_class() -> Any:
    import ray

    return ray.remote(UserRunner)


# --- driver -------------------------------------------------------------------------------------------------------


def run_pahf(cfg: PahfEvalConfig, out: Path, console: Console) -> list[dict[str, Any]]:
    """Run (or resume) the protocol into `out`; return the records of the planned tasks, in plan order."""

    plan = plan_jobs(cfg)
    out.mkdir(parents=True, exist_ok=True)
    sink = ResumableJsonl(out / TASKS_FILE, key="key")
    done = {r["key"]: r for r in sink.records()}
    todo: dict[str, list[Job]] = {}
    for user, jobs in plan.items():
        left = [j for j in jobs if j.key not in done]
        if left:
            before = [done[j.key]["notes"] for j in jobs if j.key in done]
            todo[user] = [replace(left[0], notes=before[-1] if before else []), *left[1:]]
    total = sum(len(jobs) for jobs in plan.values())
    n_workers = min(cfg.workers or min(len(plan), os.cpu_count() or 1, 8), max(len(todo), 1))
    per_worker = max(1, math.ceil(cfg.max_in_flight / n_workers))

    with contextlib.ExitStack() as stack, progress(console) as bar:
        bar_task = bar.add_task("tasks", total=total, completed=total - sum(len(j) for j in todo.values()))
        if todo:
            roles = needed_roles(cfg)
            if n_workers > 1 or cfg.ray_address is not None:
                roles = serve_locally(roles, stack, out / "logs", per_worker)
            # else the one local actor loads an in-process model itself: a server would only add its start-up
            start_ray(cfg.ray_address, stack)
            worker_cls = _ray_worker_class().options(num_cpus=0, scheduling_strategy="SPREAD")
            spec = WorkerSpec(cfg, roles, (out / MEMORY_DIR).resolve())
            workers = [worker_cls.remote(spec) for _ in range(n_workers)]
            slots = {user: slot % n_workers for slot, user in enumerate(todo)}  # a user stays on one actor
            in_flight: dict[Any, Job] = {}

            def submit(user: str) -> None:
                if todo[user]:
                    job = todo[user].pop(0)
                    in_flight[workers[slots[user]].run.remote(job)] = job

            for user in todo:
                submit(user)
            while in_flight:
                job, record = next_finished(in_flight, lambda j: f"task {j.key}")
                sink.append(record)
                done[record["key"]] = record
                bar.advance(bar_task)
                submit(job.user)
    return [done[j.key] for jobs in plan.values() for j in jobs if j.key in done]
