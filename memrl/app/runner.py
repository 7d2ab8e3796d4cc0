"""`memrl run` and `memrl resume`: a recipe's stages in order, each through its kind in the registry."""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

from rich.console import Console

from memrl.app.config import Recipe
from memrl.app.context import RunContext
from memrl.app.recipe import RESOLVED_NAME, LoadedRecipe, load_recipe
from memrl.app.stages.registry import kind_of
from memrl.core import interrupts
from memrl.core.errors import ConfigError
from memrl.core.files import check_file, check_folder
from memrl.core.runfolder import hold


def run_stage(recipe: Recipe, ctx: RunContext, name: str) -> None:
    """Stage `name` through its kind, given the run and the specs of the stages it needs."""
    stage = recipe.stages[name]
    kind_of(stage).run(stage, ctx.needing(recipe.needs(name)), name)


def plan_lines(recipe: Recipe, ctx: RunContext, name: str) -> list[str]:
    """What stage `name` would do, one printable block per line of its plan ("name: ..." or "name:" + a command)."""
    stage = recipe.stages[name]
    plan = kind_of(stage).dry_run(stage, ctx.needing(recipe.needs(name)), name)
    return [f"{name}:\n{text}" if "\n" in text else f"{name}: {text}" for text in plan]


def run_recipe(loaded: LoadedRecipe, console: Console, only: list[str] | None = None, dry_run: bool = False) -> Path:
    """Run the selected stages (all by default) in recipe order; returns the run folder."""
    recipe = loaded.recipe
    unknown = sorted(set(only or []) - set(recipe.stages))
    if unknown:
        raise ConfigError(f"no stage named {unknown[0]!r} in recipe {recipe.name!r} (have: {', '.join(recipe.stages)})")
    run_dir = recipe.run_dir.resolve()
    with contextlib.ExitStack() as stack:
        if dry_run:
            console.print(f"run {recipe.name!r} (dry run: nothing is trained or written)")
        else:
            # A signal stops the run in one line naming the command that resumes it (memrl.core.interrupts).
            stack.enter_context(interrupts.resume_hint(f"memrl resume {shlex.quote(str(run_dir))}"))
            stack.enter_context(hold(run_dir))  # one run at a time in a run folder (its stages hold their own)
            saved = loaded.save(run_dir)
            console.print(f"run {recipe.name!r}: resolved recipe written to {saved}")
        # wandb stays offline unless the recipe or the caller's environment says otherwise.
        os.environ.setdefault("WANDB_MODE", recipe.logging.mode)
        ctx = recipe.context(run_dir, console)
        stack.callback(ctx.close)
        for name, stage in recipe.stages.items():
            if only and name not in only:
                continue
            console.rule(f"stage {name} ({stage.kind})")
            if dry_run:
                for line in plan_lines(recipe, ctx, name):
                    console.print(line, soft_wrap=True, highlight=False, markup=False)
            else:
                run_stage(recipe, ctx, name)
    return run_dir


def resume_run(run_dir: Path, console: Console, only: list[str] | None = None, dry_run: bool = False) -> Path:
    """Rerun the run saved in `run_dir` from its resolved recipe: finished stages are skipped, an interrupted
    training stage continues from its newest checkpoint. Outputs stay in `run_dir`, wherever it was started from."""
    if not run_dir.exists():
        raise ConfigError(f"run folder {run_dir} does not exist")
    check_folder(run_dir, ConfigError)
    saved = run_dir / RESOLVED_NAME
    if not saved.exists():
        raise ConfigError(f"{run_dir} is not a memrl run folder: {RESOLVED_NAME} is missing")
    check_file(saved, ConfigError)  # a FIFO or a folder under that name: say what it is
    loaded = load_recipe(saved)
    loaded.recipe = loaded.recipe.model_copy(update={"output_dir": run_dir.resolve()})
    return run_recipe(loaded, console, only=only, dry_run=dry_run)
