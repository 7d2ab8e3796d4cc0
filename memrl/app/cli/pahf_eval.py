"""`memrl eval pahf`: the 4-phase protocol. Heavy imports stay inside the command."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from memrl.core.errors import ConfigError

console = Console(stderr=True)

# What may change between a run and its resumption: which users, and how the work is spread.
_RESUMABLE_CHANGES = {"users", "workers", "max_in_flight", "ray_address"}


def eval_pahf(
    domain: Annotated[str, typer.Option(help="shopping | embodied")],
    data: Annotated[
        Path, typer.Option("--data", help="released PAHF layout: a folder with shopping/ or embodied/, or one of them")
    ],
    out: Annotated[Path, typer.Option("--out", help="output dir: tasks.jsonl, metrics.json, curves, memory/")],
    agent: Annotated[str, typer.Option(help="none | pre | post | pahf")] = "pahf",
    memory: Annotated[str, typer.Option(help="note store: sqlite | faiss")] = "sqlite",
    users: Annotated[int | None, typer.Option(min=1, help="the first N users (default: all)")] = None,
    scenarios: Annotated[int | None, typer.Option(min=1, help="first N scenarios per user per phase")] = None,
    passes: Annotated[int, typer.Option(min=1, help="passes over the scenarios of each learning phase")] = 1,
    model: Annotated[str, typer.Option(help="agent model: MODEL (served locally) or MODEL@URL")] = "smollm2",
    user_model: Annotated[
        str | None, typer.Option("--user-model", help="persona LLM for --user-sim llm (default: --model)")
    ] = None,
    writer_model: Annotated[
        str | None,
        typer.Option(
            "--writer-model", help="memory writer (e.g. a trained reflector): MODEL or MODEL@URL; default --model"
        ),
    ] = None,
    tau: Annotated[float, typer.Option(help="merge a new note into the nearest one above this cosine")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="notes retrieved per task")] = 5,
    feedback_style: Annotated[str, typer.Option("--feedback-style", help="minimal | detailed")] = "minimal",
    user_sim: Annotated[
        str, typer.Option("--user-sim", help="who answers questions: rule (from the data) | llm (persona)")
    ] = "rule",
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="decision reply budget in tokens (default 160)")
    ] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Ray actors (default: min(users, CPUs, 8))")] = None,
    max_in_flight: Annotated[int, typer.Option(min=1, help="requests in flight, all workers together")] = 32,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster (default: local)")] = None,
    seed: int = 0,
) -> None:
    """PAHF continual personalization: learn, test, drift, learn, test; writes metrics and learning curves.

    A rerun with the same --out resumes: finished tasks are kept and skipped, and each user's memory is restored.
    """
    from pydantic import ValidationError

    from memrl.app.recipe import describe_error
    from memrl.envs.actors import claim_output
    from memrl.envs.collab.config import model_from_spec
    from memrl.envs.pahf.config import PahfEvalConfig

    spec: dict[str, Any] = {
        "domain": domain,
        "data": data,
        "agent": agent,
        "memory": memory,
        "users": users,
        "scenarios": scenarios,
        "passes": passes,
        "tau": tau,
        "top_k": top_k,
        "feedback_style": feedback_style,
        "user_sim": user_sim,
        "model": model_from_spec(model, max_in_flight),
        "workers": workers,
        "max_in_flight": max_in_flight,
        "ray_address": ray_address,
        "seed": seed,
    }
    if user_model is not None:
        spec["user_model"] = model_from_spec(user_model, max_in_flight)
    if writer_model is not None:
        spec["writer_model"] = model_from_spec(writer_model, max_in_flight)
    try:
        cfg = PahfEvalConfig.model_validate(spec)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc, PahfEvalConfig)) from None
    if max_tokens is not None:
        decision = cfg.sampling.decision.model_copy(update={"max_tokens": max_tokens})
        cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"decision": decision})})
    cfg.domain_dir()  # a missing --data fails before any model or Ray starts
    claim_output(out, cfg, may_change=_RESUMABLE_CHANGES)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the metrics JSON
        from memrl.envs.actors import FAILED_FILE
        from memrl.envs.pahf.protocol import compute_metrics, plot_curves
        from memrl.envs.pahf.runner import TASKS_FILE, run_pahf

        run = run_pahf(cfg, out, console)
        metrics = compute_metrics(run.records) | {
            "tasks": {"planned": run.planned, "finished": len(run.records), "failed": len(run.failed),
                     "retried": run.retried},
            "setup": _setup(cfg),
        }  # fmt: skip
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        plots = plot_curves(metrics, out)
    typer.echo(json.dumps(metrics))
    console.print(f"wrote {out / TASKS_FILE}, {out / 'metrics.json'}, {', '.join(p.name for p in plots)}")
    if run.failed:
        console.print(f"{len(run.failed)} tasks failed (see {out / FAILED_FILE}); rerun the same command to retry them")


def _setup(cfg: Any) -> dict[str, Any]:
    """What the numbers were measured with, so metrics files compare on their own."""
    return {
        "domain": cfg.domain,
        "agent": str(cfg.agent),
        "memory": cfg.memory,
        "model": cfg.model.model,
        "user_sim": cfg.user_sim,
        "user_model": cfg.user_model_or_default().model if cfg.user_sim == "llm" else None,
        "writer_model": cfg.writer_model.model if cfg.writer_model is not None else cfg.model.model,
        "users": cfg.users,
        "scenarios": cfg.scenarios,
        "passes": cfg.passes,
        "tau": cfg.tau,
        "top_k": cfg.top_k,
        "feedback_style": cfg.feedback_style,
        "embedder": cfg.embedder,
        "seed": cfg.seed,
    }
