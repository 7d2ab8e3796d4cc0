"""The reflection pipeline's own stages: `reflection_data`, `export` and `eval_reflector` (training: training.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from rich.markup import escape

from memrl.app.context import RunContext
from memrl.app.stages.base import Job, StageKind, on_the_cluster
from memrl.core.checkpoints import final_dir
from memrl.core.errors import ConfigError
from memrl.core.files import read_jsonl
from memrl.data_gen.config import ReflectionDataConfig
from memrl.train.evaluate import EvalReflectorConfig
from memrl.train.export import ExportConfig

# ---- reflection_data ----------------------------------------------------------------------------------------------


class ReflectionDataStage(ReflectionDataConfig):
    kind: Literal["reflection_data"]


def run_reflection_data(stage: ReflectionDataStage, ctx: RunContext, name: str) -> None:
    from memrl.data_gen.reflection import build_reflection_data

    out = ctx.stage_dir(name)
    stats, n_train, n_eval = build_reflection_data(stage, out, ctx.console, ctx.seed, name)
    ctx.console.print(f"{name}: {json.dumps(stats.to_dict()['train'])}")
    ctx.console.print(f"{name}: {n_train} train / {n_eval} eval reflection samples in {out}")


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


class ExportStage(ExportConfig):
    kind: Literal["export"]


def run_export(stage: ExportStage, ctx: RunContext, name: str) -> None:
    from memrl.train.export import export_checkpoint

    source = ctx.artifact(stage.checkpoint)
    export_checkpoint(final_dir(source), ctx.stage_dir(name))
    ctx.console.print(f"{name}: exported {source} to {ctx.stage_dir(name)}")


def plan_export(stage: ExportStage, ctx: RunContext, name: str) -> list[str]:
    return [f"memrl export --checkpoint {ctx.artifact(stage.checkpoint)} --out {ctx.stage_dir(name)}"]


EXPORT = StageKind(ExportStage, run_export, plan_export, refs=("checkpoint",))


# ---- eval_reflector -------------------------------------------------------------------------------------------------


class EvalReflectorStage(EvalReflectorConfig):
    kind: Literal["eval_reflector"]


def run_eval_reflector(stage: EvalReflectorStage, ctx: RunContext, name: str) -> None:
    from memrl.train.evaluate import evaluate_reflector, online_check
    from memrl.train.export import record_evaluation
    from memrl.train.report import write_report
    from memrl.train.report_html import write_html

    out, data = ctx.stage_dir(name), ctx.artifact(stage.data)
    models = {label: ctx.model_ref(ref) for label, ref in stage.models.items()}
    sampling = stage.sampling.params()
    results: dict[str, Any] = {}
    for label, ref in models.items():
        metrics = evaluate_reflector(
            ref,
            data,
            out / label,
            stage.reward,
            sampling,
            ctx.console,
            max_samples=stage.max_samples,
            batch_size=stage.batch_size,
            draws=stage.draws_of(label),
        )
        record_evaluation(Path(ref), f"{ctx.name}/{label}", metrics)
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
    decoding = sampling.decoding + stage.draws_said()
    report = write_report(ctx.run_dir, results, online, _grpo_logs(ctx), outcome, out, seed=ctx.seed, decoding=decoding)
    sections = json.loads(report.read_text())
    _print_verdict(sections, ctx, name)
    page = write_html(ctx.run_dir, sections, out, _data_rows(data), title=f"memrl run {ctx.name}")
    ctx.console.print(f"{name}: report {report}, {page}")


def _data_rows(data: Path) -> dict[str, dict[str, Any]]:
    """The eval split's reflection records by key (what each held-out user said and which notes were expected)."""
    path = data / "eval.jsonl" if data.is_dir() else data.parent.parent / "eval.jsonl"
    return {str(r["key"]): r for r in read_jsonl(path, ConfigError)} if path.is_file() else {}


def _print_verdict(report: dict[str, Any], ctx: RunContext, name: str) -> None:
    """What the held-out numbers support, in the words the README uses: the learning verdict, the curve's slope,
    and the reward-hacking flag."""
    scores = {
        label: f"{r['intervals']['score']['mean']} {r['intervals']['score']['ci95']}"
        for label, r in report["held_out"].items()
        if r.get("intervals", {}).get("score", {}).get("ci95")
    }
    if scores:
        ctx.console.print(f"{name}: held-out judge score [95%]: " + ", ".join(f"{k} {v}" for k, v in scores.items()))
    if learning := report.get("learning"):
        shown = "[green]learning shown[/green]" if learning["verdict"] else "[yellow]learning not shown[/yellow]"
        ctx.console.print(
            f"{name}: {shown}: {learning['compared']} = {learning['delta']} {learning['ci95']} "
            f"over {learning['n']} held-out sessions (paired bootstrap 95%; shown only when the interval is above 0)"
        )
        if not learning["verdict"] and learning.get("detectable") is not None:
            ctx.console.print(
                f"{name}: over {learning['n']} sessions as spread as these, a true gain shows 4 times in 5 only from "
                f"{learning['detectable']} up; a smaller one needs more held-out sessions or the seeds table "
                "(benchmarks/learn.py)"
            )
    if curve := report.get("curve"):
        rising = "[green]rising[/green]" if curve["rising"] else "[yellow]not rising[/yellow]"
        ctx.console.print(
            f"{name}: {curve['stage']} reward curve {rising}: slope {curve['slope']:+.5f}/step {curve['ci95']} "
            f"over {curve['steps']} steps"
        )
        if within := curve.get("within_prompt"):
            rising = "[green]rising[/green]" if within["rising"] else "[yellow]not rising[/yellow]"
            ctx.console.print(
                f"{name}: {curve['stage']} reward within a prompt {rising}: slope {within['slope']:+.5f}/step "
                f"{within['ci95']} over {within['prompts']} prompts trained at more than one step"
            )
    if (hacking := report.get("reward_hacking")) is not None and hacking["flagged"]:
        ctx.console.print(
            f"{name}: [red]reward hacking flagged[/red] ({hacking['compared']}): the score rose while "
            + "; ".join(hacking["signs"])
        )


def _print_outcome(outcome: dict[str, Any], ctx: RunContext, name: str) -> None:
    calibration = {k: v for k, v in outcome["calibration"].items() if k != "ci95"}
    ctx.console.print(
        f"{name}: outcome calibration ({outcome['n']} users, {outcome['reader']} reads the notes): "
        f"{json.dumps(calibration)}"
    )
    ctx.console.print(
        f"{name}: outcome pass rate: {json.dumps(outcome['pass_rate'])}, ci95 {json.dumps(outcome['ci95'])}"
    )
    style = "green" if outcome["calibration"]["can_rank"] else "yellow"
    ctx.console.print(f"{name}: [{style}]{escape(outcome['verdict'])}[/{style}] ({outcome['seconds']} s)")


def _grpo_logs(ctx: RunContext) -> dict[str, Path]:
    logs = {n: ctx.stage_dir(n) / "log_history.json" for n, kind in ctx.stages.items() if kind == "grpo"}
    return {n: p for n, p in logs.items() if p.is_file()}


def plan_eval_reflector(stage: EvalReflectorStage, ctx: RunContext, name: str) -> list[str]:
    out, data = ctx.stage_dir(name), ctx.artifact(stage.data)
    lines = [
        f"memrl eval reflector --model {ctx.model_ref(ref)} --data {data} --out {out / label}"
        + _eval_flags(stage, label)
        for label, ref in stage.models.items()
    ]
    if (outcome := stage.reward.outcome) is not None:
        users = "every held-out user" if stage.outcome_users is None else f"{stage.outcome_users} held-out users"
        lines.append(
            f"next sessions of {users} ({outcome.reader} reads the notes, max_turns {outcome.max_turns}): "
            "oracle, empty and wrong notes, then each model's -> report.json `outcome`"
        )
    return lines


def _eval_flags(stage: EvalReflectorStage, label: str) -> str:
    """The `memrl eval reflector` flags that draw the notes as the stage draws them for `label` (defaults left out)."""
    sampling, draws, judge = stage.sampling, stage.draws_of(label), stage.reward.judge
    llm = judge.model if judge.kind == "llm" else None  # the CLI's `--judge llm` alone would judge with SmolLM2
    flags = {
        "--judge": judge.kind if llm else None,
        "--endpoint": getattr(llm, "endpoint", None),
        "--judge-model": llm.model if llm else None,
        "--max-tokens": sampling.max_tokens,
        "--temperature": f"{sampling.temperature:g}" if sampling.temperature else None,
        "--top-p": f"{sampling.top_p:g}" if sampling.top_p != 1 else None,
        "--seed": sampling.seed,
        "--draws": draws if draws > 1 else None,
        "--batch-size": stage.batch_size,
        "--max-samples": stage.max_samples,
    }
    return "".join(f" {flag} {value}" for flag, value in flags.items() if value is not None)


def eval_reflector_job(stage: EvalReflectorStage, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    if not raw.get("online"):
        return Job()
    return on_the_cluster(raw["online"]["collab"], name)


EVAL_REFLECTOR = StageKind(
    EvalReflectorStage, run_eval_reflector, plan_eval_reflector, eval_reflector_job, refs=("data",)
)
