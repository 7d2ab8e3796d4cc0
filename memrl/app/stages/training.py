"""`sft` and `grpo`: one schema each (memrl.train.config), handed to the trainer backend the stage selects
(memrl.train.registry: its package declares its runner per kind, data files, launch, resume and Ray-job hook).

Each kind's table is derived from the registry; this module adds what only the app knows: the `StageRun` built from
the run context, wandb's environment, a finished or half-done stage, and the one way a stage leaves `memrl run`'s
process to train as several processes or on one pinned GPU (`spawn_stage`: TRL under accelerate, the judger under
torchrun). Each process runs `memrl.app.stage_main` (STAGE_ENTRY) on the run's resolved recipe: the same stage kind,
as one rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from memrl.app.context import RESOLVED_NAME, RunContext
from memrl.app.stages.base import Job, StageKind
from memrl.core.errors import MemrlError
from memrl.train import distributed, registry
from memrl.train.config import GRPOStage, PolicyOptimStage, SFTStage
from memrl.train.hf_trainer import TrainContext, is_finished, resume_point
from memrl.train.online.config import OnlineGRPOStage
from memrl.train.processes import format_command, run_logged
from memrl.train.registry import InProcessRunner, StageRunner, TrainedKind, TrainerBackend
from memrl.train.stage_run import StageRun
from memrl.train.verl import backend as verl

S = TypeVar("S", SFTStage, GRPOStage, OnlineGRPOStage)


def stage_run(ctx: RunContext, name: str) -> StageRun:
    """What a trainer backend knows about the run: the one place it is read from the run context."""
    logging = ctx.logging
    return StageRun(
        out_dir=ctx.stage_dir(name),
        stage=name,
        recipe=ctx.name,
        project=logging.project,
        wandb=logging.backend == "wandb" and logging.mode != "disabled",
        seed=ctx.seed,
        planned=frozenset(str(ctx.stage_dir(n)) for n in ctx.stages),
        console=ctx.console,
    )


def wandb_defaults(ctx: RunContext) -> None:
    """wandb's project, folder and entity from recipe.logging, unless the environment names them (TRL and
    LLaMA-Factory read them; verl is told by its overrides)."""
    logging = ctx.logging
    if logging.backend == "wandb":
        os.environ.setdefault("WANDB_PROJECT", logging.project)
        os.environ.setdefault("WANDB_DIR", str(ctx.run_dir))
        if logging.entity:
            os.environ.setdefault("WANDB_ENTITY", logging.entity)


def train_context(ctx: RunContext, name: str) -> TrainContext:
    """Where an in-process trainer writes and how it logs (wandb offline by default, named after the recipe and
    stage)."""
    wandb_defaults(ctx)
    return stage_run(ctx, name).train_context()


# ---- leaving this process: a stage spawned as several processes -------------------------------------------------

STAGE_ENTRY = "memrl.app.stage_main"
TRL_LOG = "trl.log"  # a spawned TRL stage's output, in its stage folder


def resolved_recipe(ctx: RunContext) -> Path:
    """What the launched processes read: the recipe `memrl run` wrote into the run folder."""
    return ctx.run_dir / RESOLVED_NAME


def shown(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The command as a shell takes it, with the variables the launch adds in front."""
    prefix = " ".join(f"{name}={value}" for name, value in (env or {}).items())
    return f"{prefix} {format_command(argv)}" if prefix else format_command(argv)


def spawn_stage(
    argv: Sequence[str], ctx: RunContext, name: str, *, launcher: str, log: str, env: Mapping[str, str] | None = None
) -> Path:
    """Run the launch (its output to the console and `log` in the stage folder); the stage's `final/` must exist
    after it. `${NAME}` references (multi-node rendezvous) are filled from this environment."""
    out = ctx.stage_dir(name)
    log_path = out / log
    full_env = dict(os.environ) | dict(env or {})
    name_shown = f"stage {name} ({launcher})"
    run_logged(distributed.resolve_refs(argv), log_path, name=name_shown, shown=shown(argv, env), env=full_env)
    if not is_finished(out):
        raise MemrlError(f"stage {name}: {launcher} finished but wrote no {out / 'final'}; see {log_path}")
    return out / "final"


def trl_stage_spawn(stage: Any, ctx: RunContext, name: str) -> distributed.Spawn | None:
    """How a TRL stage leaves this process (see `memrl.train.distributed.trl_spawn`), on the GPUs its placement
    plan leaves the trainer; None: it trains here."""
    from memrl.train.placement import stage_plan

    trainer_gpus = stage_plan(stage, None).trainer_gpus
    return distributed.trl_spawn(
        STAGE_ENTRY,
        resolved_recipe(ctx),
        name,
        stage.cluster,
        distributed.visible_gpus(),
        inside=distributed.is_rank(),
        trainer_gpus=trainer_gpus,
    )


def run_trl(stage: Any, ctx: RunContext, name: str, train: Callable[[], Path]) -> Path:
    """`train()` here (CPU, one GPU, or one rank of a spawned stage), else the stage spawned on this node's GPUs."""
    if (spawn := trl_stage_spawn(stage, ctx, name)) is None:
        return train()
    ctx.console.print(f"{name}: {spawn.launcher}")
    return spawn_stage(spawn.argv, ctx, name, launcher=spawn.launcher, log=TRL_LOG, env=spawn.env)


def plan_trl(stage: Any, ctx: RunContext, name: str, what: str, base: str) -> list[str]:
    """`what` in-process, or the command that spawns it; then the placement plan of the stage on a GPU node."""
    from memrl.train.placement import stage_plan

    placement = stage_plan(stage, base).text()
    if (spawn := trl_stage_spawn(stage, ctx, name)) is None:
        return [f"{what} in-process", placement]
    return [f"{what} under {spawn.launcher}", shown(spawn.argv, spawn.env), placement]


# ---- the trainers' entries --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trainer(Generic[S]):
    """One backend behind a training stage, as the table holds it: (stage, ctx, name, base model, data folder) ->
    work or its description."""

    run: Callable[[S, RunContext, str, str, Path], None]
    describe: Callable[[S, RunContext, str, str, Path], list[str]]
    files: tuple[str, ...] = ()  # the data files it reads (LLaMA-Factory: checked by llamafactory.dataset_folder)

    def require_data(self, data: Path) -> None:
        """Each data file missing or empty, in one line, before any trainer starts (a library given an empty file
        fails minutes later with a traceback: `datasets` raised StopIteration)."""
        from memrl.core.outcomes import require_data

        for file in self.files:
            require_data(data / file, "training data", "run the reflection_data stage first, or name its folder")


def own_processes_entry(runner: StageRunner, files: tuple[str, ...], *, wandb: bool) -> Trainer[Any]:
    """The entry of a backend whose runner starts its own processes; `wandb`: it reads wandb's variables
    (`wandb_defaults`) when it runs or plans."""

    def adapt(fn: Callable[[Any, StageRun, str, Path], Any]) -> Callable[[Any, RunContext, str, str, Path], Any]:
        def call(stage: Any, ctx: RunContext, name: str, base: str, data: Path) -> Any:
            if wandb:
                wandb_defaults(ctx)
            return fn(stage, stage_run(ctx, name), base, data)

        return call

    return Trainer(adapt(runner.run), adapt(runner.describe), files)


def accelerate_entry(trainer: InProcessRunner, files: tuple[str, ...], *, wandb: bool) -> Trainer[Any]:
    """The entry of a backend that trains in this process: in-process, or one process per GPU under `accelerate
    launch` (`run_trl`); `wandb`: it reads wandb's variables when it trains."""

    def where(ctx: RunContext, name: str) -> StageRun:
        if wandb:
            wandb_defaults(ctx)
        return stage_run(ctx, name)

    def run(stage: Any, ctx: RunContext, name: str, base: str, data: Path) -> None:
        final = run_trl(stage, ctx, name, lambda: trainer.train(stage, where(ctx, name), base, data))
        chart = f"; reward parts per step in {ctx.stage_dir(name) / trainer.parts_chart}" if trainer.parts_chart else ""
        ctx.console.print(f"{name}: checkpoint {final}{chart}")

    def describe(stage: Any, ctx: RunContext, name: str, base: str, data: Path) -> list[str]:
        return plan_trl(stage, ctx, name, trainer.what(stage, base, data), base)

    return Trainer(run, describe, files)


def entry(found: TrainerBackend, kind: TrainedKind) -> Trainer[Any]:
    """The app's entry of one backend for one stage kind, as the backend declares it (memrl.train.registry)."""
    runner = kind.load()
    if found.launch == "accelerate":
        return accelerate_entry(runner, kind.files, wandb=found.wandb_env)
    return own_processes_entry(runner, kind.files, wandb=found.wandb_env)


def trainers(kind: str) -> dict[str, Trainer[Any]]:
    """Stage kind `kind`'s table: each registered backend that trains it -> its entry."""
    found = {name: registry.backend(name) for name in registry.names(kind)}
    return {name: entry(backend, backend.kinds[kind]) for name, backend in found.items()}


def trainer_of(stage: Any) -> tuple[TrainerBackend, Trainer[Any]]:
    """The backend the stage selects and its entry for the stage's kind."""
    found = registry.stage_backend(stage)
    assert found is not None, f"{stage.trainer} trains no {stage.kind} stage"  # the schema's validator refused it
    return found[0], entry(*found)


def verl_command(stage: SFTStage | GRPOStage, ctx: RunContext, name: str, *, dry_run: bool) -> verl.VerlCommand:
    """The verl command a training stage runs (or, with `dry_run`, would run)."""
    where, base, data = stage_run(ctx, name), ctx.model_ref(stage.model), ctx.artifact(stage.data)
    if isinstance(stage, GRPOStage):
        return verl.grpo_command(with_init(stage, ctx), where, base, data, dry_run)
    return verl.sft_command(stage, where, base, data, dry_run)


# ---- the stage kinds --------------------------------------------------------------------------------------------

DataOf = Callable[[Any, RunContext, str], Path]  # (stage, ctx, name) -> the data folder the trainer reads


def _artifact(stage: Any, ctx: RunContext, name: str) -> Path:
    return ctx.artifact(stage.data)


def with_init(stage: S, ctx: RunContext) -> S:
    """The stage with `init` (an earlier stage's name or a checkpoint) resolved to its folder."""
    if isinstance(stage, PolicyOptimStage) and stage.init:
        return stage.model_copy(update={"init": ctx.model_ref(stage.init)})
    return stage


def already_finished(ctx: RunContext, name: str) -> bool:
    """A stage whose `final/` is complete is skipped (a rerun resumes the recipe)."""
    out = ctx.stage_dir(name)
    if is_finished(out):
        ctx.console.print(f"{name}: already finished ({out / 'final'}); delete it to retrain")
        return True
    return False


def train(stage: S, ctx: RunContext, name: str, data: Path) -> None:
    """Hand the stage to its trainer, its data checked first."""
    found, trainer = trainer_of(stage)
    if found.resumes and (point := resume_point(ctx.stage_dir(name))) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    stage = with_init(stage, ctx)
    trainer.require_data(data)
    trainer.run(stage, ctx, name, ctx.model_ref(stage.model), data)


def runner(data: DataOf = _artifact) -> Callable[[S, RunContext, str], None]:
    def run(stage: S, ctx: RunContext, name: str) -> None:
        if not already_finished(ctx, name):
            train(stage, ctx, name, data(stage, ctx, name))

    return run


def planner(data: DataOf = _artifact) -> Callable[[S, RunContext, str], list[str]]:
    def dry_run(stage: S, ctx: RunContext, name: str) -> list[str]:
        stage = with_init(stage, ctx)
        describe = trainer_of(stage)[1].describe
        return describe(stage, ctx, name, ctx.model_ref(stage.model), data(stage, ctx, name))

    return dry_run


def job(stage: Any, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    """A training stage inside a Ray job: its backend adapts the stage's entry and says what the job needs."""
    found = registry.stage_backend(stage)
    assert found is not None, f"{stage.trainer} trains no {stage.kind} stage"
    needs = found[0].job(stage, raw, dashboard)
    return Job(gpus=needs.gpus, gpus_if_any=needs.gpus_if_any)


SFT = StageKind(SFTStage, runner(), planner(), job, refs=("data",))
GRPO = StageKind(GRPOStage, runner(), planner(), job, refs=("data", "init"))
