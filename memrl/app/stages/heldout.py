"""`collab_heldout`: base vs trained collab policy on held-out users and problems (the work: memrl.train.heldout).

The stage names the collab_grpo stage whose split, env and budget are played and the two policies; it resolves them
from the run and prints what the report says.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, PositiveInt

from memrl.app.context import RunContext
from memrl.app.stages.base import StageKind
from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.collab.config import CollabEvalConfig
from memrl.train.heldout import METRICS, PLOT_FILE, REPORT_KEY, heldout_config
from memrl.train.online.config import OnlineGRPOStage


class CollabHeldoutStage(StrictModel):
    """Base vs trained policy, greedy, on held-out collab users and problems; writes `report.json`'s `heldout`."""

    kind: Literal["collab_heldout"]
    train: str = Field(description="the collab_grpo stage of this recipe: its held-out side, env and budget are played")
    trained: str = Field(description="the trained policy: an export stage of this recipe, a checkpoint or model folder")
    base: str | None = Field(default=None, description="the base policy; default: the training stage's `model`")
    users: PositiveInt = Field(default=8, description="held-out users (the eval half of the training split)")
    sessions: PositiveInt = Field(default=1, description="held-out sessions per user")
    workers: PositiveInt | None = Field(default=None, description="Ray actors of each evaluation; default: as eval")
    resamples: PositiveInt = Field(default=2000, description="bootstrap resamples of the paired differences")


def _training(stage: CollabHeldoutStage, ctx: RunContext, name: str) -> OnlineGRPOStage:
    found = ctx.needs.get(stage.train)
    if not isinstance(found, OnlineGRPOStage) or found.world != "collab":
        raise ConfigError(f"stage {name}: train={stage.train!r} must name a collab_grpo stage of this recipe")
    return found


def _config(stage: CollabHeldoutStage, training: OnlineGRPOStage) -> CollabEvalConfig:
    return heldout_config(training, users=stage.users, sessions=stage.sessions, workers=stage.workers)


def _models(stage: CollabHeldoutStage, training: OnlineGRPOStage, ctx: RunContext) -> dict[str, str]:
    return {"base": ctx.model_ref(stage.base or training.model), "trained": ctx.model_ref(stage.trained)}


def run(stage: CollabHeldoutStage, ctx: RunContext, name: str) -> None:
    from memrl.train.heldout import check_held_out, play, write_heldout

    training = _training(stage, ctx, name)
    cfg = _config(stage, training)
    check_held_out(cfg)
    models = _models(stage, training, ctx)
    policy = ctx.models.get(training.model)
    records = play(cfg, models, policy, ctx.stage_dir(name), ctx.console, name)
    report, path, plot = write_heldout(
        records, models, ctx.run_dir, run=ctx.name, seed=ctx.seed, resamples=stage.resamples
    )
    shown = {m: [report["delta"][m], report["ci95"][m]] for m in METRICS}
    ctx.console.print(f"{name}: trained - base (delta, ci95): {json.dumps(shown)}", highlight=False, markup=False)
    ctx.console.print(f"{name}: {path} ({REPORT_KEY}), {plot}")


def dry_run(stage: CollabHeldoutStage, ctx: RunContext, name: str) -> list[str]:
    training = _training(stage, ctx, name)
    cfg = _config(stage, training)
    return [
        f"memrl eval collab --split eval --agent {cfg.agent} --model {ref} --users {cfg.users} --sessions "
        f"{cfg.sessions} --max-turns {cfg.max_turns} (greedy, {training.max_turn_tokens} tokens a reply) --out "
        f"{ctx.stage_dir(name) / label}"
        for label, ref in _models(stage, training, ctx).items()
    ] + [f"paired bootstrap of trained - base -> {ctx.run_dir / 'report.json'} ({REPORT_KEY}), {PLOT_FILE}"]


COLLAB_HELDOUT = StageKind(CollabHeldoutStage, run, dry_run, refs=("train", "trained"), needs=("train",))
