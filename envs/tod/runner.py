"""The MS-TOD evaluation: every held-out confirming session of the chosen individuals, in parallel on Ray actors.

Sessions are independent (memory is read-only: the units of the individual's earlier sessions travel with the
request), so stateless workers built once with their backends, retriever and judger can run any of them: each
session is a chain of one for the shared driver (`envs.driver`), at most `max_in_flight` in flight. The driver owns
the output: each finished session is appended to `sessions.jsonl` (fsync'ed), and a rerun runs only the sessions
not there yet. Ray restarts a worker whose process died and its session runs once more; a session a model endpoint
could not serve after the client's retries goes to `failed.jsonl` and runs again on a rerun.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.core.errors import BackendError, MemrlError, first_line
from memrl.core.files import read_json
from memrl.envs.driver import FAILED_FILE, Chain, DrivenRun, Schedule, World, drive
from memrl.envs.tod import pipeline
from memrl.envs.tod.config import TodEvalConfig
from memrl.envs.tod.extract import folder_schemas
from memrl.envs.tod.formats import Individual, LoadProblems, Session, Turn, load_tod_dir
from memrl.envs.tod.memory import MemoryUnit, TemplateMemoryBuilder, load_memory_banks
from memrl.envs.tod.metrics import QualityJudge, gold_memory, session_scores
from memrl.envs.tod.pipeline import (
    MemoryPlanner,
    MemorySelector,
    SessionView,
    build_intent,
    build_reasoner,
    candidates,
)
from memrl.envs.tod.proactive import SUPERVISORS, USERS, run_proactive
from memrl.envs.tod.ranking import fact_of
from memrl.envs.tod.reader import ReaderRequest, Reply, build_reader, phrases
from memrl.envs.tod.reasoning import filled_slots
from memrl.envs.tod.records import SCORES, SESSIONS_FILE, TodSessionRecord, read_session
from memrl.envs.tod.retrieval import build_retriever, resolve_alpha
from memrl.envs.tod.schema import Schemas, load_schemas
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.builder import build_backend
from memrl.rollout.config import ModelConfig, SamplingConfig

RANKED_KEPT = 10  # ranked QA pairs saved per session record (recall is computed on the full ranking)


# --- what to run --------------------------------------------------------------------------------------------------


def eval_individual_ids(split_from: Path) -> list[int]:
    """The eval individuals of a judger data folder (`J/stats.json`: individuals.eval)."""
    stats = split_from / "stats.json"
    if not stats.is_file():
        raise MemrlError(f"{stats}: not found (--split-from takes the folder `memrl data judger` wrote)")
    try:
        ids = read_json(stats)["individuals"]["eval"]
    except (KeyError, TypeError) as exc:
        raise MemrlError(f"{stats}: individuals.eval: missing or malformed ({first_line(exc)})") from None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise MemrlError(f"{stats}: individuals.eval: expected a list of persona ids")
    return ids


def select_individuals(cfg: TodEvalConfig, individuals: Sequence[Individual]) -> list[Individual]:
    chosen = list(individuals)
    if cfg.split_from is not None:
        wanted = set(eval_individual_ids(cfg.split_from))
        chosen = [i for i in chosen if i.persona_id in wanted]
        missing = sorted(wanted - {i.persona_id for i in chosen})
        if missing:
            raise MemrlError(
                f"{cfg.split_from / 'stats.json'}: individuals.eval: persona {missing[0]} is not in {cfg.data}"
            )
    return chosen[: cfg.individuals] if cfg.individuals is not None else chosen


@dataclass(frozen=True)
class Job:
    """One held-out confirming session and the memory units of the individual's earlier sessions."""

    key: str
    persona_id: int
    session: dict[str, Any]
    memory: list[dict[str, Any]]


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]
    schemas: Schemas  # the folder's (`folder_schemas`): memory, the reasoner and the reader all read this one


def plan_jobs(cfg: TodEvalConfig, problems: LoadProblems | None = None) -> Plan:
    """The sessions to run: every confirming session that can be scored. Unless `cfg.strict`, foreign slots, unscored
    sessions and unreadable files are recorded in `problems` (the whole folder's, like the load)."""
    lenient = None if cfg.strict else (problems if problems is not None else LoadProblems())
    merged = load_schemas(cfg.schema_path())
    loaded = load_tod_dir(cfg.data, merged, lenient)
    schemas = folder_schemas(loaded, merged)  # from every individual, chosen or not: one schema per folder
    individuals = select_individuals(cfg, loaded)
    banks = load_memory_banks(cfg.data, individuals, schemas, TemplateMemoryBuilder(lexicon_from=cfg.schema_path()))
    jobs = [
        Job(
            f"{ind.persona_id}/{s.session_id}",
            ind.persona_id,
            s.to_record(),
            [u.to_record() for u in banks[ind.persona_id].before(s.session_id)],
        )
        for ind in individuals
        for s in ind.sessions
        if s.scored  # `Session.unscored` names the others in `problems`
    ]
    return Plan(jobs[: cfg.sessions] if cfg.sessions is not None else jobs, schemas)


# --- models -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    """The endpoint config of every model a run needs (None: not needed)."""

    reader: ModelConfig | None
    llm: ModelConfig | None  # intent extractor, reasoner, user simulator and supervisor, where they are llm
    quality: ModelConfig | None


def needed_roles(cfg: TodEvalConfig) -> Roles:
    return Roles(
        reader=cfg.reader_model if cfg.reader == "llm" else None,
        llm=cfg.llm_or_default() if cfg.llm_roles() else None,
        quality=cfg.quality_judge,
    )


# --- a session, planned ---------------------------------------------------------------------------------------------


def seeded(cfg: SamplingConfig, seed: int) -> SamplingParams:
    return replace(cfg.params(), seed=seed)


def build_planner(cfg: TodEvalConfig, schemas: Schemas, llm: ChatBackend | None) -> MemoryPlanner:
    """The memory planner of `cfg` (intent, reasoner, retrieval and the judger fused into it); `llm` plays the llm
    intent and reasoner, where they are."""
    judger = None
    if cfg.judger is not None:
        from memrl.rollout.judger import load_judger

        judger = load_judger(cfg.judger)
    alpha, _ = resolve_alpha(cfg.alpha, cfg.judger)  # `eval tod` resolved it already; direct callers get the same
    selector = MemorySelector(build_retriever(cfg.retriever), judger, alpha, cfg.top_k, cfg.top_units, cfg.fusion)
    return MemoryPlanner(
        build_intent(cfg.intent, schemas, llm, seeded(cfg.sampling.intent, cfg.seed)),
        build_reasoner(cfg.reasoner, schemas, llm, seeded(cfg.sampling.reasoner, cfg.seed)),
        selector,
    )


@dataclass(frozen=True)
class Prepared:
    """A job ready to play: its session, goal (the confirmed values), context (the turns before the confirmation),
    the individual's earlier memory, the plan, and the reader's request for the confirmation (no loop turns yet)."""

    session: Session
    goal: dict[str, str]
    context: list[Turn]
    memory: list[MemoryUnit]
    plan: pipeline.Plan
    request: ReaderRequest


async def prepare(planner: MemoryPlanner, schemas: Schemas, job: Job) -> Prepared:
    session = Session.model_validate(job.session)
    assert session.confirmation_state is not None
    goal = dict(session.confirmation_state.slot_values)
    context = session.context()
    memory = [MemoryUnit.from_record(u) for u in job.memory]
    plan = await planner.plan(SessionView(job.persona_id, session, context, goal, memory))
    names = phrases(schemas, session.service, session.intent)
    request = ReaderRequest(context, [], plan.selection, plan.missing, filled_slots(context, goal), names)
    return Prepared(session, goal, context, memory, plan, request)


# --- workers ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    cfg: TodEvalConfig
    roles: Roles
    schemas: Schemas  # travels with the spec: workers on other machines need not see the data folder


class SessionRunner:
    """Builds the backends, retriever and judger once and runs any session it is given (in-process or on Ray)."""

    def __init__(self, spec: WorkerSpec) -> None:
        cfg, roles = spec.cfg, spec.roles
        self.cfg = cfg
        self.schemas = spec.schemas
        self._backends: dict[str, ChatBackend] = {}
        sampling = cfg.sampling
        llm = self._build(roles.llm)
        self.planner = build_planner(cfg, self.schemas, llm)
        self.reader = build_reader(cfg.reader, self._build(roles.reader), self._params(sampling.reader))
        self.user = USERS[cfg.user](llm, self._params(sampling.user))
        self.supervisor = SUPERVISORS[cfg.supervisor](llm, self._params(sampling.supervisor))
        quality = self._build(roles.quality)
        self.quality = None if quality is None else QualityJudge(quality, self._params(sampling.quality))

    def _params(self, cfg: SamplingConfig) -> SamplingParams:
        return seeded(cfg, self.cfg.seed)

    def _build(self, cfg: ModelConfig | None) -> ChatBackend | None:
        if cfg is None:
            return None
        key = cfg.model_dump_json()
        if key not in self._backends:  # the reader and the llm roles often share one endpoint
            self._backends[key] = build_backend(cfg)
        return self._backends[key]

    async def run(self, job: Job) -> dict[str, Any]:
        try:
            return await self._run(job)
        except BackendError as exc:  # the endpoint failed after the client's own retries: a failed session
            failed = {"key": job.key, "persona_id": job.persona_id, "session_id": job.session.get("session_id")}
            return failed | {"status": "failed", "error": first_line(exc)}

    async def _run(self, job: Job) -> dict[str, Any]:
        ready = await prepare(self.planner, self.schemas, job)
        session, goal, context, memory, plan = ready.session, ready.goal, ready.context, ready.memory, ready.plan

        async def respond(followup: Sequence[Turn]) -> Reply:
            return await self.reader.respond(replace(ready.request, followup=followup))

        outcome = await run_proactive(respond, context, goal, self.user, self.supervisor, self.cfg.max_turns)
        gold = gold_memory(job.persona_id, session, context, goal, memory)
        # Every stored pair and its (slot, value): recall counts distinct gold facts, the ceiling any ranking's best.
        facts = {c.key: fact_of(c.slot, c.answer) for c in candidates(job.persona_id, session.session_id, memory)}
        scores = session_scores(
            outcome.confirmation.text,
            goal,
            outcome.dte,
            outcome.success,
            plan.selection.keys,
            gold,
            facts,
            list(facts),
            plan.selection.rankings,
        )
        rated = self.quality is not None
        quality = await self.quality.rate(context, goal, outcome.confirmation.text) if self.quality else None
        failures = plan.failures | outcome.failures | ({"quality": int(quality is None)} if rated else {})
        scored = {name: scores.pop(name) for name in SCORES}
        return TodSessionRecord(
            key=job.key,
            persona_id=job.persona_id,
            session_id=session.session_id,
            reference_dialogue_id=session.reference_dialogue_id,
            service=session.service,
            intent=session.intent,
            goal=goal,
            context_turns=len(context),
            memory_units=len(memory),
            intent_query=plan.intent_query,
            missing_slots=tuple(plan.missing),
            reasoning=plan.reasoning,
            ranked=tuple(s.to_record() for s in plan.selection.ranked[: max(RANKED_KEPT, self.cfg.top_k)]),
            a_core=tuple(plan.selection.a_core),
            gold=tuple(sorted(gold)),
            confirmation=outcome.confirmation.text,
            turns=tuple(t.model_dump(exclude_defaults=True) for t in outcome.turns),
            outstanding=tuple(tuple(left) for left in outcome.outstanding),
            **scored,
            recalls=scores,
            failures=failures,
            rated=rated,
            quality=quality,
        ).to_dict()


# --- driver -------------------------------------------------------------------------------------------------------


def run_tod(cfg: TodEvalConfig, out: Path, console: Console, problems: LoadProblems | None = None) -> DrivenRun:
    """Run (or resume) the evaluation into `out`; its records are those of the chosen sessions (`finished_sessions`
    types them). What loading the data dropped or skipped goes to `problems`."""
    plan = plan_jobs(cfg, problems)
    jobs, schemas = plan.jobs, plan.schemas
    if not jobs:
        raise MemrlError(f"{cfg.data}: the chosen individuals have no confirming session to evaluate")
    schedule: Schedule[Job, None] = Schedule(
        key=lambda job: job.key,
        name=lambda job: f"session {job.key}",
        args=lambda job, _: (job,),
        pinned=False,
        at_once=cfg.max_in_flight,
    )
    world = World(SessionRunner, needed_roles(cfg), lambda roles: WorkerSpec(cfg, roles, schemas))
    chains = [Chain(job.key, [job], None) for job in jobs]  # independent sessions
    run = drive(
        cfg, out, console, records=SESSIONS_FILE, label="sessions", chains=chains, schedule=schedule, world=world
    )
    wanted = {j.key for j in jobs}
    if failed := [r for r in run.failed if r["key"] in wanted]:
        console.print(
            f"{len(failed)} session(s) failed ({out / FAILED_FILE}); metrics cover finished sessions only: rerun the "
            "same command to run them",
            style="yellow",
            markup=False,
        )
    return replace(run, records=[r for r in run.records if r["key"] in wanted])


def finished_sessions(run: DrivenRun, out: Path) -> list[TodSessionRecord]:
    """The run's finished sessions, typed: those an earlier run left in `out` are read as strictly as fresh ones."""
    return [read_session(row, out) for row in run.records]
