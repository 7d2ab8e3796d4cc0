"""Recipe stage runners of the memory judger: `judger` (train) and `eval_judger` (Recall@k, AUC)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from memrl.app.config import EvalJudgerStage
from memrl.app.context import RunContext
from memrl.core.errors import ConfigError, MemrlError
from memrl.train.config import JudgerStage
from memrl.train.trl_common import is_finished

RESOLVED_RECIPE = "recipe.resolved.yaml"  # what `run_recipe` writes into the run folder before any stage runs


def data_ref(ref: str | None, ctx: RunContext, name: str) -> Path:
    """The stage's own `data`, else the recipe's; a stage of this recipe names its output folder."""
    ref = ref or ctx.recipe.data
    if ref is None:
        raise ConfigError(
            f"stages.{name}.data: no judger data; name a folder (or a stage) there, or pass data=DIR to `memrl run`"
        )
    return ctx.artifact(ref)


def run_judger(stage: JudgerStage, ctx: RunContext, name: str) -> None:
    """Train in-process (CPU or one GPU), or under torchrun when the cluster has several GPUs; skip when done."""
    out = ctx.stage_dir(name)
    if not ctx.dry_run and is_finished(out):
        ctx.console.print(f"{name}: already finished ({out / 'final'}); delete it to retrain")
        return
    data, base = data_ref(stage.data, ctx, name), ctx.model_ref(stage.model)
    if stage.distributed:
        _launch_distributed(stage, ctx, name, data)
        return
    if ctx.dry_run:
        ctx.console.print(
            f"{name}: HF Trainer in-process, {stage.head} head on {base}, data {data / 'train'}",
            soft_wrap=True,
            highlight=False,
        )
        return
    from memrl.app.stages.reflection import train_context
    from memrl.train.judger.data import require_pairs
    from memrl.train.judger.trainer import train_judger
    from memrl.train.trl_common import resume_point

    require_pairs(data, "train")
    if (point := resume_point(out)) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    ctx.console.print(f"{name}: judger {train_judger(stage, base, data, train_context(ctx, name))}")


def _launch_distributed(stage: JudgerStage, ctx: RunContext, name: str, data: Path) -> None:
    from memrl.train.judger.launch import deepspeed_config, format_command, resolve_refs, torchrun_command
    from memrl.train.launch import run_logged

    per_step = stage.micro_batch_size * stage.world_size
    if stage.batch_size % per_step:
        raise ConfigError(
            f"stages.{name}: batch_size ({stage.batch_size}) must be a multiple of micro_batch_size "
            f"({stage.micro_batch_size}) x {stage.world_size} GPUs"
        )
    argv = torchrun_command(ctx.run_dir / RESOLVED_RECIPE, name, stage.cluster)
    shown = format_command(argv)
    if ctx.dry_run:
        ctx.console.print(f"{name}:\n{shown}", soft_wrap=True, highlight=False, markup=False)
        if stage.deepspeed is not None:
            ds = deepspeed_config(stage.deepspeed, must_exist=False)
            ctx.console.print(f"{name}: DeepSpeed config {ds}", soft_wrap=True, highlight=False, markup=False)
        return
    from memrl.train.judger.data import require_pairs

    require_pairs(data, "train")  # fail here, in one line, rather than once per GPU
    if stage.deepspeed is not None:
        deepspeed_config(stage.deepspeed)
    out = ctx.stage_dir(name)
    run_logged(resolve_refs(argv), out / "judger.log", name=f"stage {name} (torchrun)", shown=shown, env=os.environ)
    if not is_finished(out):
        raise MemrlError(f"stage {name}: torchrun finished but wrote no {out / 'final'}; see {out / 'judger.log'}")
    ctx.console.print(f"{name}: judger {out / 'final'}")


def run_eval_judger(stage: EvalJudgerStage, ctx: RunContext, name: str) -> None:
    out, data = ctx.stage_dir(name), data_ref(stage.data, ctx, name)
    judger = str(ctx.artifact(stage.judger)) if stage.judger is not None else None
    if ctx.dry_run:
        top = stage.top_units if stage.top_units is not None else 0
        ctx.console.print(
            f"{name}: memrl eval judger --model {judger or 'none'} --data {data / 'eval'} --out {out} "
            f"--retriever {stage.retriever} --alpha {stage.alpha} --top-units {top}",
            soft_wrap=True,
            highlight=False,
        )
        return
    from memrl.train.judger.data import require_pairs
    from memrl.train.judger.evaluate import evaluate_judger

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
