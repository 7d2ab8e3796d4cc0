"""What a CLI command and a recipe stage both do, defined once: a config model, a run into a folder, a summary.

`memrl eval collab --users 4 --out D` and a recipe stage `{kind: eval_collab, users: 4}` validate the same model and
call the same `run`; the flags are generated from the model's fields (cli/from_config.py) and the stage kind
subclasses the model with its `kind` (stages/actions.py), so a flag and a recipe key cannot drift apart. Either way
the output folder is held (core/runfolder.py) while the action runs: a second run into it fails in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from rich.console import Console

from memrl.core.runfolder import hold

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Action(Generic[M]):
    command: str  # its CLI command, e.g. "eval tod"
    config: type[M]
    work: Callable[[M, Path, Console], dict[str, Any]]  # (config, output folder, console) -> the summary printed
    help: str  # one paragraph: the command's help and the stage's description
    refs: tuple[str, ...] = ()  # path fields a recipe may fill with the name of an earlier stage (its output folder)

    def run(self, cfg: M, out: Path, console: Console) -> dict[str, Any]:
        """Do the work into `out`, holding the folder meanwhile."""
        with hold(out):
            return self.work(cfg, out, console)
