"""The one way a stage leaves `memrl run`'s process to train as several processes (or on one pinned GPU).

The spawned command runs `memrl.app.stage_main` (STAGE_ENTRY) on the run's resolved recipe, once per process;
each process runs the same stage kind, sees the launcher's WORLD_SIZE and trains in-process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl.app.context import RESOLVED_NAME, RunContext
from memrl.core.errors import MemrlError
from memrl.train import distributed
from memrl.train.hf_trainer import is_finished
from memrl.train.processes import format_command, run_logged

STAGE_ENTRY = "memrl.app.stage_main"
TRL_LOG = "trl.log"  # a spawned TRL stage's output, in its stage folder


def resolved_recipe(ctx: RunContext) -> Path:
    """What the launched processes read: the recipe `memrl run` wrote into the run folder."""
    return ctx.run_dir / RESOLVED_NAME


def shown(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The command as a shell takes it, with the variables the launch adds in front."""
    prefix = " ".join(f"{name}={value}" for name, value in (env or {}).items())
    return f"{prefix} {format_command(argv)}" if prefix else format_command(argv)


def spawn_stage(
    argv: Sequence[str], ctx: RunContext, name: str, *, launcher: str, log: str, env: Mapping[str, str] | None = None
) -> Path:
    """Run the launch (its output to the console and `log` in the stage folder); the stage's `final/` must exist
    after it. `${NAME}` references (multi-node rendezvous) are filled from this environment."""
    out = ctx.stage_dir(name)
    log_path = out / log
    full_env = dict(os.environ) | dict(env or {})
    name_shown = f"stage {name} ({launcher})"
    run_logged(distributed.resolve_refs(argv), log_path, name=name_shown, shown=shown(argv, env), env=full_env)
    if not is_finished(out):
        raise MemrlError(f"stage {name}: {launcher} finished but wrote no {out / 'final'}; see {log_path}")
    return out / "final"


def trl_stage_spawn(stage: Any, ctx: RunContext, name: str) -> distributed.Spawn | None:
    """How a TRL stage leaves this process (see `memrl.train.distributed.trl_spawn`), on the GPUs its placement
    plan leaves the trainer; None: it trains here."""
    from memrl.train.placement import stage_plan

    trainer_gpus = stage_plan(stage, None).trainer_gpus
    return distributed.trl_spawn(
        STAGE_ENTRY,
        resolved_recipe(ctx),
        name,
        stage.cluster,
        distributed.visible_gpus(),
        inside=distributed.is_rank(),
        trainer_gpus=trainer_gpus,
    )


def run_trl(stage: Any, ctx: RunContext, name: str, train: Callable[[], Path]) -> Path:
    """`train()` here (CPU, one GPU, or one rank of a spawned stage), else the stage spawned on this node's GPUs."""
    if (spawn := trl_stage_spawn(stage, ctx, name)) is None:
        return train()
    ctx.console.print(f"{name}: {spawn.launcher}")
    return spawn_stage(spawn.argv, ctx, name, launcher=spawn.launcher, log=TRL_LOG, env=spawn.env)


def plan_trl(stage: Any, ctx: RunContext, name: str, what: str, base: str) -> list[str]:
    """`what` in-process, or the command that spawns it; then the placement plan of the stage on a GPU node."""
    from memrl.train.placement import stage_plan

    placement = stage_plan(stage, base).text()
    if (spawn := trl_stage_spawn(stage, ctx, name)) is None:
        return [f"{what} in-process", placement]
    return [f"{what} under {spawn.launcher}", shown(spawn.argv, spawn.env), placement]
