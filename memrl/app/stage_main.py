"""What a distributed launcher starts in each process: one stage of a resolved recipe, run in this process.

torchrun --nproc-per-node=8 -m memrl.app.stage_main runs/NAME/recipe.resolved.yaml --stage judger
accelerate launch --multi_gpu --num_processes=8 -m memrl.app.stage_main runs/NAME/recipe.resolved.yaml --stage sft

The launcher's WORLD_SIZE tells the stage it is one rank of the launch, so it trains here instead of launching again.
Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from memrl.core import interrupts
from memrl.core.errors import MemrlError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memrl.app.stage_main", description=__doc__)
    parser.add_argument("recipe", help="a recipe file (the run folder's recipe.resolved.yaml)")
    parser.add_argument("--stage", required=True, help="the stage to run")
    args = parser.parse_args(argv)
    console = Console(stderr=True, quiet=os.environ.get("RANK", "0") != "0")
    try:
        run_stage(args.recipe, args.stage, console)
    except MemrlError as exc:
        Console(stderr=True).print(f"memrl: error: {exc}", highlight=False, markup=False)
        return 2
    except KeyboardInterrupt as exc:  # the launcher passed on a signal: `memrl run` says how to resume
        return interrupts.exit_code(exc)
    return 0


def run_stage(recipe_ref: str, name: str, console: Console) -> None:
    from memrl.app.recipe import load_recipe
    from memrl.app.runner import run_stage as run_one
    from memrl.core.errors import ConfigError

    recipe = load_recipe(recipe_ref).recipe
    # The run folder is the one holding the resolved recipe, even when `memrl resume` runs it from elsewhere.
    run_dir = Path(recipe_ref).resolve().parent
    recipe = recipe.model_copy(update={"output_dir": run_dir})
    os.environ.setdefault("WANDB_MODE", recipe.logging.mode)  # as `memrl run` sets it
    if name not in recipe.stages:
        raise ConfigError(f"recipe {recipe.name!r} has no stage {name!r}")
    ctx = recipe.context(run_dir, console)
    try:
        run_one(recipe, ctx, name)
    finally:
        ctx.close()


if __name__ == "__main__":
    interrupts.install()
    sys.exit(main())
