"""The `judger` stage: train the memory judger with BCE, in-process or under torchrun (`eval_judger`: an action)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind
from memrl.app.stages.training import STAGE_ENTRY, resolved_recipe, shown, spawn_stage, train_context
from memrl.core.errors import ConfigError
from memrl.train.config import JudgerStage
from memrl.train.distributed import is_rank, ranks_env
from memrl.train.hf_trainer import is_finished


def data_ref(ref: str | None, ctx: RunContext, name: str) -> Path:
    """The stage's own `data`, else the recipe's; a stage of this recipe names its output folder."""
    ref = ref or ctx.data
    if ref is None:
        raise ConfigError(
            f"stages.{name}.data: no judger data; name a folder (or a stage) there, or pass data=DIR to `memrl run`"
        )
    return ctx.artifact(ref)


# ---- judger -------------------------------------------------------------------------------------------------------


def run_judger(stage: JudgerStage, ctx: RunContext, name: str) -> None:
    """Train in-process (CPU or one GPU), or under torchrun when the cluster has several GPUs; skip when done."""
    out = ctx.stage_dir(name)
    if is_finished(out):
        ctx.console.print(f"{name}: already finished ({out / 'final'}); delete it to retrain")
        return
    from memrl.train.judger.data import require_pairs

    data, base = data_ref(stage.data, ctx, name), ctx.model_ref(stage.model)
    require_pairs(data, "train")  # fail here, in one line, rather than once per GPU
    if stage.distributed and not is_rank():  # one of torchrun's processes trains below
        _run_distributed(stage, ctx, name)
        return
    from memrl.train.hf_trainer import resume_point
    from memrl.train.judger.trainer import train_judger

    if (point := resume_point(out)) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    ctx.console.print(f"{name}: judger {train_judger(stage, base, data, train_context(ctx, name))}")


def _torchrun_argv(stage: JudgerStage, ctx: RunContext, name: str) -> list[str]:
    from memrl.train.distributed import torchrun_command
    from memrl.train.placement import trainer_cluster

    per_step = stage.micro_batch_size * stage.world_size
    if stage.batch_size % per_step:
        raise ConfigError(
            f"stages.{name}: batch_size ({stage.batch_size}) must be a multiple of micro_batch_size "
            f"({stage.micro_batch_size}) x {stage.world_size} GPUs"
        )
    return torchrun_command(STAGE_ENTRY, resolved_recipe(ctx), name, trainer_cluster(stage))


def _run_distributed(stage: JudgerStage, ctx: RunContext, name: str) -> None:
    from memrl.train.judger.deepspeed_zero import deepspeed_config
    from memrl.train.placement import trainer_env

    argv = _torchrun_argv(stage, ctx, name)
    if stage.deepspeed is not None:
        deepspeed_config(stage.deepspeed)
    env = ranks_env(stage.cluster) | trainer_env(stage)
    final = spawn_stage(argv, ctx, name, launcher="torchrun", log="judger.log", env=env)
    ctx.console.print(f"{name}: judger {final}")


def plan_judger(stage: JudgerStage, ctx: RunContext, name: str) -> list[str]:
    data, base = data_ref(stage.data, ctx, name), ctx.model_ref(stage.model)
    if not stage.distributed:
        return [f"HF Trainer in-process, {stage.head} head on {base}, data {data / 'train'}"]
    from memrl.train.judger.deepspeed_zero import deepspeed_config
    from memrl.train.placement import trainer_env

    lines = [shown(_torchrun_argv(stage, ctx, name), ranks_env(stage.cluster) | trainer_env(stage))]
    if stage.deepspeed is not None:
        lines.append(f"DeepSpeed config {deepspeed_config(stage.deepspeed, must_exist=False)}")
    from memrl.train.placement import stage_plan

    return [*lines, stage_plan(stage, base).text()]


def judger_job(stage: JudgerStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    """A distributed judger is torchrun on the job's own node: the job asks Ray for that node's GPUs."""
    if not stage.distributed:
        return Job(gpus_if_any=1)  # CPU or one GPU, in the job's process, as on a workstation
    if stage.cluster.nnodes > 1:
        raise ConfigError(
            f"stages.{name}.cluster.nnodes={stage.cluster.nnodes}: under `memrl launch` a judger stage runs on one "
            "node (torchrun on the job's node); set nnodes 1, or run `memrl run` on every node with NODE_RANK and "
            "MASTER_ADDR set"
        )
    return Job(gpus=stage.world_size)  # the GPUs its torchrun uses, not those of the node's served models


JUDGER = StageKind(JudgerStage, run_judger, plan_judger, judger_job, refs=("data",))
