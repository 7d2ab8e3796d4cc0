"""`<world>_grpo` (`collab_grpo`, `tod_grpo`): the policy trained by multi-turn GRPO inside a world
(memrl.train.online), one stage kind per world the registry trains online (memrl.envs.registry).

`trainer: trl` trains in-process on one node; `trainer: verl` writes the sessions as verl agent-loop data and runs
verl's PPO trainer with the world's agent loop (`memrl_<world>`), a command built, checked against verl's config and
run the same way as the reflector's verl GRPO (`--dry-run` prints it).
"""

from __future__ import annotations

from pathlib import Path

from memrl.app.context import RunContext
from memrl.app.stages.base import StageKind
from memrl.app.stages.training import already_finished, job, planner, stage_run, train, with_init
from memrl.train.online.config import STAGES, OnlineGRPOStage
from memrl.train.verl import backend as verl


def _data(stage: OnlineGRPOStage, ctx: RunContext, name: str) -> Path:
    """verl's agent-loop data, written from the sessions into the stage folder (TRL plays them directly)."""
    from memrl.train.verl.online_overrides import DATA_SUBDIR

    return ctx.stage_dir(name) / DATA_SUBDIR


def with_env_refs(stage: OnlineGRPOStage, ctx: RunContext) -> OnlineGRPOStage:
    """The stage with the `env` paths that name an earlier stage (`env.data: mstod`) resolved to its folder."""
    names = {key: str(getattr(stage.env, key)) for key in stage.env.refs if getattr(stage.env, key) is not None}
    found = {key: ctx.stage_dir(ref) for key, ref in names.items() if ref in ctx.stages}
    return stage.model_copy(update={"env": stage.env.model_copy(update=found)}) if found else stage


def verl_command(stage: OnlineGRPOStage, ctx: RunContext, name: str, *, dry_run: bool) -> verl.VerlCommand:
    """The verl command the stage runs (or, with `dry_run`, would run), checked against verl's config."""
    stage = with_env_refs(with_init(stage, ctx), ctx)
    return verl.online_command(
        stage, stage_run(ctx, name), ctx.model_ref(stage.model), _data(stage, ctx, name), dry_run
    )


def run(stage: OnlineGRPOStage, ctx: RunContext, name: str) -> None:
    if already_finished(ctx, name):
        return
    from memrl.train.endpoints import require_reachable, stage_endpoints

    require_reachable(stage_endpoints(stage))  # the user model must answer before the first episode is played
    train(with_env_refs(stage, ctx), ctx, name, _data(stage, ctx, name))


def dry_run(stage: OnlineGRPOStage, ctx: RunContext, name: str) -> list[str]:
    return planner(_data)(with_env_refs(stage, ctx), ctx, name)


def online_kind(world: str) -> StageKind[OnlineGRPOStage]:
    """World `world`'s stage kind: `init` and the paths of its `env` that may name an earlier stage."""
    schema = STAGES[world]
    env_refs = tuple(f"env.{key}" for key in schema.model_fields["env"].annotation.refs)  # type: ignore[union-attr]
    return StageKind(schema, run, dry_run, job, refs=("init", *env_refs))


ONLINE_KINDS = tuple(online_kind(world) for world in STAGES)
