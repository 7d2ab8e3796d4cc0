"""The stage kind of an action (what `memrl eval collab|tod|pahf|judger` and `memrl data tod|judger|pahf` do): the
stage's schema is the action's config plus `kind` (named by `actions.kind_of`), so every flag of the command is a key
of the stage, and the action stays on the kind as its CLI face."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, create_model

from memrl.app.actions import Action
from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind, as_is, on_the_cluster


def _config(action: Action[Any], stage: BaseModel, ctx: RunContext) -> Any:
    """The action's config from the stage: earlier stages named by their output folder, the run's `data` and seed
    unless the stage sets its own."""
    values = stage.model_dump(exclude={"kind"})
    if "data" in action.refs and values.get("data") is None and ctx.data is not None:
        values["data"] = ctx.data  # what `memrl run R data=DIR` is for
    for key in action.refs:
        if values.get(key) is not None and str(values[key]) in ctx.stages:
            values[key] = ctx.stage_dir(str(values[key]))
    if "seed" in values and "seed" not in stage.model_fields_set:
        values["seed"] = ctx.seed
    return action.config.model_validate(values)


def action_stage(action: Action[Any]) -> StageKind[Any]:
    kind = action.kind
    schema = create_model(
        "".join(part.title() for part in kind.split("_")) + "Stage",
        __base__=action.config,
        __doc__=action.help,
        kind=(Literal[kind], ...),
    )

    def run(stage: Any, ctx: RunContext, name: str) -> None:
        summary = action.run(_config(action, stage, ctx), ctx.stage_dir(name), ctx.console)
        ctx.console.print(f"{name}: {json.dumps(summary)}", highlight=False, markup=False, soft_wrap=True)

    def dry_run(stage: Any, ctx: RunContext, name: str) -> list[str]:
        cfg = _config(action, stage, ctx)
        dumped = cfg.model_dump(mode="json").items()
        given = {k: v for k, v in dumped if v is not None and (k in stage.model_fields_set or k in action.refs)}
        shown = " ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in given.items())
        return [f"memrl {action.command} --out {ctx.stage_dir(name)} ({shown})" if shown else f"memrl {action.command}"]

    def job(stage: Any, raw: dict[str, Any], name: str, dashboard: str) -> Job:
        return (
            on_the_cluster(raw, name)
            if "ray_address" in action.config.model_fields
            else as_is(stage, raw, name, dashboard)
        )

    return StageKind(schema, run, dry_run, job, refs=action.refs, action=action)
