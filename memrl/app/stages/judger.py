"""The `judger` stage: train the memory judger with BCE, in-process or under torchrun (`eval_judger`: an action)."""

from __future__ import annotations

import os
from pathlib import Path

from memrl.app.context import RESOLVED_NAME, RunContext
from memrl.app.stages.base import StageKind
from memrl.core.errors import ConfigError, MemrlError
from memrl.train.config import JudgerStage
from memrl.train.trl_common import is_finished

TORCHRUN_ENTRY = "memrl.app.judger_main"  # what torchrun starts once per GPU: one judger stage of a resolved recipe


def data_ref(ref: str | None, ctx: RunContext, name: str) -> Path:
    """The stage's own `data`, else the recipe's; a stage of this recipe names its output folder."""
    ref = ref or ctx.recipe.data
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
    if stage.distributed:
        _run_distributed(stage, ctx, name)
        return
    from memrl.app.stages.training import train_context
    from memrl.train.judger.trainer import train_judger
    from memrl.train.trl_common import resume_point

    if (point := resume_point(out)) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    ctx.console.print(f"{name}: judger {train_judger(stage, base, data, train_context(ctx, name))}")


def _torchrun_argv(stage: JudgerStage, ctx: RunContext, name: str) -> list[str]:
    from memrl.train.judger.launch import torchrun_command

    per_step = stage.micro_batch_size * stage.world_size
    if stage.batch_size % per_step:
        raise ConfigError(
            f"stages.{name}: batch_size ({stage.batch_size}) must be a multiple of micro_batch_size "
            f"({stage.micro_batch_size}) x {stage.world_size} GPUs"
        )
    return torchrun_command(TORCHRUN_ENTRY, ctx.run_dir / RESOLVED_NAME, name, stage.cluster)


def _run_distributed(stage: JudgerStage, ctx: RunContext, name: str) -> None:
    from memrl.train.judger.launch import deepspeed_config, format_command, resolve_refs
    from memrl.train.launch import run_logged

    argv = _torchrun_argv(stage, ctx, name)
    if stage.deepspeed is not None:
        deepspeed_config(stage.deepspeed)
    out = ctx.stage_dir(name)
    shown = format_command(argv)
    run_logged(resolve_refs(argv), out / "judger.log", name=f"stage {name} (torchrun)", shown=shown, env=os.environ)
    if not is_finished(out):
        raise MemrlError(f"stage {name}: torchrun finished but wrote no {out / 'final'}; see {out / 'judger.log'}")
    ctx.console.print(f"{name}: judger {out / 'final'}")


def plan_judger(stage: JudgerStage, ctx: RunContext, name: str) -> list[str]:
    data, base = data_ref(stage.data, ctx, name), ctx.model_ref(stage.model)
    if not stage.distributed:
        return [f"HF Trainer in-process, {stage.head} head on {base}, data {data / 'train'}"]
    from memrl.train.judger.launch import deepspeed_config, format_command

    lines = [format_command(_torchrun_argv(stage, ctx, name))]
    if stage.deepspeed is not None:
        lines.append(f"DeepSpeed config {deepspeed_config(stage.deepspeed, must_exist=False)}")
    return lines


JUDGER = StageKind(JudgerStage, run_judger, plan_judger, refs=("data",))
