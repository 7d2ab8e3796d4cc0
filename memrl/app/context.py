"""What every stage runner gets: the recipe, its run folder, the console, and the models built so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from memrl.rollout.base import ChatBackend
from memrl.rollout.builder import build_backend

RESOLVED_NAME = "recipe.resolved.yaml"  # what every run writes into its folder; `memrl resume` reads it back

if TYPE_CHECKING:  # the recipe schema is built from the stage registry, whose stages take a RunContext
    from memrl.app.config import Recipe


@dataclass
class RunContext:
    recipe: Recipe
    run_dir: Path
    console: Console
    _backends: dict[str, ChatBackend] = field(default_factory=dict)

    def backend(self, name: str) -> ChatBackend:
        """The recipe's model `name`, built once per run."""
        if name not in self._backends:
            self._backends[name] = build_backend(self.recipe.models[name])
        return self._backends[name]

    def stage_dir(self, name: str) -> Path:
        return self.run_dir / name

    def artifact(self, ref: str) -> Path:
        """A stage of this recipe names its output folder; anything else is a path."""
        return self.stage_dir(ref) if ref in self.recipe.stages else Path(ref).expanduser()

    def model_ref(self, ref: str) -> str:
        """A recipe model key names its model; a stage names its output; anything else passes through."""
        if ref in self.recipe.models:
            return self.recipe.models[ref].model
        return str(self.artifact(ref)) if ref in self.recipe.stages else ref

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()
