"""What every stage runner gets: the recipe, its run folder, the console, and the models built so far."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rich.console import Console

from memrl.core.secrets import RedactingStream, redact_logs
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

    def __post_init__(self) -> None:
        # Every stage prints through this console and logs through `logging`: the run's secrets are masked there.
        redact_logs()
        redact_console(self.console)

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


def redact_console(console: Console) -> None:
    """Mask known secrets in whatever `console` prints. Idempotent."""
    explicit = console._file  # None: Rich writes to whatever sys.stdout (or stderr) is at the time
    if isinstance(explicit, RedactingStream):
        return
    target = explicit if explicit is not None else lambda: _default_file(console)
    console.file = RedactingStream(target)  # type: ignore[assignment]


def _default_file(console: Console) -> IO[str]:
    file = sys.stderr if console.stderr else sys.stdout
    return getattr(file, "rich_proxied_file", file)  # under a Live display: the real stream, not Rich's proxy
