"""`memrl data ...`: build training datasets from environment runs. Heavy imports stay inside the commands."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

data_app = typer.Typer(help="Build training datasets from environment runs.", no_args_is_help=True)


class Gold(StrEnum):
    COMPOSED = "composed"
    TEACHER = "teacher"


@data_app.callback()
def _data() -> None:
    """Keep `reflection` a subcommand even while it is the only one."""


@data_app.command("reflection")
def reflection(
    train_sessions: Annotated[
        list[Path], typer.Option("--train-sessions", help="sessions.jsonl of a collab run on train users (repeatable)")
    ],
    eval_sessions: Annotated[
        list[Path], typer.Option("--eval-sessions", help="sessions.jsonl of a collab run on eval users (repeatable)")
    ],
    out: Annotated[Path, typer.Option("--out", help="output folder (train/eval JSONL, sft/, rl/, llamafactory/)")],
    gold: Annotated[
        Gold, typer.Option("--gold", help="composed: from the rule user's labels; teacher: the run's own reflector")
    ] = Gold.COMPOSED,
) -> None:
    """Reflection SFT/RL data from collab sessions; train and eval must share no user and no problem."""
    from memrl.core.errors import ConfigError
    from memrl.data_gen.reflection import build_from_sessions, load_sessions, write_dataset

    train_records = [s for path in train_sessions for s in load_sessions(path)]
    eval_records = [s for path in eval_sessions for s in load_sessions(path)]
    if not train_records:
        raise ConfigError(f"no session records in {', '.join(map(str, train_sessions))}")
    train, eval_, skipped = build_from_sessions(train_records, eval_records, gold.value)
    if not train:
        why = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in skipped.train.to_dict().items() if v and k != "total")
        raise ConfigError(f"no training records: all {len(train_records)} train sessions were skipped ({why})")
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


class MemoryKind(StrEnum):
    TEMPLATE = "template"
    LLM = "llm"


@data_app.command("tod")
def tod(
    sgd_dir: Annotated[
        Path, typer.Option("--sgd-dir", help="SGD folder: schema.json + dialogues_*.json, or train/dev/test of them")
    ],
    individuals: Annotated[int, typer.Option("--individuals", min=1, help="individuals (users) to generate")],
    out: Annotated[Path, typer.Option("--out", help="output folder (persona_<id>.json, memory/, schema.json)")],
    tasks_per_individual: Annotated[int, typer.Option("--tasks-per-individual", min=1, help="goals per person")] = 6,
    writer: Annotated[
        str, typer.Option("--writer", help="template, or a model: NAME (local) or NAME@URL (OpenAI-compatible)")
    ] = "template",
    memory: Annotated[
        MemoryKind, typer.Option("--memory", help="memory units from templates, or from the writer's model")
    ] = MemoryKind.TEMPLATE,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """MS-TOD individuals from SGD goals, with memory banks; a rerun with the same settings resumes."""
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):  # transformers may print on import; stdout is the summary only
        from memrl.data_gen.tod import TodDataConfig, build_tod_dataset, summary_line

        cfg = TodDataConfig(str(sgd_dir), individuals, tasks_per_individual, writer, memory.value, seed)
        stats, gen = build_tod_dataset(cfg, out)
    typer.echo(summary_line(stats, gen))


@data_app.command("judger")
def judger(
    tod_dir: Annotated[Path, typer.Option("--tod-dir", help="MS-TOD folder (persona_<id>.json, memory/, schema.json)")],
    out: Annotated[Path, typer.Option("--out", help="output folder: train/pairs.jsonl, eval/pairs.jsonl, stats.json")],
    eval_individuals: Annotated[
        int | None, typer.Option("--eval-individuals", help="individuals held out for eval")
    ] = None,
    eval_fraction: Annotated[
        float | None, typer.Option("--eval-fraction", help="share of individuals held out (default 0.2)")
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    schema: Annotated[
        Path | None, typer.Option("--schema", help="SGD schema.json; default: TOD_DIR/schema.json")
    ] = None,
) -> None:
    """Judger (query, memory QA pair) rows labelled by relevance; prints both splits' sizes and class balance."""
    import contextlib
    import json
    import sys

    from memrl.core.errors import ConfigError

    if eval_individuals is not None and eval_fraction is not None:
        raise ConfigError("pass --eval-individuals or --eval-fraction, not both")
    with contextlib.redirect_stdout(sys.stderr):
        from memrl.data_gen.judger import build_judger_dataset

        stats = build_judger_dataset(tod_dir, out, eval_individuals, eval_fraction, seed, schema)
    keys = ("rows", "queries", "individuals", "positives", "negatives", "positive_rate", "negatives_by_kind")
    typer.echo(json.dumps({split: {k: stats[split][k] for k in keys} for split in ("train", "eval")}))


@data_app.command("pahf")
def pahf(
    run: Annotated[Path, typer.Option("--run", help="output folder of `memrl eval pahf --domain shopping`")],
    out: Annotated[Path, typer.Option("--out", help="output folder: train/eval JSONL, sft/, kto/, stats.json")],
    eval_users: Annotated[int, typer.Option("--eval-users", min=0, help="users held out for eval (last by name)")] = 1,
) -> None:
    """Memory-writer data: (feedback context -> note) records rewarded by the next decision each note informed."""
    import json

    from memrl.data_gen.pahf import build_pahf_dataset

    stats = build_pahf_dataset(run, out, eval_users)
    typer.echo(json.dumps(stats))
