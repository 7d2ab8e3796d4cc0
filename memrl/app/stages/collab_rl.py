"""`collab_grpo`: the agent trained by multi-turn GRPO inside the collab environment (memrl.train.online).

`trainer: trl` trains in-process on one node; `trainer: verl` writes the sessions as verl agent-loop data and runs
verl's PPO trainer with the `memrl_collab` agent loop, a command built, checked against verl's config and run the
same way as the reflector's verl GRPO (`--dry-run` prints it).
"""

from __future__ import annotations

import os
from typing import Any

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind
from memrl.app.stages.relaunch import plan_trl, run_trl
from memrl.app.stages.training import (
    placement_lines,
    run_verl,
    shown,
    train_context,
    verl_logger,
    verl_start,
)
from memrl.core.checkpoints import portable_ref
from memrl.train.backends import CURVES_FILE, VerlCommand
from memrl.train.online.config import CollabGRPOStage
from memrl.train.placement import trainer_cluster, trainer_env
from memrl.train.trl_common import is_finished, resume_point

PARTS_CURVES_FILE = "reward_parts.png"


def _start(stage: CollabGRPOStage, ctx: RunContext) -> CollabGRPOStage:
    return stage.model_copy(update={"init": ctx.model_ref(stage.init)}) if stage.init else stage


def _settings(stage: CollabGRPOStage) -> Any:
    from memrl.train.online.verl_overrides import loop_settings

    return loop_settings(stage)


def verl_command(stage: CollabGRPOStage, ctx: RunContext, name: str, *, dry_run: bool) -> VerlCommand:
    """The verl command the stage runs (or, with `dry_run`, would run), checked against verl's config."""
    from memrl.rewards.config import UnscoredStop
    from memrl.train import verl_launch as vl
    from memrl.train.online.verl_overrides import collab_overrides, user_endpoints

    stage = _start(stage, ctx)
    model_path, adapter = verl_start(stage.init or ctx.model_ref(stage.model), ctx, dry_run)
    overrides = collab_overrides(
        stage,
        model_path=model_path,
        out_dir=ctx.stage_dir(name),
        experiment=f"{ctx.recipe.name}-{name}",
        project=ctx.recipe.logging.project,
        logger=verl_logger(ctx),
        lora_adapter_path=adapter,
        seed=ctx.recipe.seed,
    )
    vl.validate_overrides(vl.PPO_CONFIG, overrides)  # a bad key fails here, on CPU, before any GPU job
    users = user_endpoints(stage)
    vl.refuse_local_endpoints(users, stage.cluster)
    # the LLM user's key (never on the command line) and the unscored stop: verl_main hands them to every worker
    env = dict(os.environ) | _settings(stage).user_key() | vl.unscored_job_env(UnscoredStop(), users)
    env |= trainer_env(stage)  # the trainer's GPUs only: served models keep the others (train/placement.py)
    return VerlCommand(vl.verl_command("grpo", overrides, trainer_cluster(stage), environ=env), env, model_path)


def _run_trl(stage: CollabGRPOStage, ctx: RunContext, name: str) -> None:
    from memrl.train.online.trl_collab import train_collab_grpo

    out = ctx.stage_dir(name)
    if (point := resume_point(out)) is not None:
        ctx.console.print(f"{name}: resuming from {point} (same seed, same data order)")
    start, base = _start(stage, ctx), ctx.model_ref(stage.model)
    final = run_trl(stage.cluster, ctx, name, lambda: train_collab_grpo(start, base, train_context(ctx, name)))
    ctx.console.print(f"{name}: checkpoint {final}; reward parts per step in {out / CURVES_FILE}")


def _run_verl_stage(stage: CollabGRPOStage, ctx: RunContext, name: str) -> None:
    from memrl.train.online.episodes import episode_rows
    from memrl.train.online.trl_collab import outcome_chart
    from memrl.train.online.verl_data import EVAL_FILE, TRAIN_FILE, agent_rows, write_rows
    from memrl.train.online.verl_overrides import DATA_SUBDIR, ROLLOUTS_SUBDIR
    from memrl.train.online.verl_rollouts import rollout_history

    out = ctx.stage_dir(name)
    rows = agent_rows(episode_rows(stage.env), _settings(stage))  # a bad task or problem file fails here
    # verl validates (greedily) on the training sessions; held-out users are `memrl eval collab`'s.
    for file in (TRAIN_FILE, EVAL_FILE):
        write_rows(rows, out / DATA_SUBDIR / file)
    command = verl_command(stage, ctx, name, dry_run=False)
    alpha = stage.lora.alpha if stage.lora is not None else None
    try:
        run_verl(command, ctx, name, base=portable_ref(command.model_path), trainer="verl-collab-grpo", alpha=alpha)
    finally:  # the parts of a failed run are worth seeing too
        title = f"{ctx.recipe.name}: {name} reward parts (verl)"
        outcome_chart(rollout_history(out / ROLLOUTS_SUBDIR), out / PARTS_CURVES_FILE, title)
    ctx.console.print(f"{name}: checkpoint {out / 'final'}; reward parts per step in {out / PARTS_CURVES_FILE}")


def run(stage: CollabGRPOStage, ctx: RunContext, name: str) -> None:
    out = ctx.stage_dir(name)
    if is_finished(out):
        ctx.console.print(f"{name}: already finished ({out / 'final'}); delete it to retrain")
        return
    from memrl.rollout.probe import require_reachable
    from memrl.train.endpoints import stage_endpoints

    require_reachable(stage_endpoints(stage))  # the user model must answer before the first episode is played
    (_run_verl_stage if stage.trainer == "verl" else _run_trl)(stage, ctx, name)


def dry_run(stage: CollabGRPOStage, ctx: RunContext, name: str) -> list[str]:
    env, start = stage.env, _start(stage, ctx).init or ctx.model_ref(stage.model)
    sessions = (
        f"{stage.rollouts} episodes per session with a {env.simulator} user on {env.task} ({env.users} train users x "
        f"{env.sessions} sessions, up to {env.max_turns} replies)"
    )
    if stage.trainer == "trl":
        return plan_trl(stage.cluster, ctx, name, f"TRL GRPOTrainer from {start}: {sessions}")
    data = ctx.stage_dir(name) / "data"
    return [
        f"verl agent loop memrl_collab from {start}: {sessions}; sessions written to {data}",
        *shown(verl_command(stage, ctx, name, dry_run=True).argv),
        *placement_lines(stage, ctx.model_ref(stage.model)),
    ]


def job(stage: CollabGRPOStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    """Inside a Ray job, verl joins the job's cluster instead of starting its own Ray (as the reflector's GRPO)."""
    if stage.trainer != "verl":
        return Job()
    raw.setdefault("cluster", {})["ray_address"] = None
    raw["overrides"] = [*raw.get("overrides", []), "+ray_kwargs.ray_init.address=auto"]
    return Job()


COLLAB_GRPO = StageKind(CollabGRPOStage, run, dry_run, job, refs=("init",))
