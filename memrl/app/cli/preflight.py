"""`memrl preflight RECIPE [overrides]`: is this node ready for the recipe? (memrl.app.preflight)"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table


def preflight(
    recipe: Annotated[str, typer.Argument(help="bundled recipe name or path to a YAML file")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides", show_default=False)
    ] = None,
    stage: Annotated[list[str] | None, typer.Option("--stage", help="check only these stages (repeatable)")] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="apply the recipe's smoke overrides")] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray", help="also check a Ray worker's variables: a GCS address, auto, or local", show_default=False
        ),
    ] = None,
) -> None:
    """Check this node against a recipe in seconds: packages, GPUs and their memory, endpoints, Ray, output.
    One line per problem and exit 2, or a table and exit 0."""
    from memrl.app.preflight import preflight as check
    from memrl.app.recipe import load_recipe
    from memrl.core.errors import ConfigError

    loaded = load_recipe(recipe, overrides or [], smoke=smoke)
    unknown = sorted(set(stage or []) - set(loaded.recipe.stages))
    if unknown:
        raise ConfigError(f"no stage named {unknown[0]!r} in recipe {loaded.recipe.name!r}")
    report = check(loaded.recipe, only=stage, ray_address=ray)
    for line in report.warnings:
        print(f"memrl: preflight: warning: {line}", file=sys.stderr)
    for line in report.problems:
        print(f"memrl: preflight: {line}", file=sys.stderr)
    if report.problems:
        raise typer.Exit(2)
    table = Table("check", "result", title=f"{loaded.recipe.name}: ready")
    for what, result in report.checks:
        table.add_row(what, result)
    Console(width=160).print(table)
