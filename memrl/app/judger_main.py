"""Entry point torchrun starts once per GPU: train one judger stage of a resolved recipe.

torchrun --nproc-per-node=8 -m memrl.app.judger_main runs/NAME/recipe.resolved.yaml --stage judger
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rich.console import Console

from memrl.core.errors import MemrlError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memrl.app.judger_main", description=__doc__)
    parser.add_argument("recipe", help="a recipe file (the run folder's recipe.resolved.yaml)")
    parser.add_argument("--stage", required=True, help="the judger stage to train")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    try:
        train(args.recipe, args.stage, console)
    except MemrlError as exc:
        console.print(f"memrl: error: {exc}", highlight=False, markup=False)
        return 2
    return 0


def train(recipe_ref: str, name: str, console: Console) -> None:
    from memrl.app.context import RunContext
    from memrl.app.recipe import load_recipe
    from memrl.app.stages.judger import data_ref
    from memrl.app.stages.training import train_context
    from memrl.core.errors import ConfigError
    from memrl.train.config import JudgerStage
    from memrl.train.judger.trainer import train_judger

    recipe = load_recipe(recipe_ref).recipe
    os.environ.setdefault("WANDB_MODE", recipe.logging.mode)
    stage = recipe.stages.get(name)
    if not isinstance(stage, JudgerStage):
        raise ConfigError(f"recipe {recipe.name!r} has no judger stage {name!r}")
    ctx = RunContext(recipe, recipe.run_dir.resolve(), console)
    train_judger(stage, ctx.model_ref(stage.model), data_ref(stage.data, ctx, name), train_context(ctx, name))


if __name__ == "__main__":
    sys.exit(main())
