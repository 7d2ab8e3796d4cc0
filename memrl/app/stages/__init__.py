"""Run a recipe's stages in order. Each stage kind has one runner; later layers register theirs here."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.app.config import (
    EvalJudgerStage,
    EvalReflectorStage,
    ExportStage,
    GenerateStage,
    PullModelsStage,
    ReflectionDataStage,
)
from memrl.app.context import RunContext
from memrl.app.recipe import RESOLVED_NAME, LoadedRecipe, load_recipe
from memrl.app.stages import judger as judger_stages
from memrl.app.stages import reflection as pipeline
from memrl.core import models
from memrl.core.errors import ConfigError
from memrl.core.jsonl import ResumableJsonl
from memrl.core.progress import progress
from memrl.rollout.base import Message
from memrl.train.config import GRPOStage, JudgerStage, SFTStage


def run_pull_models(stage: PullModelsStage, ctx: RunContext, name: str) -> None:
    if ctx.dry_run:
        ctx.console.print(f"{name}: memrl models pull {' '.join(stage.models)}")
        return
    for model in stage.models:
        with ctx.console.status(f"preparing {model}"):
            path = models.pull(model)
        ctx.console.print(f"{model}: {path}")


def _read_prompts(stage: GenerateStage) -> list[str]:
    prompts = list(stage.prompts)
    if stage.prompts_file is not None:
        if not stage.prompts_file.is_file():
            raise ConfigError(f"prompts_file {stage.prompts_file} does not exist")
        for n, line in enumerate(stage.prompts_file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            if stage.prompts_file.suffix == ".jsonl":
                try:
                    prompts.append(str(json.loads(line)["prompt"]))
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ConfigError(
                        f"{stage.prompts_file}:{n}: expected a JSON object with a 'prompt' field"
                    ) from None
            else:
                prompts.append(line)
    return prompts


def _prompt_key(system: str | None, prompt: str) -> str:
    return hashlib.sha1(f"{system or ''}\x00{prompt}".encode()).hexdigest()[:16]


def run_generate(stage: GenerateStage, ctx: RunContext, name: str) -> None:
    if ctx.dry_run:
        ctx.console.print(f"{name}: {len(_read_prompts(stage))} prompts to model {stage.model!r}")
        return
    out = ResumableJsonl(ctx.run_dir / name / stage.output)
    todo = [p for p in _read_prompts(stage) if _prompt_key(stage.system, p) not in out.done]
    backend = ctx.backend(stage.model)
    params = stage.sampling.params()
    chunk = backend.batch_size
    with progress(ctx.console) as bar:
        task = bar.add_task(f"{name}: generating", total=len(todo))
        for start in range(0, len(todo), chunk):
            batch = todo[start : start + chunk]
            conversations = [_conversation(stage.system, p) for p in batch]
            for prompt, completion in zip(batch, backend.generate(conversations, params), strict=True):
                out.append(
                    {
                        "key": _prompt_key(stage.system, prompt),
                        "prompt": prompt,
                        "completion": completion.text,
                        "finish_reason": completion.finish_reason,
                        "prompt_tokens": completion.prompt_tokens,
                        "completion_tokens": completion.completion_tokens,
                    }
                )
            bar.advance(task, len(batch))
    ctx.console.print(f"{name}: {len(out.done)} generations in {out.path}")


def _conversation(system: str | None, prompt: str) -> list[Message]:
    head: list[Message] = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": prompt}]


RUNNERS: dict[type[Any], Callable[[Any, RunContext, str], None]] = {
    PullModelsStage: run_pull_models,
    GenerateStage: run_generate,
    ReflectionDataStage: pipeline.run_reflection_data,
    SFTStage: pipeline.run_sft,
    GRPOStage: pipeline.run_grpo,
    ExportStage: pipeline.run_export,
    EvalReflectorStage: pipeline.run_eval_reflector,
    JudgerStage: judger_stages.run_judger,
    EvalJudgerStage: judger_stages.run_eval_judger,
}


def run_recipe(loaded: LoadedRecipe, console: Console, only: list[str] | None = None, dry_run: bool = False) -> Path:
    """Run the selected stages (all by default) in recipe order; returns the run folder."""
    recipe = loaded.recipe
    unknown = sorted(set(only or []) - set(recipe.stages))
    if unknown:
        raise ConfigError(f"no stage named {unknown[0]!r} in recipe {recipe.name!r} (have: {', '.join(recipe.stages)})")
    run_dir = recipe.run_dir.resolve()
    if dry_run:
        console.print(f"run {recipe.name!r} (dry run: nothing is trained or written)")
    else:
        saved = loaded.save(run_dir)
        console.print(f"run {recipe.name!r}: resolved recipe written to {saved}")
    # wandb stays offline unless the recipe or the caller's environment says otherwise.
    os.environ.setdefault("WANDB_MODE", recipe.logging.mode)
    ctx = RunContext(recipe, run_dir, console, dry_run=dry_run)
    try:
        for name, stage in recipe.stages.items():
            if only and name not in only:
                continue
            console.rule(f"stage {name} ({stage.kind})")
            RUNNERS[type(stage)](stage, ctx, name)
    finally:
        ctx.close()
    return run_dir


def resume_run(run_dir: Path, console: Console, only: list[str] | None = None, dry_run: bool = False) -> Path:
    """Rerun the run saved in `run_dir` from its resolved recipe: finished stages are skipped, an interrupted
    training stage continues from its newest checkpoint. Outputs stay in `run_dir`, wherever it was started from."""
    if not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} does not exist")
    saved = run_dir / RESOLVED_NAME
    if not saved.is_file():
        raise ConfigError(f"{run_dir} is not a memrl run folder: {RESOLVED_NAME} is missing")
    loaded = load_recipe(saved)
    loaded.recipe = loaded.recipe.model_copy(update={"output_dir": run_dir.resolve()})
    return run_recipe(loaded, console, only=only, dry_run=dry_run)
