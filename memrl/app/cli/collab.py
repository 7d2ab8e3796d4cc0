"""`memrl collab ...` (taxonomy, checkers, run comparison) and `memrl eval collab`. Heavy imports stay inside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from memrl.core.errors import ConfigError
from memrl.core.files import check_file, check_folder, read_text

collab_app = typer.Typer(no_args_is_help=True)  # its help: main.LAZY_GROUPS
console = Console(stderr=True)


@collab_app.command("preferences")
def preferences(as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False) -> None:
    """The 20 interaction preferences: id, category, and whether a checker or only a judge can decide them."""
    from memrl.core.preferences import TAXONOMY

    if as_json:
        for p in TAXONOMY.values():
            row = {"id": p.id, "category": p.category.value, "checkable": p.checkable, "opposite": p.opposite}
            typer.echo(json.dumps(row | {"description": p.description, "enforce_when": p.enforce_when}))
        return
    table = Table("id", "category", "decided by", "opposite", "description")
    for p in TAXONOMY.values():
        table.add_row(
            p.id, p.category.value, "checker" if p.checkable else "judge-only", p.opposite or "", p.description
        )
    Console(width=200).print(table)


@collab_app.command("check")
def check(
    preference: Annotated[str, typer.Option("--preference", help="preference id (see `memrl collab preferences`)")],
    response_file: Annotated[Path, typer.Option("--response-file", help="text file with the agent's response")],
    winding_down: Annotated[bool, typer.Option("--winding-down", help="the conversation is ending")] = False,
    clarifying: Annotated[
        bool | None, typer.Option("--clarifying/--answering", help="override the clarifying-question detection")
    ] = None,
) -> None:
    """Run one preference's checker on a response; prints {"preference", "verdict", "reason"}."""
    from memrl.core.preferences import get_preference
    from memrl.envs.collab.checkers import TurnContext, is_clarifying_question
    from memrl.envs.collab.checkers import check as run_check

    get_preference(preference)  # an unknown id is the first thing to report
    if not response_file.exists():
        raise ConfigError(f"response file not found: {response_file}")
    text = read_text(response_file, ConfigError)
    asking = is_clarifying_question(text) if clarifying is None else clarifying
    result = run_check(preference, text, TurnContext(winding_down=winding_down, clarifying=asking))
    typer.echo(json.dumps({"preference": result.preference, "verdict": result.verdict.value, "reason": result.reason}))


@collab_app.command("compare")
def compare(
    memory_dir: Annotated[Path, typer.Option("--memory", help="run dir of the agent with memory")],
    baseline_dir: Annotated[Path, typer.Option("--baseline", help="run dir of the agent without memory")],
    out: Annotated[Path, typer.Option("--out", help="where deltas.json and deltas.png go")],
) -> None:
    """Per-session deltas (memory - no memory) of task success, user effort and length, as in the paper's Fig. 3."""
    from memrl.envs.collab.metrics import write_comparison

    for d in (memory_dir, baseline_dir):
        check_folder(d, ConfigError)
        if not (d / "metrics.json").exists():
            raise ConfigError(f"{d}/metrics.json not found: run `memrl eval collab --out {d}` first")
        check_file(d / "metrics.json", ConfigError)  # a FIFO or a folder there: say so, not "not found"
    deltas = write_comparison(memory_dir, baseline_dir, out)
    typer.echo(f"{len(deltas)} sessions compared: {out / 'deltas.json'}, {out / 'deltas.png'}")
