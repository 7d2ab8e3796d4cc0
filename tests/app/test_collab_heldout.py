"""`collab_heldout`, the stage: it plays and reports through memrl.train.heldout (tests/train/test_heldout.py); here,
what it is given of the run and what it refuses of the recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from memrl.app.recipe import load_recipe
from memrl.app.runner import plan_lines
from memrl.core.errors import ConfigError


def test_the_stage_is_given_the_training_stage_it_names_and_no_other() -> None:
    recipe = load_recipe("collaborator-quickstart").recipe
    assert recipe.needs("heldout") == {"collab": recipe.stages["collab"]}  # `train: collab`; `trained` is a folder
    assert all(recipe.needs(name) == {} for name in recipe.stages if name != "heldout")


def test_a_train_stage_that_is_not_collab_grpo_is_refused(tmp_path: Path) -> None:
    recipe = load_recipe("collaborator-quickstart", ["stages.heldout.train=export"]).recipe
    ctx = recipe.context(tmp_path, Console(file=None, quiet=True))
    with pytest.raises(ConfigError, match="train='export' must name a collab_grpo stage"):
        plan_lines(recipe, ctx, "heldout")
