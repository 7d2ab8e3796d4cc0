"""The memory judger's stages: `judger` (train with BCE, in-process or under torchrun) and `eval_judger`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from memrl.app.context import RESOLVED_NAME, RunContext
from memrl.app.stages.base import StageKind
from memrl.core.errors import ConfigError, MemrlError
from memrl.core.schema import StrictModel
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


# ---- eval_judger --------------------------------------------------------------------------------------------------


class EvalJudgerStage(StrictModel):
    """Recall@k of the gold memories on the eval split: retrieval alone, the judger alone, fused across alpha; AUC."""

    kind: Literal["eval_judger"]
    judger: str | None = Field(
        default=None, description="a judger stage of this recipe or a trained judger folder; null: retrieval only"
    )
    data: str | None = Field(
        default=None, description="judger data folder (its eval/ split) or a stage of this recipe; default: `data`"
    )
    retriever: Literal["dense", "bm25", "hybrid"] = "dense"
    top_units: PositiveInt | None = Field(default=3, description="memory units kept by intent alignment; null: all")
    alpha: float = Field(default=0.5, ge=0, le=1, description="fused = alpha * retrieval + (1 - alpha) * judger")
    alphas: list[Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 3, 5], min_length=1)
    batch_size: PositiveInt = 32
    max_queries: PositiveInt | None = Field(default=None, description="only the first N queries (smoke runs)")


def run_eval_judger(stage: EvalJudgerStage, ctx: RunContext, name: str) -> None:
    from memrl.train.judger.data import require_pairs
    from memrl.train.judger.evaluate import evaluate_judger

    out, data = ctx.stage_dir(name), data_ref(stage.data, ctx, name)
    judger = str(ctx.artifact(stage.judger)) if stage.judger is not None else None
    metrics = evaluate_judger(
        judger,
        require_pairs(data, "eval"),
        out,
        retriever=stage.retriever,
        alpha=stage.alpha,
        top_units=stage.top_units,
        alphas=stage.alphas,
        ks=stage.ks,
        batch_size=stage.batch_size,
        max_queries=stage.max_queries,
        console=ctx.console,
    )
    shown = {k: metrics[k] for k in metrics if k.startswith(("recall@", "retrieval_recall@")) or k == "auc"}
    ctx.console.print(f"{name}: {json.dumps(shown)}", highlight=False)
    ctx.console.print(f"{name}: metrics {out / 'metrics.json'}")


def plan_eval_judger(stage: EvalJudgerStage, ctx: RunContext, name: str) -> list[str]:
    out, data = ctx.stage_dir(name), data_ref(stage.data, ctx, name)
    judger = str(ctx.artifact(stage.judger)) if stage.judger is not None else None
    top = stage.top_units if stage.top_units is not None else 0
    return [
        f"memrl eval judger --model {judger or 'none'} --data {data / 'eval'} --out {out} "
        f"--retriever {stage.retriever} --alpha {stage.alpha} --top-units {top}"
    ]


EVAL_JUDGER = StageKind(EvalJudgerStage, run_eval_judger, plan_eval_judger, refs=("judger", "data"))
