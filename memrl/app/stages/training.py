"""`sft` and `grpo`: one schema each (memrl.train.config), handed to a trainer backend (`backend` of memrl.train.trl,
.verl, .llamafactory).

A table names each kind's backends; this module adds what only the app knows: the `StageRun` built from the run
context, wandb's environment, a finished or half-done stage, and TRL's spawn under accelerate (spawn.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind
from memrl.app.stages.spawn import plan_trl, run_trl
from memrl.train.config import GRPOStage, PolicyOptimStage, SFTStage
from memrl.train.hf_trainer import TrainContext, is_finished, resume_point
from memrl.train.llamafactory import backend as lf
from memrl.train.online.config import OnlineGRPOStage
from memrl.train.placement import trainer_cluster
from memrl.train.stage_run import StageRun
from memrl.train.trl import backend as trl_backend
from memrl.train.verl import backend as verl

S = TypeVar("S", SFTStage, GRPOStage, OnlineGRPOStage)
Backend = Callable[[S, StageRun, str, Path], Any]  # a train/ backend's run or describe: (stage, where, base, data)


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


def backend(run: Backend[S], describe: Backend[S], files: tuple[str, ...] = (), *, wandb: bool = False) -> Trainer[S]:
    """A train/ backend's entry; `wandb`: it reads wandb's variables (`wandb_defaults`) when it runs or plans."""

    def adapt(fn: Backend[S]) -> Callable[[S, RunContext, str, str, Path], Any]:
        def call(stage: S, ctx: RunContext, name: str, base: str, data: Path) -> Any:
            if wandb:
                wandb_defaults(ctx)
            return fn(stage, stage_run(ctx, name), base, data)

        return call

    return Trainer(adapt(run), adapt(describe), files)


def trl_entry(trainer: trl_backend.TrlTrainer, files: tuple[str, ...] = ()) -> Trainer[Any]:
    """TRL's entry: in-process, or one process per GPU under `accelerate launch` (memrl.app.stages.spawn)."""

    def run(stage: Any, ctx: RunContext, name: str, base: str, data: Path) -> None:
        final = run_trl(stage, ctx, name, lambda: trainer.train(stage, _trl_run(ctx, name), base, data))
        chart = f"; reward parts per step in {ctx.stage_dir(name) / trainer.parts_chart}" if trainer.parts_chart else ""
        ctx.console.print(f"{name}: checkpoint {final}{chart}")

    def describe(stage: Any, ctx: RunContext, name: str, base: str, data: Path) -> list[str]:
        return plan_trl(stage, ctx, name, trainer.what(stage, base, data), base)

    return Trainer(run, describe, files)


def _trl_run(ctx: RunContext, name: str) -> StageRun:
    wandb_defaults(ctx)
    return stage_run(ctx, name)


SFT_TRAINERS: dict[str, Trainer[SFTStage]] = {
    "trl": trl_entry(trl_backend.SFT, ("sft/train.jsonl", "sft/eval.jsonl")),
    "verl": backend(verl.run_sft, verl.describe_sft, ("sft/train.parquet", "sft/eval.parquet")),
    "llamafactory": backend(lf.run, lf.describe, wandb=True),
}
GRPO_TRAINERS: dict[str, Trainer[GRPOStage]] = {
    "trl": trl_entry(trl_backend.GRPO, ("rl/train.jsonl",)),
    "verl": backend(verl.run_grpo, verl.describe_grpo, ("rl/train.parquet", "rl/eval.parquet")),
}


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


def train(trainers: dict[str, Trainer[S]], stage: S, ctx: RunContext, name: str, data: Path) -> None:
    """Hand the stage to its trainer, its data checked first."""
    if stage.trainer == "trl" and (point := resume_point(ctx.stage_dir(name))) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    stage = with_init(stage, ctx)
    trainer = trainers[stage.trainer]
    trainer.require_data(data)
    trainer.run(stage, ctx, name, ctx.model_ref(stage.model), data)


def runner(trainers: dict[str, Trainer[S]], data: DataOf = _artifact) -> Callable[[S, RunContext, str], None]:
    def run(stage: S, ctx: RunContext, name: str) -> None:
        if not already_finished(ctx, name):
            train(trainers, stage, ctx, name, data(stage, ctx, name))

    return run


def planner(trainers: dict[str, Trainer[S]], data: DataOf = _artifact) -> Callable[[S, RunContext, str], list[str]]:
    def dry_run(stage: S, ctx: RunContext, name: str) -> list[str]:
        stage = with_init(stage, ctx)
        return trainers[stage.trainer].describe(stage, ctx, name, ctx.model_ref(stage.model), data(stage, ctx, name))

    return dry_run


def _job(stage: SFTStage | GRPOStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    if stage.trainer != "verl":  # TRL, LLaMA-Factory: the job's own processes train, on GPUs where there are some
        return Job(gpus_if_any=trainer_cluster(stage).gpus_per_node)
    if not isinstance(stage, SFTStage):
        # The reward function is named by module already (memrl.train.verl.rewards.reward_path), outcome included.
        verl.join_job_cluster(raw)
        return Job()
    cluster = raw["cluster"]
    if stage.cluster.nnodes > 1:
        # verl's SFT on several nodes runs only as its own Ray job (sft_trainer_ray through `ray job submit`):
        # hand it this cluster's job server.
        cluster["ray_address"] = dashboard
        return Job()
    cluster["ray_address"] = None
    # torchrun on the job's own node, on the GPUs its placement plan leaves the trainer (not the served models')
    return Job(gpus=trainer_cluster(stage).gpus_per_node)


SFT = StageKind(SFTStage, runner(SFT_TRAINERS), planner(SFT_TRAINERS), _job, refs=("data",))
GRPO = StageKind(GRPOStage, runner(GRPO_TRAINERS), planner(GRPO_TRAINERS), _job, refs=("data", "init"))
