"""The 4-phase PAHF protocol: which tasks each user gets, how a task becomes an agent `Task`, and the metrics.

Phase 1 learns on the original preferences (with feedback, `passes` times over its scenarios), phase 2 tests
(no questions, no feedback), phase 3 learns after the drift (evolved preferences), phase 4 tests again. Memory
persists across phases, per user. Iteration t of a phase is the t-th task of each user in it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memrl.core.errors import MemrlError
from memrl.envs.pahf.agent import FAILURE_KINDS, Task
from memrl.envs.pahf.config import PahfEvalConfig
from memrl.envs.pahf.embodied import EmbodiedTask, embodied_feedback, embodied_task, no_gold_reason
from memrl.envs.pahf.formats import (
    EmbodiedScenario,
    PersonaTable,
    ShoppingScenario,
    load_embodied_dir,
    load_shopping_dir,
)
from memrl.envs.pahf.shopping import Style, gold, rule_feedback
from memrl.envs.pahf.users import PersonaLLM, embodied_wanted, rule_embodied_answer, rule_shopping_answer

if TYPE_CHECKING:
    from memrl.envs.pahf.records import TaskRecord  # it imports `Job` from here

PHASES = (1, 2, 3, 4)
LEARNING = (1, 3)  # phases with questions and feedback; 2 and 4 test on memory alone
BUY_NOTHING = "buy nothing"


@dataclass(frozen=True)
class Job:
    """One task of one user: everything a worker needs, as plain records (it travels to Ray actors)."""

    key: str  # phase/user/index/pass
    phase: int
    user: str
    index: int  # the scenario's position among this user's scenarios of the phase
    pass_: int
    scenario: dict[str, Any]
    persona: str  # the persona prompt in force (original for phases 1-2, evolved for 3-4)
    table: dict[str, Any] | None = None  # shopping: the preference table in force
    original: dict[str, Any] | None = None  # shopping, phase 3: the table before the drift (drift feedback)
    notes: list[str] | None = field(default=None, compare=False)  # the user's notes after their last recorded task

    @property
    def learning(self) -> bool:
        return self.phase in LEARNING


def task_key(phase: int, user: str, index: int, pass_: int) -> str:
    return f"{phase}/{user}/{index}/{pass_}"


@dataclass
class LeftOut:
    """Scenarios a plan leaves out because their data allows no gold option: they cannot be scored."""

    scenarios: list[dict[str, Any]] = field(default_factory=list)  # phase, file, index, user, reason

    def summary(self) -> dict[str, Any]:
        """What metrics.json keeps under `problems`: the count and every scenario by file and index."""
        return {"skipped_no_gold": {"count": len(self.scenarios), "scenarios": list(self.scenarios)}}

    def line(self, shown: int = 3) -> str | None:
        """One line naming the first few, or None when nothing was left out."""
        if not self.scenarios:
            return None
        named = "; ".join(
            f"phase {s['phase']} {s['user']} {s['file']}[{s['index']}] ({s['reason']})" for s in self.scenarios[:shown]
        )
        more = f"; and {len(self.scenarios) - shown} more" if len(self.scenarios) > shown else ""
        return (
            f"{len(self.scenarios)} scenario(s) without a derivable gold left out: {named}{more} "
            "(all listed in metrics.json under problems.skipped_no_gold)"
        )


# --- planning -----------------------------------------------------------------------------------------------------


def _by_user(rows: Iterable[Any], user_of: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        out[getattr(row, user_of)].append(row)
    return out


def _sequence(cfg: PahfEvalConfig, user: str, phases: dict[int, dict[str, list[Any]]], make: Any) -> list[Job]:
    jobs = []
    for phase in PHASES:
        rows = phases[phase].get(user, [])[: cfg.scenarios]
        for pass_ in range(cfg.passes if phase in LEARNING else 1):
            jobs += [make(phase, index, pass_, row) for index, row in enumerate(rows)]
    return jobs


def _pick_users(cfg: PahfEvalConfig, order: Sequence[str], where: Path) -> list[str]:
    users = list(dict.fromkeys(order))[: cfg.users]
    if not users:
        raise MemrlError(f"{where}: phase 1 has no scenarios")
    return users


def plan_shopping(cfg: PahfEvalConfig) -> dict[str, list[Job]]:
    where = cfg.domain_dir()
    data = load_shopping_dir(where)
    users = _pick_users(cfg, [s.user for s in data.phases[1]], where / "phase1.json")
    phases = {p: _by_user(data.phases[p], "user") for p in PHASES}
    personas = {1: data.personas_original, 3: data.personas_evolved}
    plan = {}
    for user in users:
        for name, tables in (("persona_info.json", data.original), ("updated_persona_info.json", data.evolved)):
            if user not in tables:
                raise MemrlError(f"{where / name}: no preference table for user {user!r}")

        def make(phase: int, index: int, pass_: int, row: ShoppingScenario, user: str = user) -> Job:
            drift = phase >= 3
            return Job(
                task_key(phase, user, index, pass_),
                phase,
                user,
                index,
                pass_,
                row.to_record(),
                personas[3 if drift else 1].get(user, ""),
                data.table(phase, user).to_record(),
                data.original[user].to_record() if phase == 3 else None,
            )

        plan[user] = _sequence(cfg, user, phases, make)
    return plan


def _scorable(
    cfg: PahfEvalConfig,
    phase: int,
    file: str,
    rows: Sequence[EmbodiedScenario],
    users: Sequence[str],
    left_out: LeftOut,
) -> dict[str, list[EmbodiedScenario]]:
    """Each user's first `cfg.scenarios` scenarios that have a gold option; those without one that the plan would
    otherwise have reached are recorded in `left_out`."""
    kept: dict[str, list[EmbodiedScenario]] = {user: [] for user in users}
    for row in rows:
        mine = kept.get(row.user)
        if mine is None or (cfg.scenarios is not None and len(mine) >= cfg.scenarios):
            continue
        if embodied_task(row, cfg.seed).gold is not None:
            mine.append(row)
        else:
            reason = no_gold_reason(row)
            left_out.scenarios.append(
                {"phase": phase, "file": file, "index": row.index, "user": row.user, "reason": reason}
            )
    return kept


def plan_embodied(cfg: PahfEvalConfig, left_out: LeftOut | None = None) -> dict[str, list[Job]]:
    """Set A trains (phases 1 and 3), set B tests (2 and 4); original personas before the drift, evolved after.

    A scenario whose data allows no gold option cannot be scored: it is left out of the plan and named in `left_out`.
    """
    where = cfg.domain_dir()
    a, b = load_embodied_dir(where, "A"), load_embodied_dir(where, "B")
    users = _pick_users(cfg, [s.user for s in a.original], where / "scenarios" / "original_scenarios_A.json")
    sets = {
        1: ("original_scenarios_A.json", a.original),
        2: ("original_scenarios_B.json", b.original),
        3: ("evolved_scenarios_A.json", a.evolved),
        4: ("evolved_scenarios_B.json", b.evolved),
    }
    left_out = left_out if left_out is not None else LeftOut()
    phases = {p: _scorable(cfg, p, file, rows, users, left_out) for p, (file, rows) in sets.items()}
    plan = {}
    for user in users:

        def make(phase: int, index: int, pass_: int, row: EmbodiedScenario, user: str = user) -> Job:
            personas = a.personas_evolved if phase >= 3 else a.personas_original
            return Job(
                task_key(phase, user, index, pass_), phase, user, index, pass_, row.model_dump(), personas.get(user, "")
            )

        plan[user] = _sequence(cfg, user, phases, make)
    return plan


def plan_jobs(cfg: PahfEvalConfig, left_out: LeftOut | None = None) -> dict[str, list[Job]]:
    """user -> that user's tasks, in the order they run (phase, pass, scenario); unscorable scenarios go to
    `left_out` (shopping has none: its gold always exists)."""
    return plan_shopping(cfg) if cfg.domain == "shopping" else plan_embodied(cfg, left_out)


# --- tasks and their users ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShoppingUser:
    """Shopping: the rule user judges every purchase; questions go to the persona LLM or the table rule."""

    scenario: ShoppingScenario
    table: PersonaTable
    original: PersonaTable | None
    persona: str
    style: Style
    llm: PersonaLLM | None

    async def answer(self, question: str) -> str:
        if self.llm is not None:
            return await self.llm.answer(self.persona, self.scenario.task, question)
        return rule_shopping_answer(self.table, self.scenario, question)

    async def feedback(self, choice: str) -> str | None:
        drifted = self.original is not None
        verdict = rule_feedback(self.table, self.scenario, choice, self.style, drifted, self.original)
        return None if verdict.correct else verdict.message


@dataclass(frozen=True)
class EmbodiedUser:
    """Embodied: the persona LLM answers and corrects, or deterministic rules from the gold option."""

    task: EmbodiedTask
    persona: str
    style: Style
    llm: PersonaLLM | None

    async def answer(self, question: str) -> str:
        if self.llm is not None:
            return await self.llm.answer(self.persona, self.task.scenario.task, question)
        return rule_embodied_answer(self.task.scenario)

    async def feedback(self, choice: str) -> str | None:
        if self.llm is not None:
            done, wanted = self.task.option(choice).text, embodied_wanted(self.task.scenario)
            return await self.llm.correct(self.persona, self.task.scenario.task, done, wanted)
        verdict = embodied_feedback(self.task, choice, self.style)
        return None if verdict.correct else verdict.message


def shopping_options(scenario: ShoppingScenario) -> dict[str, str]:
    options = {label: f"{scenario.product} with {', '.join(features)}" for label, features in scenario.options.items()}
    return options | {"D": BUY_NOTHING}


def build_task(
    job: Job, style: Style, llm: PersonaLLM | None, seed: int = 0
) -> tuple[Task, ShoppingUser | EmbodiedUser]:
    """The agent's view of a job and the simulated user that goes with it."""
    if job.table is not None:
        scenario = ShoppingScenario.from_record(job.scenario)
        table = PersonaTable.from_record(job.user, job.table)
        original = PersonaTable.from_record(job.user, job.original) if job.original is not None else None
        task = Task("shopping", job.user, scenario.task, shopping_options(scenario), gold(table, scenario))
        return task, ShoppingUser(scenario, table, original, job.persona, style, llm)
    etask = embodied_task(EmbodiedScenario.model_validate(job.scenario), seed)
    if etask.gold is None:
        raise MemrlError(f"task {job.key}: the embodied scenario has no gold option")
    options: dict[str, str] = {o.label: o.text for o in etask.options}
    task = Task("embodied", job.user, etask.scenario.task, options, etask.gold, scene=etask.scenario.scene)
    return task, EmbodiedUser(etask, job.persona, style, llm)


# --- metrics ------------------------------------------------------------------------------------------------------


def acpe(errors_by_iteration: Sequence[Sequence[bool]]) -> list[float]:
    """ACPE_t = mean of PE_1..PE_t, where PE_s is the error rate over users at iteration s."""
    out, total = [], 0.0
    for t, errors in enumerate(errors_by_iteration, start=1):
        total += sum(errors) / len(errors)
        out.append(total / t)
    return out


def _curve(by_iteration: Sequence[Sequence[bool]]) -> list[float]:
    return [sum(v) / len(v) for v in by_iteration]


def phase_metrics(records: Sequence[TaskRecord]) -> dict[str, Any]:
    """Success rate, feedback frequency, and the per-iteration curves of one phase's task records."""
    by_iteration: dict[tuple[int, int], list[TaskRecord]] = defaultdict(list)
    for r in records:
        by_iteration[(r.pass_, r.index)].append(r)
    steps = [by_iteration[k] for k in sorted(by_iteration)]
    n = len(records)
    return {
        "tasks": n,
        "users": len({r.user for r in records}),
        "success_rate": sum(r.correct for r in records) / n if n else 0.0,
        "feedback_frequency": sum(r.used_feedback for r in records) / n if n else 0.0,
        "acpe": acpe([[not r.correct for r in step] for step in steps]),
        "success_curve": _curve([[r.correct for r in step] for step in steps]),
        "feedback_curve": _curve([[r.used_feedback for r in step] for step in steps]),
    }


def compute_metrics(records: Sequence[TaskRecord]) -> dict[str, Any]:
    phases = {p: [r for r in records if r.phase == p] for p in PHASES}
    failures: Counter[str] = Counter({k: 0 for k in FAILURE_KINDS})
    for r in records:
        failures.update(r.failures)
    return {
        "phases": {str(p): phase_metrics(rs) for p, rs in phases.items() if rs},
        "failures": dict(failures),
    }


def plot_curves(metrics: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per learning phase: success rate, feedback frequency and ACPE against the iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    panels = (("success_curve", "success rate"), ("feedback_curve", "feedback frequency"), ("acpe", "ACPE"))
    for phase in LEARNING:
        m = metrics["phases"].get(str(phase))
        if not m:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
        for ax, (key, title) in zip(axes, panels, strict=True):
            ys = m[key]
            ax.plot(range(1, len(ys) + 1), ys, marker="o")
            ax.set_title(f"phase {phase}: {title}")
            ax.set_xlabel("iteration")
            ax.set_ylim(-0.02, 1.02)
        fig.tight_layout()
        path = out / f"curves_phase{phase}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
