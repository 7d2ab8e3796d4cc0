"""`memrl pahf ...`: PAHF tools (the rule-based shopping user's feedback). Heavy imports stay inside commands."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from memrl.envs.pahf.formats import PersonaTable, ShoppingScenario

pahf_app = typer.Typer(no_args_is_help=True)  # its help: main.LAZY_GROUPS


class ChoiceArg(StrEnum):
    A = "A"
    B = "B"
    C = "C"
    D = "D"


class StyleArg(StrEnum):
    MINIMAL = "minimal"
    DETAILED = "detailed"


@pahf_app.callback()
def _pahf() -> None:
    """Keep `feedback` a subcommand even while it is the only one."""


def load_scenario(spec: str) -> ShoppingScenario:
    """A shopping scenario from a JSON file holding one row, or `PHASEFILE:INDEX` (a row of a phase file)."""
    from pydantic import ValidationError

    from memrl.envs.pahf.formats import PahfDataError, ShoppingScenario, describe, load_shopping_phase, read_json

    path = Path(spec)
    if not path.is_file() and ":" in spec:
        file, _, index = spec.rpartition(":")
        if not re.fullmatch(r"-?[0-9]{1,9}", index):  # ASCII digits (not `²`), one sign: what int() takes
            raise PahfDataError(f"--scenario {spec}: expected FILE or PHASEFILE:INDEX with an integer index")
        rows = load_shopping_phase(file)
        i = int(index)
        if not 0 <= i < len(rows):
            raise PahfDataError(f"{file}: no row {i} (the phase has {len(rows)} rows)")
        return rows[i]
    data = read_json(path)
    if isinstance(data, list):
        raise PahfDataError(f"{path}: holds a list of rows; pick one with {path}:INDEX")
    if not isinstance(data, dict):
        raise PahfDataError(f"{path}: unknown format: expected one shopping row (product, Option A/B/C, User, Task)")
    try:
        return ShoppingScenario.from_record(data)
    except ValidationError as exc:
        raise PahfDataError(f"{path}: {describe(exc)}") from None


def _table(path: Path, user: str | None, scenario: ShoppingScenario) -> PersonaTable:
    from memrl.core.errors import closest
    from memrl.envs.pahf.formats import PahfDataError, load_persona_tables

    tables = load_persona_tables(path)
    name = user or scenario.user
    if name not in tables:
        hint = closest(name, tables)
        raise PahfDataError(f"{path}: no user {name!r}" + (f" (did you mean {hint!r}?)" if hint else ""))
    if scenario.product not in tables[name].products:
        raise PahfDataError(f"{path}: {name}.persona_info: no preferences for product {scenario.product!r}")
    return tables[name]


@pahf_app.command("feedback")
def feedback(
    persona_table: Annotated[
        Path, typer.Option("--persona-table", help="preference tables (persona_info.json format) defining the user")
    ],
    scenario: Annotated[str, typer.Option("--scenario", help="JSON file with one shopping row, or PHASEFILE:INDEX")],
    choice: Annotated[ChoiceArg, typer.Option("--choice", help="the agent's choice; D buys nothing")],
    user: Annotated[str | None, typer.Option("--user", help="whose table to use (default: the row's User)")] = None,
    style: Annotated[StyleArg, typer.Option("--style", help="minimal names the problem; detailed adds the fix")] = (
        StyleArg.MINIMAL
    ),
    original_table: Annotated[
        Path | None,
        typer.Option("--original-table", help="the tables before the drift: enables 'my preferences changed'"),
    ] = None,
) -> None:
    """Print the rule-based shopping user's feedback on a choice as JSON (correct, message, kind)."""
    from memrl.envs.pahf.shopping import rule_feedback

    row = load_scenario(scenario)
    table = _table(persona_table, user, row)
    original = _table(original_table, user, row) if original_table is not None else None
    result = rule_feedback(table, row, choice.value, style=style.value, original=original)
    typer.echo(json.dumps(result.to_dict()))
