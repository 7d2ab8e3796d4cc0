"""What a stage runner knows of its run: the run's name, seed and folder, the recipe's models (each built once per
run), its logging and default data, the run's stages by name and kind, and the specs of only those other stages its
kind declares it needs (`StageKind.needs`). Never the whole recipe: the recipe's schema is built from the stage
kinds, so the stages cannot depend on it."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Literal

from rich.console import Console

from memrl.core.schema import StrictModel
from memrl.core.secrets import RedactingStream, redact_logs
from memrl.rollout.base import ChatBackend
from memrl.rollout.builder import build_backend
from memrl.rollout.config import ModelConfig

RESOLVED_NAME = "recipe.resolved.yaml"  # what every run writes into its folder; `memrl resume` reads it back


class LoggingConfig(StrictModel):
    """Experiment tracking. wandb runs offline unless a recipe asks otherwise."""

    backend: Literal["wandb", "none"] = "wandb"
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "memrl"
    entity: str | None = None


@dataclass
class RunContext:
    name: str  # the recipe's: names the run in logs and reports
    seed: int
    run_dir: Path
    console: Console
    models: Mapping[str, ModelConfig] = field(default_factory=dict)  # the recipe's `models`, by key
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    data: str | None = None  # the dataset folder for the stages that read data and name none
    stages: Mapping[str, str] = field(default_factory=dict)  # every stage of the run, in order: name -> kind
    needs: Mapping[str, object] = field(default_factory=dict)  # the specs this stage declared it needs, by name
    _backends: dict[str, ChatBackend] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every stage prints through this console and logs through `logging`: the run's secrets are masked there.
        redact_logs()
        redact_console(self.console)

    def needing(self, needs: Mapping[str, object]) -> RunContext:
        """The context of one stage: this run (its backends shared) with the specs that stage needs."""
        return replace(self, needs=needs)

    def backend(self, name: str) -> ChatBackend:
        """The recipe's model `name`, built once per run."""
        if name not in self._backends:
            self._backends[name] = build_backend(self.models[name])
        return self._backends[name]

    def stage_dir(self, name: str) -> Path:
        return self.run_dir / name

    def artifact(self, ref: str) -> Path:
        """A stage of this run names its output folder; anything else is a path."""
        return self.stage_dir(ref) if ref in self.stages else Path(ref).expanduser()

    def model_ref(self, ref: str) -> str:
        """A recipe model key names its model; a stage names its output; anything else passes through."""
        if ref in self.models:
            return self.models[ref].model
        return str(self.artifact(ref)) if ref in self.stages else ref

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
