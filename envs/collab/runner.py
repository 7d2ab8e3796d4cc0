"""Multi-session runs: each user's sessions in order with memory carried over, users in parallel on Ray actors.

Each user is a chain for the shared driver (`envs.driver`): it appends each finished session to `sessions.jsonl`
(fsync'ed), so a crash loses nothing finished, and a rerun resumes each user after its last finished session with
the memory saved there. Workers are stateless across calls (the memory travels with the request).

Faults: Ray restarts a worker whose process died and the session it was running is run once more; a session whose
model endpoint still fails after the client's retries is logged in `failed.jsonl` (not in `sessions.jsonl`), its
user stops there for this run, and a rerun runs it again.
"""

from __future__ import annotations

import gc
import importlib
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.core.errors import BackendError, first_line
from memrl.envs.collab.agents import AgentKind, AgentMemory, CollabAgent, Reflector
from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import AnswerKind, Problem, get_task, problems_for
from memrl.envs.collab.profiles import UserProfile, profiles_for
from memrl.envs.collab.records import SessionRecord
from memrl.envs.collab.session import SessionSpec, failed_record, run_session, session_key
from memrl.envs.collab.user_sim import LLMUserSimulator, RuleUserSimulator, UserSimulator
from memrl.envs.driver import Chain, DrivenRun, Schedule, World, drive
from memrl.rollout.base import ChatBackend
from memrl.rollout.builder import build_backend
from memrl.rollout.config import ModelConfig

SESSIONS_FILE = "sessions.jsonl"


# --- what to run --------------------------------------------------------------------------------------------------


def select_profiles(cfg: CollabEvalConfig) -> list[UserProfile]:
    return profiles_for(cfg.profiles, cfg.split, users=cfg.users, seed=cfg.seed, preferences=cfg.preferences)


def select_problems(cfg: CollabEvalConfig) -> list[Problem]:
    return problems_for(
        cfg.task, cfg.problems, cfg.split, eval_problems=cfg.eval_problems, seed=cfg.seed, resplit=cfg.resplit
    )


def assign_problems(users: list[UserProfile], problems: list[Problem], sessions: int, seed: int) -> dict[str, list]:
    """Each user gets `sessions` problems in a fixed random order (distinct while the set is large enough)."""
    plan = {}
    for user in users:
        rng = random.Random(f"{seed}|{user.id}")
        picked = rng.sample(problems, sessions) if sessions <= len(problems) else rng.choices(problems, k=sessions)
        plan[user.id] = picked
    return plan


# --- models -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    """The endpoint config of every model role a run needs (None: not needed)."""

    agent: ModelConfig
    reflector: ModelConfig | None
    user: ModelConfig | None
    judge: ModelConfig | None


def needed_roles(cfg: CollabEvalConfig) -> Roles:
    free_form = get_task(cfg.task).kind is AnswerKind.FREE
    return Roles(
        agent=cfg.model,
        reflector=cfg.reflector_or_default() if cfg.agent is AgentKind.MEMORY else None,
        user=cfg.user_model_or_default() if cfg.simulator == "llm" else None,
        judge=cfg.judge_or_default() if free_form else None,
    )


# --- workers ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    cfg: CollabEvalConfig
    roles: Roles


class SessionRunner:
    """Builds the backends once and runs any session it is given (in-process, or inside a Ray actor)."""

    def __init__(self, spec: WorkerSpec) -> None:
        cfg, roles = spec.cfg, spec.roles
        # math_verify loads sympy (about a second): here, not in the first session, which would stall all the others
        importlib.import_module("math_verify")
        sampling = cfg.sampling
        self.max_turns = cfg.max_turns
        self.original = cfg.original_harness
        self._backends: list[ChatBackend] = []
        agent_backend = self._build(roles.agent)
        reflector = None
        if roles.reflector is not None:
            reflector = Reflector(self._build(roles.reflector), sampling.reflector.params())
        self.agent = CollabAgent(
            cfg.agent, agent_backend, sampling.agent.params(), reflector, sampling.retrieval.params(), cfg.reply
        )
        judge = self._build(roles.judge) if roles.judge is not None else None
        self.grader = Grader(judge, sampling.judge.params())
        self.simulator: UserSimulator = (
            LLMUserSimulator(self._build(roles.user), sampling.user.params(), cfg.original_harness)
            if roles.user is not None
            else RuleUserSimulator(self.grader, seed=cfg.seed)
        )
        # What the worker holds from here on (modules, models, clients) is never garbage: keep the collector from
        # walking it again and again while sessions run (a full pass took up to 0.1 s, stalling every session).
        gc.collect()
        gc.freeze()

    def _build(self, cfg: ModelConfig) -> Any:
        backend = build_backend(cfg)
        self._backends.append(backend)
        return backend

    async def run(self, profile: dict, problem: dict, index: int, memory: dict) -> dict[str, Any]:
        spec = SessionSpec(UserProfile.from_record(profile), Problem.from_record(problem), index)
        try:
            record, _ = await run_session(
                spec,
                self.agent,
                self.simulator,
                self.grader,
                AgentMemory.from_record(memory),
                self.max_turns,
                self.original,
            )
        except BackendError as exc:  # the endpoint failed after the client's own retries: a failed session
            return failed_record(spec, self.agent.kind.value, first_line(exc))
        return replace(record, node=_ray_node()).to_dict()


def _ray_node() -> str | None:
    """The id of the Ray node this session ran on (None outside Ray): shows how a run spread over a cluster."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


# --- driver -------------------------------------------------------------------------------------------------------


def run_collab(cfg: CollabEvalConfig, out: Path, console: Console) -> list[SessionRecord]:
    """Run (or resume) the evaluation into `out`; return every finished session record, or fail in one line when
    sessions failed and none finished (`DrivenRun.check`)."""
    run = collab_run(cfg, out, console)
    run.check(f"collab run {out}")
    return finished_sessions(run, out)


def finished_sessions(run: DrivenRun, out: Path) -> list[SessionRecord]:
    """The run's finished sessions, typed: those an earlier run left in `out` are read as strictly as fresh ones."""
    return [_session(row, out) for row in run.records]


def _session(row: dict[str, Any], out: Path) -> SessionRecord:
    return SessionRecord.from_dict(row, f"{out / SESSIONS_FILE}: session {row.get('key')!r}")


def collab_run(cfg: CollabEvalConfig, out: Path, console: Console) -> DrivenRun:
    """Run (or resume) the evaluation into `out`.

    A session whose endpoint fails after retries is logged in `failed.jsonl` and its user stops for this run (its
    next session needs the memory this one would have written); the other users go on. A run in which sessions
    failed and none finished raises the first failure as one line on `check()`.
    """
    users = select_profiles(cfg)
    plan = assign_problems(users, select_problems(cfg), cfg.sessions, cfg.seed)
    chains = [Chain(u.id, [SessionSpec(u, p, i) for i, p in enumerate(plan[u.id])], AgentMemory()) for u in users]
    schedule: Schedule[SessionSpec, AgentMemory] = Schedule(
        key=lambda s: session_key(s.profile.id, s.index),
        name=lambda s: f"user {s.profile.id} session {s.index}",
        args=lambda s, memory: (s.profile.to_record(), s.problem.to_record(), s.index, memory.to_record()),
        advance=lambda _, row: AgentMemory.from_record(_session(row, out).memory),
    )
    world = World(SessionRunner, needed_roles(cfg), lambda roles: WorkerSpec(cfg, roles))
    return drive(
        cfg, out, console, records=SESSIONS_FILE, label="sessions", chains=chains, schedule=schedule, world=world
    )
