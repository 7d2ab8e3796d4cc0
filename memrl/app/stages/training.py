"""`sft` and `grpo`: one schema each (memrl.train.config), handed to TRL in-process, verl or LLaMA-Factory.

For verl and LLaMA-Factory the command is the product: `--dry-run` prints exactly what `run` executes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind
from memrl.app.stages.relaunch import plan_trl, run_trl
from memrl.core.checkpoints import portable_ref, resolve_model
from memrl.train import backends
from memrl.train.backends import VerlCommand
from memrl.train.config import GRPOStage, SFTStage
from memrl.train.placement import trainer_cluster, trainer_env
from memrl.train.trl_common import TrainContext, is_finished, resume_point

S = TypeVar("S", SFTStage, GRPOStage)


def train_context(ctx: RunContext, name: str) -> TrainContext:
    """Where a trainer writes and how it logs (wandb offline by default, named after the recipe and stage)."""
    logging = ctx.recipe.logging
    if logging.backend == "wandb":
        os.environ.setdefault("WANDB_PROJECT", logging.project)
        os.environ.setdefault("WANDB_DIR", str(ctx.run_dir))
        if logging.entity:
            os.environ.setdefault("WANDB_ENTITY", logging.entity)
    report_to = "wandb" if _wandb_on(ctx) else "none"
    return TrainContext(ctx.stage_dir(name), name, ctx.recipe.seed, report_to, f"{ctx.recipe.name}-{name}")


def _wandb_on(ctx: RunContext) -> bool:
    return ctx.recipe.logging.backend == "wandb" and ctx.recipe.logging.mode != "disabled"


def verl_logger(ctx: RunContext) -> Literal["wandb", "console"]:
    return "wandb" if _wandb_on(ctx) else "console"


@dataclass(frozen=True)
class Trainer(Generic[S]):
    """One trainer behind a training stage: (stage, ctx, name, base model, data folder) -> work or its description."""

    run: Callable[[S, RunContext, str, str, Path], None]
    describe: Callable[[S, RunContext, str, str, Path], list[str]]
    files: tuple[str, ...] = ()  # the data files it reads (LLaMA-Factory: checked by llamafactory_run.dataset_folder)

    def require_data(self, data: Path) -> None:
        """Each data file missing or empty, in one line, before any trainer starts (a library given an empty file
        fails minutes later with a traceback: `datasets` raised StopIteration)."""
        from memrl.core.outcomes import require_data

        for file in self.files:
            require_data(data / file, "training data", "run the reflection_data stage first, or name its folder")


# ---- TRL: in-process, or one process per GPU under `accelerate launch` (memrl.app.stages.relaunch) --------------


def _trl_sft(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    from memrl.train.trl_sft import train_sft

    final = run_trl(stage.cluster, ctx, name, lambda: train_sft(stage, base, data, train_context(ctx, name)))
    ctx.console.print(f"{name}: checkpoint {final}")


def _trl_grpo(stage: GRPOStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    from memrl.train.trl_grpo import train_grpo

    final = run_trl(
        stage.cluster, ctx, name, lambda: train_grpo(stage, base, data, train_context(ctx, name), ctx.console)
    )
    ctx.console.print(f"{name}: checkpoint {final}")


# ---- verl: a command line, validated against verl's own config on CPU ------------------------------------------


def verl_start(ref: str, ctx: RunContext, dry_run: bool) -> tuple[str, str | None]:
    """(model path, LoRA adapter or None) to start from (memrl.train.backends.verl_start)."""
    return backends.verl_start(ref, {str(ctx.stage_dir(n)) for n in ctx.recipe.stages}, dry_run)


def _where(ctx: RunContext, name: str, model_path: str, data: Path) -> dict[str, Any]:
    """The overrides' arguments every verl stage shares: model, data, output, and how the run is named and logged."""
    return {
        "model_path": model_path,
        "data_dir": data,
        "out_dir": ctx.stage_dir(name),
        "experiment": f"{ctx.recipe.name}-{name}",
        "project": ctx.recipe.logging.project,
        "logger": verl_logger(ctx),
    }


def _verl_grpo_command(
    stage: GRPOStage, ctx: RunContext, name: str, base: str, data: Path, dry_run: bool
) -> VerlCommand:
    from memrl.train import verl_launch as vl
    from memrl.train.endpoints import stage_endpoints

    model_path, adapter = verl_start(stage.init or base, ctx, dry_run)
    where = _where(ctx, name, model_path, data)
    overrides = vl.grpo_overrides(stage, **where, lora_adapter_path=adapter, seed=ctx.recipe.seed)
    vl.validate_overrides(vl.PPO_CONFIG, overrides)  # a bad key fails here, on CPU, before any GPU job
    vl.refuse_local_endpoints(stage_endpoints(stage), stage.cluster)
    env = dict(os.environ) | vl.job_env(stage)  # keys and the unscored stop: verl_main hands them to every worker
    env |= trainer_env(stage)  # the trainer's GPUs only: served models keep the others (train/placement.py)
    return VerlCommand(vl.verl_command("grpo", overrides, trainer_cluster(stage), environ=env), env, model_path)


def _verl_sft_command(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path, dry_run: bool) -> VerlCommand:
    from memrl.train import verl_launch as vl
    from memrl.train.verl_metrics import tracking_env

    model_path, _ = verl_start(base, ctx, dry_run)
    overrides = vl.sft_overrides(stage, **_where(ctx, name, model_path, data), resume=True, seed=ctx.recipe.seed)
    vl.validate_overrides(vl.SFT_CONFIG, overrides)
    # verl's SFT loggers run in the command's own process: their paths go in its environment.
    env = dict(os.environ) | tracking_env(ctx.stage_dir(name), wandb=_wandb_on(ctx)) | vl.verl_modules()
    env |= trainer_env(stage)  # the trainer's GPUs only: served models keep the others (train/placement.py)
    return VerlCommand(vl.verl_command("sft", overrides, trainer_cluster(stage), environ=env), env, model_path)


def verl_command(stage: SFTStage | GRPOStage, ctx: RunContext, name: str, *, dry_run: bool) -> VerlCommand:
    """The verl command a training stage runs (or, with `dry_run`, would run)."""
    base, data = ctx.model_ref(stage.model), ctx.artifact(stage.data)
    if isinstance(stage, GRPOStage):
        return _verl_grpo_command(_with_init(stage, ctx), ctx, name, base, data, dry_run)
    return _verl_sft_command(stage, ctx, name, base, data, dry_run)


def shown(argv: list[str]) -> list[str]:
    from memrl.train.verl_launch import format_command

    return [format_command(argv)]


def run_verl(command: VerlCommand, ctx: RunContext, name: str, *, base: str, trainer: str, alpha: int | None) -> None:
    """Run a verl stage into its folder's `final/` (memrl.train.backends.run_verl_stage)."""
    title = f"{ctx.recipe.name}: {name} ({trainer})"
    backends.run_verl_stage(
        command, ctx.stage_dir(name), title=title, base=base, trainer=trainer, stage=name, lora_alpha=alpha
    )


def _alpha(stage: SFTStage | GRPOStage) -> int | None:
    return stage.lora.alpha if stage.lora is not None else None


def _verl_grpo(stage: GRPOStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    from memrl.rollout.probe import require_reachable
    from memrl.train.endpoints import stage_endpoints

    require_reachable(stage_endpoints(stage))  # a dead judge fails here, in seconds, before verl takes the GPUs
    command = _verl_grpo_command(stage, ctx, name, base, data, dry_run=False)
    run_verl(command, ctx, name, base=portable_ref(command.model_path), trainer="verl-grpo", alpha=_alpha(stage))


def _verl_sft(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    command = _verl_sft_command(stage, ctx, name, base, data, dry_run=False)
    run_verl(command, ctx, name, base=portable_ref(base), trainer="verl-sft", alpha=_alpha(stage))


# ---- LLaMA-Factory, in its own environment ----------------------------------------------------------------------


def _llamafactory_args(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path, dry_run: bool) -> Any:
    import torch

    from memrl.train import llamafactory_run as lf

    train_ctx = train_context(ctx, name)
    return lf.sft_yaml(
        stage,
        model_path=base if dry_run else resolve_model(base),
        dataset_dir=lf.dataset_folder(data),
        out_dir=ctx.stage_dir(name) / lf.OUTPUT_SUBDIR,
        cpu=not torch.cuda.is_available(),
        report_to=train_ctx.report_to,
        run_name=train_ctx.run_name,
        seed=ctx.recipe.seed,
    )


def _llamafactory(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    import torch

    from memrl.train import llamafactory_run as lf
    from memrl.train.llamafactory_env import default_env_dir, ensure_env

    out = ctx.stage_dir(name)
    yaml_path = out / "llamafactory.yaml"
    lf.write_yaml(_llamafactory_args(stage, ctx, name, base, data, dry_run=False), yaml_path)
    with ctx.console.status("preparing LLaMA-Factory's own environment"):
        cli = ensure_env(default_env_dir())
    lf.run_llamafactory(
        yaml_path, cli, out / "llamafactory.log", env=lf.launch_env(stage, not torch.cuda.is_available())
    )
    lf.save_final(out, base=portable_ref(base), stage=name)


def _llamafactory_plan(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> list[str]:
    _llamafactory_args(stage, ctx, name, base, data, dry_run=True)  # refuses knobs LLaMA-Factory lacks, here too
    return [f"llamafactory-cli train {ctx.stage_dir(name) / 'llamafactory.yaml'}"]


SFT_TRAINERS: dict[str, Trainer[SFTStage]] = {
    "trl": Trainer(
        _trl_sft,
        lambda s, c, n, base, data: plan_trl(s.cluster, c, n, f"TRL SFTTrainer on {base}, data {data / 'sft'}"),
        ("sft/train.jsonl", "sft/eval.jsonl"),
    ),
    "verl": Trainer(
        _verl_sft,
        lambda s, c, n, base, data: shown(_verl_sft_command(s, c, n, base, data, True).argv),
        ("sft/train.parquet", "sft/eval.parquet"),
    ),
    "llamafactory": Trainer(_llamafactory, _llamafactory_plan),
}
GRPO_TRAINERS: dict[str, Trainer[GRPOStage]] = {
    "trl": Trainer(
        _trl_grpo,
        lambda s, c, n, base, data: plan_trl(
            s.cluster, c, n, f"TRL GRPOTrainer from {s.init or base}, data {data / 'rl'}"
        ),
        ("rl/train.jsonl",),
    ),
    "verl": Trainer(
        _verl_grpo,
        lambda s, c, n, base, data: shown(_verl_grpo_command(s, c, n, base, data, True).argv),
        ("rl/train.parquet", "rl/eval.parquet"),
    ),
}


# ---- the two stage kinds ----------------------------------------------------------------------------------------


def _with_init(stage: S, ctx: RunContext) -> S:
    if isinstance(stage, GRPOStage) and stage.init:
        return stage.model_copy(update={"init": ctx.model_ref(stage.init)})
    return stage


def _run(trainers: dict[str, Trainer[S]]) -> Callable[[S, RunContext, str], None]:
    def run(stage: S, ctx: RunContext, name: str) -> None:
        """Skip a stage whose `final/` is complete (a rerun resumes the recipe), else hand it to its trainer."""
        out = ctx.stage_dir(name)
        if is_finished(out):
            ctx.console.print(f"{name}: already finished ({out / 'final'}); delete it to retrain")
            return
        if stage.trainer == "trl" and (point := resume_point(out)) is not None:
            ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
        stage = _with_init(stage, ctx)
        trainer, data = trainers[stage.trainer], ctx.artifact(stage.data)
        trainer.require_data(data)
        trainer.run(stage, ctx, name, ctx.model_ref(stage.model), data)

    return run


def _dry_run(trainers: dict[str, Trainer[S]]) -> Callable[[S, RunContext, str], list[str]]:
    def dry_run(stage: S, ctx: RunContext, name: str) -> list[str]:
        stage = _with_init(stage, ctx)
        base: str = ctx.model_ref(stage.model)
        lines: list[str] = trainers[stage.trainer].describe(stage, ctx, name, base, ctx.artifact(stage.data))
        return [*lines, *placement_lines(stage, base)]

    return dry_run


def placement_lines(stage: Any, base: str) -> list[str]:
    """A verl stage's `placement:` block (memrl.train.placement): GPUs and memory fraction per model; a plan that
    cannot fit the node is refused here, in one line."""
    if stage.trainer != "verl":
        return []
    from memrl.train.placement import plan

    rollout = not isinstance(stage, SFTStage)
    label = "policy (verl actor + rollout)" if rollout else "policy (verl SFT)"
    return [plan(stage, base, trainer=label, rollout=rollout).text()]


def _verl_job(stage: SFTStage | GRPOStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    """verl joins the job's cluster (RAY_ADDRESS, set by Ray for every job) instead of starting its own Ray."""
    if stage.trainer != "verl":
        return Job()
    cluster = raw["cluster"]
    if isinstance(stage, SFTStage):
        if stage.cluster.nnodes > 1:
            # verl's SFT on several nodes runs only as its own Ray job (sft_trainer_ray through `ray job
            # submit`): hand it this cluster's job server.
            cluster["ray_address"] = dashboard
            return Job()
        cluster["ray_address"] = None
        return Job(gpus=stage.cluster.gpus_per_node)  # torchrun on the job's own node
    cluster["ray_address"] = None
    # The reward function is named by module already (memrl.train.rewards.verl.reward_path), outcome reward included.
    raw["overrides"] = [*raw["overrides"], "+ray_kwargs.ray_init.address=auto"]
    return Job()


SFT = StageKind(SFTStage, _run(SFT_TRAINERS), _dry_run(SFT_TRAINERS), _verl_job, refs=("data",))
GRPO = StageKind(GRPOStage, _run(GRPO_TRAINERS), _dry_run(GRPO_TRAINERS), _verl_job, refs=("data", "init"))
