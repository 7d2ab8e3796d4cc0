"""`collab_heldout`, the stage: it plays and reports through memrl.train.heldout (tests/train/test_heldout.py); here,
what it refuses of the recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from memrl.app.context import RunContext
from memrl.app.recipe import load_recipe
from memrl.app.stages.registry import kind_of
from memrl.core.errors import ConfigError


def test_a_train_stage_that_is_not_collab_grpo_is_refused(tmp_path: Path) -> None:
    recipe = load_recipe("collaborator-quickstart", ["stages.heldout.train=export"]).recipe
    ctx = RunContext(recipe, tmp_path, Console(file=None, quiet=True))
    stage = recipe.stages["heldout"]
    with pytest.raises(ConfigError, match="train='export' must name a collab_grpo stage"):
        kind_of(stage).dry_run(stage, ctx, "heldout")
