"""`collab_grpo`: the agent trained by multi-turn GRPO inside the collab environment (memrl.train.online).

`trainer: trl` trains in-process on one node; `trainer: verl` writes the sessions as verl agent-loop data and runs
verl's PPO trainer with the `memrl_collab` agent loop, a command built, checked against verl's config and run the
same way as the reflector's verl GRPO (`--dry-run` prints it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind
from memrl.app.stages.training import (
    Trainer,
    already_finished,
    backend,
    planner,
    stage_run,
    train,
    trl_entry,
    with_init,
)
from memrl.train.online.config import CollabGRPOStage
from memrl.train.placement import trainer_cluster
from memrl.train.trl import backend as trl_backend
from memrl.train.verl import backend as verl

TRAINERS: dict[str, Trainer[CollabGRPOStage]] = {
    "trl": trl_entry(trl_backend.COLLAB_GRPO),
    "verl": backend(verl.run_collab, verl.describe_collab),
}


def _data(stage: CollabGRPOStage, ctx: RunContext, name: str) -> Path:
    """verl's agent-loop data, written from the sessions into the stage folder (TRL plays them directly)."""
    from memrl.train.verl.collab_overrides import DATA_SUBDIR

    return ctx.stage_dir(name) / DATA_SUBDIR


def verl_command(stage: CollabGRPOStage, ctx: RunContext, name: str, *, dry_run: bool) -> verl.VerlCommand:
    """The verl command the stage runs (or, with `dry_run`, would run), checked against verl's config."""
    stage = with_init(stage, ctx)
    return verl.collab_command(
        stage, stage_run(ctx, name), ctx.model_ref(stage.model), _data(stage, ctx, name), dry_run
    )


def run(stage: CollabGRPOStage, ctx: RunContext, name: str) -> None:
    if already_finished(ctx, name):
        return
    from memrl.rollout.probe import require_reachable
    from memrl.train.endpoints import stage_endpoints

    require_reachable(stage_endpoints(stage))  # the user model must answer before the first episode is played
    train(TRAINERS, stage, ctx, name, _data(stage, ctx, name))


def job(stage: CollabGRPOStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    """Inside a Ray job, verl joins the job's cluster instead of starting its own Ray (as the reflector's GRPO); TRL
    trains in the job's own processes, on GPUs where the cluster has some."""
    if stage.trainer == "verl":
        verl.join_job_cluster(raw)
        return Job()
    return Job(gpus_if_any=trainer_cluster(stage).gpus_per_node)


COLLAB_GRPO = StageKind(CollabGRPOStage, run, planner(TRAINERS, _data), job, refs=("init",))
