"""Command groups whose modules are imported only when the group runs or shows its help (click's lazy group).

Building `memrl eval` imports every world's action and config modules; `memrl run`, `memrl --help` and the other
groups need none of them. The root's help lists a group by its name and help alone, so both are given here, and its
commands are taken from `module:attribute` (a `typer.Typer`) the first time they are read.
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import ClassVar

import typer
import typer.main
from typer import _click  # typer vendors click: its groups hold these types, not the `click` package's
from typer.core import TyperGroup


class LazyGroup(TyperGroup):
    """A group whose commands are those of the `typer.Typer` at `source` ("module:attribute"), imported the first time
    anything reads them (running the group, its help, a test listing them); its name and help are known without."""

    source: ClassVar[str]
    _loaded: dict[str, _click.Command] | None = None

    @property
    def commands(self) -> MutableMapping[str, _click.Command]:
        if self._loaded is None:
            module, _, name = self.source.partition(":")
            self._loaded = dict(typer.main.get_group(getattr(importlib.import_module(module), name)).commands)
        return self._loaded

    @commands.setter
    def commands(self, given: MutableMapping[str, _click.Command]) -> None:
        if given:  # typer builds the group empty: its commands are the source's
            raise TypeError(f"{type(self).__name__} takes its commands from {self.source}")


def lazy_group(source: str, help: str) -> typer.Typer:
    """The `typer.Typer` to `add_typer` for a group whose commands are the ones of `source` ("module:attribute"); its
    `help` shows in `memrl --help` and the group's own help."""
    cls = type(f"LazyGroup[{source}]", (LazyGroup,), {"source": source})
    return typer.Typer(cls=cls, help=help, no_args_is_help=True)
