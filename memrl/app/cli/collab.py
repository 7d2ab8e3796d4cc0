"""`memrl collab ...` (taxonomy, checkers, run comparison) and `memrl eval collab`. Heavy imports stay inside."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from memrl.core.errors import ConfigError

collab_app = typer.Typer(help="MultiSessionCollab: preferences, checkers, comparisons.", no_args_is_help=True)
console = Console(stderr=True)


@collab_app.command("preferences")
def preferences(as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False) -> None:
    """The 20 interaction preferences: id, category, and whether a checker or only a judge can decide them."""
    from memrl.core.preferences import TAXONOMY

    if as_json:
        for p in TAXONOMY.values():
            row = {"id": p.id, "category": p.category.value, "checkable": p.checkable, "opposite": p.opposite}
            typer.echo(json.dumps(row | {"description": p.description, "enforce_when": p.enforce_when}))
        return
    table = Table("id", "category", "decided by", "opposite", "description")
    for p in TAXONOMY.values():
        table.add_row(
            p.id, p.category.value, "checker" if p.checkable else "judge-only", p.opposite or "", p.description
        )
    Console(width=200).print(table)


@collab_app.command("check")
def check(
    preference: Annotated[str, typer.Option("--preference", help="preference id (see `memrl collab preferences`)")],
    response_file: Annotated[Path, typer.Option("--response-file", help="text file with the agent's response")],
    winding_down: Annotated[bool, typer.Option("--winding-down", help="the conversation is ending")] = False,
    clarifying: Annotated[
        bool | None, typer.Option("--clarifying/--answering", help="override the clarifying-question detection")
    ] = None,
) -> None:
    """Run one preference's checker on a response; prints {"preference", "verdict", "reason"}."""
    from memrl.core.preferences import get_preference
    from memrl.envs.collab.checkers import TurnContext, is_clarifying_question
    from memrl.envs.collab.checkers import check as run_check

    get_preference(preference)  # an unknown id is the first thing to report
    if not response_file.is_file():
        raise ConfigError(f"response file not found: {response_file}")
    text = response_file.read_text()
    asking = is_clarifying_question(text) if clarifying is None else clarifying
    result = run_check(preference, text, TurnContext(winding_down=winding_down, clarifying=asking))
    typer.echo(json.dumps({"preference": result.preference, "verdict": result.verdict.value, "reason": result.reason}))


@collab_app.command("compare")
def compare(
    memory_dir: Annotated[Path, typer.Option("--memory", help="run dir of the agent with memory")],
    baseline_dir: Annotated[Path, typer.Option("--baseline", help="run dir of the agent without memory")],
    out: Annotated[Path, typer.Option("--out", help="where deltas.json and deltas.png go")],
) -> None:
    """Per-session deltas (memory - no memory) of task success, user effort and length, as in the paper's Fig. 3."""
    from memrl.envs.collab.metrics import write_comparison

    for d in (memory_dir, baseline_dir):
        if not (d / "metrics.json").is_file():
            raise ConfigError(f"{d}/metrics.json not found: run `memrl eval collab --out {d}` first")
    deltas = write_comparison(memory_dir, baseline_dir, out)
    typer.echo(f"{len(deltas)} sessions compared: {out / 'deltas.json'}, {out / 'deltas.png'}")


def eval_collab(
    out: Annotated[Path, typer.Option("--out", help="output dir: sessions.jsonl, metrics.json, sessions.png")],
    task: Annotated[str, typer.Option(help="arith (shipped, offline), math-500, math-hard, logiqa, mmlu, medqa")] = (
        "arith"
    ),
    problems: Annotated[Path | None, typer.Option(help="local problem file or cache folder (default: hub)")] = None,
    users: Annotated[int, typer.Option(min=1)] = 4,
    sessions: Annotated[int, typer.Option(min=1, help="sessions per user, in order")] = 20,
    simulator: Annotated[str, typer.Option(help="rule | llm")] = "rule",
    agent: Annotated[str, typer.Option(help="memory | none | oracle | history-3 | history-all")] = "memory",
    model: Annotated[str, typer.Option(help="agent model: NAME (served locally) or NAME@URL (endpoint)")] = "smollm2",
    user_model: Annotated[str | None, typer.Option(help="LLM user simulator model (default: --model)")] = None,
    reflector: Annotated[str | None, typer.Option(help="reflection model, e.g. a trained checkpoint")] = None,
    judge: Annotated[str | None, typer.Option(help="judge for free-form answers (default: user model)")] = None,
    profiles: Annotated[Path | None, typer.Option(help="user profiles (ours or the original user_profiles.json)")] = (
        None
    ),
    split: Annotated[str, typer.Option(help="eval | train: which disjoint half of users and problems")] = "eval",
    max_turns: Annotated[int, typer.Option(min=1)] = 10,
    max_tokens: Annotated[
        int | None, typer.Option(help="agent reply budget in tokens (default 96, sized for the CPU default model)")
    ] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Ray actors (default: min(users, CPUs, 8))")] = None,
    max_in_flight: Annotated[int, typer.Option(min=1, help="requests in flight per model endpoint")] = 32,
    request_timeout: Annotated[
        float | None, typer.Option(min=0.001, help="seconds per request to a NAME@URL endpoint (default 120)")
    ] = None,
    max_retries: Annotated[
        int | None, typer.Option(min=0, help="retries with backoff per request to a NAME@URL endpoint (default 4)")
    ] = None,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster (default: local)")] = None,
    seed: int = 0,
) -> None:
    """Multi-session collaboration: users with preferences work with an agent; writes metrics and a plot.

    A rerun with the same --out resumes: finished sessions are kept and skipped, failed ones run again.
    """
    from pydantic import ValidationError

    from memrl.app.recipe import describe_error
    from memrl.envs.actors import claim_output
    from memrl.envs.collab.config import CollabEvalConfig, model_from_spec
    from memrl.envs.collab.metrics import write_report
    from memrl.envs.collab.problems import get_task
    from memrl.envs.collab.runner import collab_run
    from memrl.rollout.config import OpenAIModelConfig

    spec = {
        "task": task,
        "problems": problems,
        "users": users,
        "sessions": sessions,
        "simulator": simulator,
        "agent": agent,
        "profiles": profiles,
        "split": split,
        "max_turns": max_turns,
        "workers": workers,
        "max_in_flight": max_in_flight,
        "ray_address": ray_address,
        "seed": seed,
    }
    try:
        cfg = CollabEvalConfig.model_validate(spec)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc, CollabEvalConfig)) from None
    roles = {"model": model, "user_model": user_model, "reflector": reflector, "judge": judge}
    client = {"timeout": request_timeout, "max_retries": max_retries}
    client = {k: v for k, v in client.items() if v is not None}
    update: dict[str, Any] = {}
    for key, value in roles.items():
        if value is not None:
            role = model_from_spec(value, max_in_flight)
            update[key] = role.model_copy(update=client) if isinstance(role, OpenAIModelConfig) else role
    if max_tokens is not None:
        update["sampling"] = cfg.sampling.model_copy(
            update={"agent": cfg.sampling.agent.model_copy(update={"max_tokens": max_tokens})}
        )
    cfg = cfg.model_copy(update=update)
    get_task(cfg.task)  # an unknown task fails here, before any model starts
    claim_output(out, cfg, may_change={"sessions", "workers", "max_in_flight", "ray_address"})
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the summary JSON
        run = collab_run(cfg, out, console)
        metrics = write_report(run.records, out, failed=run.failed)
    summary = {k: metrics.get(k) for k in ("task_success", "user_effort", "length", "sessions", "users")}
    summary |= {"failed": len(run.failed), "pending": run.pending, "retried": run.retried}
    typer.echo(json.dumps(summary))
    if run.failed:
        console.print(
            f"{len(run.failed)} session(s) failed ({out / 'failed.jsonl'}) and {run.pending} more wait on them; "
            "metrics cover finished sessions only: rerun the same command to run them",
            style="yellow",
            markup=False,
        )
    console.print(f"wrote {out / 'sessions.jsonl'}, {out / 'metrics.json'}, {out / 'sessions.png'}")
