"""`memrl data ...`: build training datasets from environment runs. Heavy imports stay inside the commands."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from memrl.app.cli import commands
from memrl.app.cli.from_config import plain_path

data_app = typer.Typer(help="Build training datasets from environment runs.", no_args_is_help=True)


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
    from memrl.data_gen.reflection import build_from_sessions, load_split, require_records, write_dataset

    train_records, eval_records = load_split(train_sessions), load_split(eval_sessions)
    train, eval_, skipped = build_from_sessions(train_records, eval_records, gold.value)
    require_records("data reflection", train, eval_, skipped, (len(train_records), len(eval_records)))
    stats = write_dataset(train, eval_, out, skipped)
    for split, s in (("train", stats.train), ("eval", stats.eval)):
        skips = s.skipped
        typer.echo(
            f"{split}: {s.records} records, {s.users} users, {s.problems} problems, {s.with_enforcement} with "
            f"enforcement; skipped {skips['total']} (nothing to learn {skips['nothing_to_learn']}, unlabelled "
            f"{skips['unlabelled']}, teacher unparsed {skips['teacher_unparsed']})"
        )
    histogram = ", ".join(f"{pid} {n}" for pid, n in stats.train.enforced.items()) or "none"
    typer.echo(f"enforced in train: {histogram}")
    typer.echo(f"wrote {out}")


# `data reflection` stays hand-written: its stage `reflection_data` also plays the collab sessions itself (a
# `collab` section, user counts, `min_success`) and the command prints per-split statistics, not one JSON summary.
commands.install(data_app, "data", {"reflection": reflection})
