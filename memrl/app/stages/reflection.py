"""Recipe stage runners of the reflection pipeline: data -> SFT -> GRPO -> export -> evaluate (-> report)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from memrl.app.config import EvalReflectorStage, ExportStage, ReflectionDataStage
from memrl.app.context import RunContext
from memrl.core.checkpoints import (
    CheckpointInfo,
    adapter_base,
    final_dir,
    is_adapter,
    last_step_dir,
    portable_ref,
    resolve_model,
)
from memrl.train.config import GRPOStage, SFTStage
from memrl.train.trl_common import TrainContext, is_finished, resume_point


def run_reflection_data(stage: ReflectionDataStage, ctx: RunContext, name: str) -> None:
    from memrl.data_gen.reflection import build_from_sessions, load_sessions, write_dataset

    out = ctx.stage_dir(name)
    if ctx.dry_run:
        ctx.console.print(f"{name}: collab sessions for {stage.train_users} train + {stage.eval_users} eval users")
        return
    if stage.train_sessions:
        train = [s for path in stage.train_sessions for s in load_sessions(path)]
        evaluation = [s for path in stage.eval_sessions for s in load_sessions(path)]
    else:
        train = _collab_sessions(stage, "train", stage.train_users, out / "collab-train", ctx)
        evaluation = _collab_sessions(stage, "eval", stage.eval_users, out / "collab-eval", ctx)
    train_records, eval_records, skipped = build_from_sessions(train, evaluation, stage.gold)
    stats = write_dataset(train_records, eval_records, out, skipped)
    ctx.console.print(f"{name}: {json.dumps(stats.to_dict()['train'])}")
    ctx.console.print(f"{name}: {len(train_records)} train / {len(eval_records)} eval reflection samples in {out}")


def _collab_sessions(stage: ReflectionDataStage, split: str, users: int, out: Path, ctx: RunContext) -> list[dict]:
    from memrl.envs.collab.runner import run_collab

    cfg = stage.collab.model_copy(update={"split": split, "users": users, "seed": ctx.recipe.seed})
    return run_collab(cfg, out, ctx.console)


def train_context(ctx: RunContext, name: str) -> TrainContext:
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


Launcher = Callable[[Any, RunContext, str, str, Path], None]


def run_sft(stage: SFTStage, ctx: RunContext, name: str) -> None:
    _train(SFT_TRAINERS[stage.trainer], stage, ctx, name)


def run_grpo(stage: GRPOStage, ctx: RunContext, name: str) -> None:
    init = ctx.model_ref(stage.init) if stage.init else None
    _train(GRPO_TRAINERS[stage.trainer], stage.model_copy(update={"init": init}), ctx, name)


def _train(launch: Launcher, stage: SFTStage | GRPOStage, ctx: RunContext, name: str) -> None:
    """Skip a stage whose `final/` is complete (a rerun resumes the recipe), else hand it to its trainer."""
    out = ctx.stage_dir(name)
    if not ctx.dry_run and is_finished(out):
        ctx.console.print(f"{name}: already finished ({out / 'final'}); delete it to retrain")
        return
    if not ctx.dry_run and stage.trainer == "trl" and (point := resume_point(out)) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    launch(stage, ctx, name, ctx.model_ref(stage.model), ctx.artifact(stage.data))


def _trl_sft(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    if ctx.dry_run:
        ctx.console.print(f"{name}: TRL SFTTrainer in-process on {base}, data {data / 'sft'}")
        return
    from memrl.train.trl_sft import train_sft

    ctx.console.print(f"{name}: checkpoint {train_sft(stage, base, data, train_context(ctx, name))}")


def _trl_grpo(stage: GRPOStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    if ctx.dry_run:
        ctx.console.print(f"{name}: TRL GRPOTrainer in-process from {stage.init or base}, data {data / 'rl'}")
        return
    from memrl.train.trl_grpo import train_grpo

    ctx.console.print(f"{name}: checkpoint {train_grpo(stage, base, data, train_context(ctx, name), ctx.console)}")


def run_export(stage: ExportStage, ctx: RunContext, name: str) -> None:
    from memrl.train.export import export_checkpoint

    source, out = ctx.artifact(stage.checkpoint), ctx.stage_dir(name)
    if ctx.dry_run:
        ctx.console.print(f"{name}: memrl export --checkpoint {source} --out {out}")
        return
    export_checkpoint(final_dir(source), out)
    ctx.console.print(f"{name}: exported {source} to {out}")


def run_eval_reflector(stage: EvalReflectorStage, ctx: RunContext, name: str) -> None:
    from memrl.train.evaluate import evaluate_reflector, online_check
    from memrl.train.export import record_evaluation
    from memrl.train.report import write_report

    out, data = ctx.stage_dir(name), ctx.artifact(stage.data)
    models = {label: ctx.model_ref(ref) for label, ref in stage.models.items()}
    if ctx.dry_run:
        for label, ref in models.items():
            ctx.console.print(f"{name}: memrl eval reflector --model {ref} --data {data} --out {out / label}")
        return
    results: dict[str, Any] = {}
    for label, ref in models.items():
        metrics = evaluate_reflector(
            ref, data, out / label, stage.reward, stage.sampling.params(), ctx.console, max_samples=stage.max_samples
        )
        record_evaluation(Path(ref), f"{ctx.recipe.name}/{label}", metrics)
        results[label] = metrics
        ctx.console.print(f"{name}: {label}: " + json.dumps({k: metrics[k] for k in ("score", "coverage", "format")}))
    online = online_check(models, stage.online.collab, out / "online", ctx.console) if stage.online else None
    report = write_report(ctx.run_dir, results, online, _grpo_logs(ctx))
    ctx.console.print(f"{name}: report {report}")


def _grpo_logs(ctx: RunContext) -> dict[str, Path]:
    logs = {n: ctx.stage_dir(n) / "log_history.json" for n, s in ctx.recipe.stages.items() if s.kind == "grpo"}
    return {n: p for n, p in logs.items() if p.is_file()}


# ---- external trainers: the command is the product; --dry-run prints it --------------------------------------


def _logger(ctx: RunContext) -> Literal["wandb", "console"]:
    return "wandb" if _wandb_on(ctx) else "console"


def _verl_start(ref: str, ctx: RunContext) -> tuple[str, str | None]:
    """(model path, LoRA adapter or None) to start from; a stage that has not run yet is named by its plan."""
    final = final_dir(Path(ref))
    if is_adapter(final):
        return resolve_model(adapter_base(final)), str(final)
    if final.is_dir():
        return str(final), None
    if ref in {str(ctx.stage_dir(n)) for n in ctx.recipe.stages}:
        return str(Path(ref) / "final"), None  # an earlier stage of this run; its final/ is where it will be
    return (ref if ctx.dry_run else resolve_model(ref)), None


def _launch_verl_grpo(stage: GRPOStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    from memrl.train import verl_launch as vl

    out = ctx.stage_dir(name)
    model_path, adapter = _verl_start(stage.init or base, ctx)
    overrides = vl.grpo_overrides(
        stage,
        model_path=model_path,
        data_dir=data,
        out_dir=out,
        experiment=f"{ctx.recipe.name}-{name}",
        project=ctx.recipe.logging.project,
        logger=_logger(ctx),
        lora_adapter_path=adapter,
        seed=ctx.recipe.seed,
    )
    vl.validate_overrides(vl.PPO_CONFIG, overrides)  # a bad key fails here, on CPU, before any GPU job
    env = dict(os.environ) | vl.secret_env(stage)
    argv = vl.verl_command("grpo", overrides, stage.cluster, environ=env)
    _show_or_run(ctx, name, argv, out / "verl.log", env)
    if not ctx.dry_run:
        _finish_verl(out, base=portable_ref(model_path), trainer="verl-grpo", stage=name, alpha=_alpha(stage))


def _launch_verl_sft(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    from memrl.train import verl_launch as vl

    out = ctx.stage_dir(name)
    model_path, _ = _verl_start(base, ctx)
    overrides = vl.sft_overrides(
        stage,
        model_path=model_path,
        data_dir=data,
        out_dir=out,
        experiment=f"{ctx.recipe.name}-{name}",
        project=ctx.recipe.logging.project,
        logger=_logger(ctx),
        resume=True,
    )
    vl.validate_overrides(vl.SFT_CONFIG, overrides)
    argv = vl.verl_command("sft", overrides, stage.cluster)
    _show_or_run(ctx, name, argv, out / "verl.log", None)
    if not ctx.dry_run:
        _finish_verl(out, base=portable_ref(base), trainer="verl-sft", stage=name, alpha=_alpha(stage))


def _alpha(stage: SFTStage | GRPOStage) -> int | None:
    return stage.lora.alpha if stage.lora is not None else None


def _finish_verl(out: Path, *, base: str, trainer: str, stage: str, alpha: int | None) -> None:
    """Merge verl's last FSDP checkpoint into `final/` (an adapter for LoRA runs, else the full model)."""
    from memrl.train.verl_merge import merge_verl_checkpoint

    merged = merge_verl_checkpoint(out / "checkpoints", out / "merged", lora_alpha=alpha)
    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(merged, final)
    last = last_step_dir(out / "checkpoints", prefix="global_step_")
    steps = int(last.name.removeprefix("global_step_")) if last else 0
    CheckpointInfo(base, trainer, stage, steps, is_adapter(final)).save(final)


def _launch_llamafactory(stage: SFTStage, ctx: RunContext, name: str, base: str, data: Path) -> None:
    import torch

    from memrl.train import llamafactory_run as lf
    from memrl.train.llamafactory_env import default_env_dir, ensure_env

    out = ctx.stage_dir(name)
    cpu = not torch.cuda.is_available()
    train_ctx = train_context(ctx, name)
    args = lf.sft_yaml(
        stage,
        model_path=base if ctx.dry_run else resolve_model(base),
        dataset_dir=lf.dataset_folder(data),
        out_dir=out / "llamafactory",
        cpu=cpu,
        report_to=train_ctx.report_to,
        run_name=train_ctx.run_name,
        seed=ctx.recipe.seed,
    )
    yaml_path = out / "llamafactory.yaml"
    if ctx.dry_run:
        ctx.console.print(f"{name}: llamafactory-cli train {yaml_path}", highlight=False)
        return
    lf.write_yaml(args, yaml_path)
    with ctx.console.status("preparing LLaMA-Factory's own environment"):
        cli = ensure_env(default_env_dir())
    lf.run_llamafactory(yaml_path, cli, out / "llamafactory.log", env=lf.launch_env(stage, cpu))
    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(out / "llamafactory", final, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    steps = (
        json.loads((final / "trainer_state.json").read_text()).get("global_step", 0)
        if (final / "trainer_state.json").is_file()
        else 0
    )
    CheckpointInfo(portable_ref(base), "llamafactory-sft", name, int(steps), is_adapter(final)).save(final)


def _show_or_run(ctx: RunContext, name: str, argv: list[str], log: Path, env: dict[str, str] | None) -> None:
    from memrl.train.verl_launch import format_command, run_verl

    if ctx.dry_run:
        ctx.console.print(f"{name}:\n" + format_command(argv), soft_wrap=True, highlight=False, markup=False)
        return
    run_verl(argv, log, env=env)  # raises MemrlError with the log's last lines on failure


SFT_TRAINERS: dict[str, Launcher] = {"trl": _trl_sft, "verl": _launch_verl_sft, "llamafactory": _launch_llamafactory}
GRPO_TRAINERS: dict[str, Launcher] = {"trl": _trl_grpo, "verl": _launch_verl_grpo}
