"""`memrl data ...`: build training datasets from environment runs. Heavy imports stay inside the commands."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from memrl.app.cli import commands
from memrl.app.cli.from_config import plain_path

data_app = typer.Typer(no_args_is_help=True)  # its help: main.LAZY_GROUPS


class Gold(StrEnum):
    COMPOSED = "composed"
    TEACHER = "teacher"


def reflection(
    train_sessions: Annotated[
        list[Path],
        typer.Option(
            "--train-sessions", callback=plain_path, help="sessions.jsonl of a collab run on train users (repeatable)"
        ),
    ],
    eval_sessions: Annotated[
        list[Path],
        typer.Option(
            "--eval-sessions", callback=plain_path, help="sessions.jsonl of a collab run on eval users (repeatable)"
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="output folder (train/eval JSONL, sft/, rl/, llamafactory/)")],
    gold: Annotated[
        Gold, typer.Option("--gold", help="composed: from the rule user's labels; teacher: the run's own reflector")
    ] = Gold.COMPOSED,
) -> None:
    """Reflection SFT/RL data from collab sessions; train and eval must share no user and no problem."""
    from rich.console import Console

    from memrl.data_gen.config import ReflectionDataConfig
    from memrl.data_gen.reflection import SkipCounts, build_reflection_data

    cfg = ReflectionDataConfig(train_sessions=train_sessions, eval_sessions=eval_sessions, gold=gold.value)
    stats, _, _ = build_reflection_data(cfg, out, Console(stderr=True), 0, "data reflection")
    for split, s in (("train", stats.train), ("eval", stats.eval)):
        skips = SkipCounts.from_dict(s.skipped)
        typer.echo(
            f"{split}: {s.records} records, {s.users} users, {s.problems} problems, {s.with_enforcement} with "
            f"enforcement; skipped {skips.total} ({skips.describe()})"
        )
    histogram = ", ".join(f"{pid} {n}" for pid, n in stats.train.enforced.items()) or "none"
    typer.echo(f"enforced in train: {histogram}")
    typer.echo(f"wrote {out}")


# `data reflection` stays hand-written: its stage `reflection_data` also plays the collab sessions itself (a
# `collab` section, user counts, `min_success`) and the command prints per-split statistics, not one JSON summary.
commands.install(data_app, "data", {"reflection": reflection})
