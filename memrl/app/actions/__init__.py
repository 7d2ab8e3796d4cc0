"""What a CLI command and a recipe stage both do, defined once: a config model, a run into a folder, a summary.

`memrl eval collab --users 4 --out D` and a recipe stage `{kind: eval_collab, users: 4}` validate the same model and
call the same `run`; the flags are generated from the model's fields (cli/from_config.py) and the stage kind
subclasses the model with its `kind` (stages/actions.py), so a flag and a recipe key cannot drift apart. Either way
the output folder is held (core/runfolder.py) while the action runs: a second run into it fails in one line.

An action is the CLI face of one stage kind: it is listed once, as that kind in `stages.registry.KINDS`, and
`memrl eval|data ...` (cli/commands.py) is built from the kinds that have one. An action has one name, its command
words, and its stage kind follows from them by one rule (`kind_of`): `eval X` <-> kind `eval_X` (the verb leads),
`data X` <-> kind `X_data` (the noun follows), any other command its words joined by `_`.
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

KIND_RULES = {"eval": "eval_{rest}", "data": "{rest}_data"}  # command group -> the kind's pattern


def kind_of(command: str) -> str:
    """The stage kind of a command: `eval tod` -> `eval_tod`, `data tod` -> `tod_data` (see the module's rule)."""
    group, _, rest = command.partition(" ")
    return KIND_RULES[group].format(rest=rest.replace(" ", "_")) if group in KIND_RULES else command.replace(" ", "_")


@dataclass(frozen=True)
class Action(Generic[M]):
    command: str  # its CLI command, e.g. "eval tod"
    config: type[M]
    work: Callable[[M, Path, Console], dict[str, Any]]  # (config, output folder, console) -> the summary printed
    help: str  # one paragraph: the command's help and the stage's description
    refs: tuple[str, ...] = ()  # path fields a recipe may fill with the name of an earlier stage (its output folder)

    @property
    def kind(self) -> str:
        """The recipe stage kind that runs this action."""
        return kind_of(self.command)

    def run(self, cfg: M, out: Path, console: Console) -> dict[str, Any]:
        """Do the work into `out`, holding the folder meanwhile."""
        with hold(out):
            return self.work(cfg, out, console)
