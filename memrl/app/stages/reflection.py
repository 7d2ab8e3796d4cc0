"""The reflection pipeline's own stages: `reflection_data`, `export` and `eval_reflector` (training: training.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator
from rich.markup import escape

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind, on_the_cluster
from memrl.core.checkpoints import final_dir
from memrl.core.schema import StrictModel
from memrl.envs.collab.config import CollabEvalConfig
from memrl.rewards.config import RewardConfig
from memrl.rollout.config import SamplingConfig

# ---- reflection_data ----------------------------------------------------------------------------------------------


class ReflectionDataStage(StrictModel):
    """Collab sessions (train and eval users, disjoint) -> reflection datasets in every trainer's format."""

    kind: Literal["reflection_data"]
    collab: CollabEvalConfig = Field(
        default_factory=CollabEvalConfig, description="how sessions are generated; `users` and `split` are set here"
    )
    train_users: PositiveInt = 16
    eval_users: PositiveInt = 8
    gold: Literal["composed", "teacher"] = Field(
        default="composed", description="composed from the enforced preferences, or the run's own reflector"
    )
    train_sessions: list[Path] = Field(default_factory=list, description="use these sessions.jsonl, run nothing")
    eval_sessions: list[Path] = Field(default_factory=list)
    min_success: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="share of each split's sessions left to run that must finish, else the stage fails and writes "
        "no dataset (a rerun runs the failed ones again)",
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> ReflectionDataStage:
        if bool(self.train_sessions) != bool(self.eval_sessions):
            raise ValueError("give both `train_sessions` and `eval_sessions`, or neither")
        return self


def run_reflection_data(stage: ReflectionDataStage, ctx: RunContext, name: str) -> None:
    from memrl.data_gen.reflection import build_from_sessions, load_split, require_records, write_dataset

    out = ctx.stage_dir(name)
    if stage.train_sessions:  # as `memrl data reflection` reads them: a split with no session refused in one line
        train, evaluation = load_split(stage.train_sessions), load_split(stage.eval_sessions)
    else:
        train = _collab_sessions(stage, "train", stage.train_users, out / "collab-train", ctx, name)
        evaluation = _collab_sessions(stage, "eval", stage.eval_users, out / "collab-eval", ctx, name)
    train_records, eval_records, skipped = build_from_sessions(train, evaluation, stage.gold)
    require_records(name, train_records, eval_records, skipped, (len(train), len(evaluation)))
    stats = write_dataset(train_records, eval_records, out, skipped)
    ctx.console.print(f"{name}: {json.dumps(stats.to_dict()['train'])}")
    ctx.console.print(f"{name}: {len(train_records)} train / {len(eval_records)} eval reflection samples in {out}")


def _collab_sessions(
    stage: ReflectionDataStage, split: str, users: int, out: Path, ctx: RunContext, name: str
) -> list[dict]:
    """The split's finished sessions; fails (writing no dataset) when fewer than `min_success` of those run finished."""
    from memrl.envs.collab.runner import collab_run

    cfg = stage.collab.model_copy(update={"split": split, "users": users, "seed": ctx.recipe.seed})
    run = collab_run(cfg, out, ctx.console)
    then = f"no dataset written; a rerun runs them again ({out / 'failed.jsonl'})"
    run.check(f"{name} ({split} split)", stage.min_success, then)
    return run.records


def plan_reflection_data(stage: ReflectionDataStage, ctx: RunContext, name: str) -> list[str]:
    if stage.train_sessions:
        return [f"reflection data from {len(stage.train_sessions) + len(stage.eval_sessions)} sessions files"]
    return [f"collab sessions for {stage.train_users} train + {stage.eval_users} eval users"]


def reflection_data_job(stage: ReflectionDataStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    if stage.train_sessions:
        return Job()
    return on_the_cluster(raw["collab"], name)


REFLECTION_DATA = StageKind(ReflectionDataStage, run_reflection_data, plan_reflection_data, reflection_data_job)


# ---- export ---------------------------------------------------------------------------------------------------------


class ExportStage(StrictModel):
    """A checkpoint -> a standalone HF model folder (LoRA merged, tokenizer, model card)."""

    kind: Literal["export"]
    checkpoint: str = Field(description="a training stage of this recipe, or a checkpoint folder")


def run_export(stage: ExportStage, ctx: RunContext, name: str) -> None:
    from memrl.train.export import export_checkpoint

    source = ctx.artifact(stage.checkpoint)
    export_checkpoint(final_dir(source), ctx.stage_dir(name))
    ctx.console.print(f"{name}: exported {source} to {ctx.stage_dir(name)}")


def plan_export(stage: ExportStage, ctx: RunContext, name: str) -> list[str]:
    return [f"memrl export --checkpoint {ctx.artifact(stage.checkpoint)} --out {ctx.stage_dir(name)}"]


EXPORT = StageKind(ExportStage, run_export, plan_export, refs=("checkpoint",))


# ---- eval_reflector -------------------------------------------------------------------------------------------------


class OnlineCheck(StrictModel):
    """Plug each reflector into a collab evaluation and compare it with the first model listed."""

    collab: CollabEvalConfig = Field(default_factory=CollabEvalConfig)


class EvalReflectorStage(StrictModel):
    """Held-out reward of each model (base, SFT, GRPO, ...) on the eval split; writes the run's report.json."""

    kind: Literal["eval_reflector"]
    data: str = Field(description="a reflection_data stage of this recipe, or a dataset folder it wrote")
    models: dict[str, str] = Field(
        min_length=1, description="label -> a recipe model key, a stage of this recipe, or a model folder"
    )
    reward: RewardConfig = RewardConfig()
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=256)
    max_samples: PositiveInt | None = None
    batch_size: PositiveInt = Field(default=8, description="prompts per generation batch (transformers backend)")
    online: OnlineCheck | None = None
    outcome_users: PositiveInt | None = Field(
        default=None,
        description="with `reward.outcome`: held-out users whose next sessions are played (the first row of each); "
        "default: every user of the evaluated rows",
    )


def run_eval_reflector(stage: EvalReflectorStage, ctx: RunContext, name: str) -> None:
    from memrl.train.evaluate import evaluate_reflector, online_check
    from memrl.train.export import record_evaluation
    from memrl.train.report import write_report

    out, data = ctx.stage_dir(name), ctx.artifact(stage.data)
    models = {label: ctx.model_ref(ref) for label, ref in stage.models.items()}
    results: dict[str, Any] = {}
    for label, ref in models.items():
        metrics = evaluate_reflector(
            ref,
            data,
            out / label,
            stage.reward,
            stage.sampling.params(),
            ctx.console,
            max_samples=stage.max_samples,
            batch_size=stage.batch_size,
        )
        record_evaluation(Path(ref), f"{ctx.recipe.name}/{label}", metrics)
        results[label] = metrics
        ctx.console.print(f"{name}: {label}: " + json.dumps({k: metrics[k] for k in ("score", "coverage", "format")}))
    online = online_check(models, stage.online.collab, out / "online", ctx.console) if stage.online else None
    outcome = None
    if stage.reward.outcome is not None:  # the notes in the users' next sessions, calibrated, on the same rows
        from memrl.train.rewards.next_session_eval import outcome_report

        ctx.console.print(f"{name}: next sessions with oracle, empty, wrong and each model's notes")
        outcome = outcome_report(
            stage.reward.outcome, data, out, list(models), stage.reward.plain_text_notes, users=stage.outcome_users
        )
        _print_outcome(outcome, ctx, name)
    report = write_report(ctx.run_dir, results, online, _grpo_logs(ctx), outcome)
    ctx.console.print(f"{name}: report {report}")


def _print_outcome(outcome: dict[str, Any], ctx: RunContext, name: str) -> None:
    calibration = {k: v for k, v in outcome["calibration"].items() if k != "ci95"}
    ctx.console.print(f"{name}: outcome calibration ({outcome['n']} users): {json.dumps(calibration)}")
    ctx.console.print(
        f"{name}: outcome pass rate: {json.dumps(outcome['pass_rate'])}, ci95 {json.dumps(outcome['ci95'])}"
    )
    style = "green" if outcome["calibration"]["can_rank"] else "yellow"
    ctx.console.print(f"{name}: [{style}]{escape(outcome['verdict'])}[/{style}] ({outcome['seconds']} s)")


def _grpo_logs(ctx: RunContext) -> dict[str, Path]:
    logs = {n: ctx.stage_dir(n) / "log_history.json" for n, s in ctx.recipe.stages.items() if s.kind == "grpo"}
    return {n: p for n, p in logs.items() if p.is_file()}


def plan_eval_reflector(stage: EvalReflectorStage, ctx: RunContext, name: str) -> list[str]:
    out, data = ctx.stage_dir(name), ctx.artifact(stage.data)
    lines = [
        f"memrl eval reflector --model {ctx.model_ref(ref)} --data {data} --out {out / label}"
        for label, ref in stage.models.items()
    ]
    if (outcome := stage.reward.outcome) is not None:
        users = "every held-out user" if stage.outcome_users is None else f"{stage.outcome_users} held-out users"
        lines.append(
            f"next sessions of {users} ({outcome.agent.model} reads the notes, max_turns {outcome.max_turns}): "
            "oracle, empty and wrong notes, then each model's -> report.json `outcome`"
        )
    return lines


def eval_reflector_job(stage: EvalReflectorStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    if not raw.get("online"):
        return Job()
    return on_the_cluster(raw["online"]["collab"], name)


EVAL_REFLECTOR = StageKind(
    EvalReflectorStage, run_eval_reflector, plan_eval_reflector, eval_reflector_job, refs=("data",)
)
