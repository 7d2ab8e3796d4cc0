"""`memrl eval tod`: the MS-TOD memory pipeline and proactive simulator. Heavy imports stay inside the command."""

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

# What may change between a run and its resumption: which individuals, and how the work is spread.
_RESUMABLE_CHANGES = {"individuals", "sessions", "split_from", "workers", "max_in_flight", "ray_address"}


def eval_tod(
    data: Annotated[Path, typer.Option("--data", help="MS-TOD folder (persona_*.json, schema.json, memory/)")],
    out: Annotated[Path, typer.Option("--out", help="output dir: sessions.jsonl, metrics.json")],
    judger: Annotated[str, typer.Option("--judger", help="trained judger folder, or `none` for retrieval alone")] = (
        "none"
    ),
    retriever: Annotated[str, typer.Option(help="dense | bm25 | hybrid")] = "dense",
    alpha: Annotated[float, typer.Option(help="fused score: alpha * retrieval + (1 - alpha) * judger")] = 0.5,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="QA pairs the reader gets")] = 5,
    top_units: Annotated[
        int, typer.Option("--top-units", min=0, help="memory units kept by intent alignment (0: all)")
    ] = 3,
    reader: Annotated[str, typer.Option(help="template | MODEL (served locally) | MODEL@URL (an endpoint)")] = (
        "smollm2"
    ),
    reasoner: Annotated[str, typer.Option(help="missing-slot reasoner: schema | llm")] = "schema",
    intent: Annotated[str, typer.Option(help="intent extractor: schema | llm")] = "schema",
    user: Annotated[str, typer.Option(help="user simulator: rule | llm")] = "rule",
    supervisor: Annotated[str, typer.Option(help="supervisor: rule | llm")] = "rule",
    llm: Annotated[str | None, typer.Option(help="model of the llm roles: MODEL or MODEL@URL (default: --reader)")] = (
        None
    ),
    quality_judge: Annotated[
        str | None, typer.Option("--quality-judge", help="rate confirmation responses 1-10: MODEL or MODEL@URL")
    ] = None,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="assistant turns before a task fails")] = 10,
    split_from: Annotated[
        Path | None, typer.Option("--split-from", help="judger data folder: evaluate only its eval individuals")
    ] = None,
    individuals: Annotated[int | None, typer.Option(min=1, help="evaluate the first N individuals")] = None,
    sessions: Annotated[int | None, typer.Option(min=1, help="evaluate the first N confirming sessions")] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="reader reply budget in tokens (default 128)")
    ] = None,
    schema: Annotated[Path | None, typer.Option(help="SGD schema.json (default: DATA/schema.json)")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Ray actors (default: min(CPUs, 8))")] = None,
    max_in_flight: Annotated[int, typer.Option(min=1, help="sessions in flight, all workers together")] = 32,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster (default: local)")] = None,
    seed: int = 0,
) -> None:
    """Multi-session TOD: recall slot values from earlier sessions, confirm them, fix the rest; writes metrics.

    A rerun with the same --out resumes: finished sessions are kept and skipped.
    """
    from pydantic import ValidationError

    from memrl.app.recipe import describe_error
    from memrl.envs.actors import claim_output
    from memrl.envs.collab.config import model_from_spec
    from memrl.envs.tod.config import TodEvalConfig
    from memrl.envs.tod.metrics import compute_metrics
    from memrl.envs.tod.runner import SESSIONS_FILE, run_tod

    spec: dict[str, Any] = {
        "data": data,
        "schema_file": schema,
        "judger": None if judger.lower() == "none" else Path(judger),
        "retriever": retriever,
        "alpha": alpha,
        "top_k": top_k,
        "top_units": top_units or None,
        "reader": "template" if reader == "template" else "llm",
        "intent": intent,
        "reasoner": reasoner,
        "user": user,
        "supervisor": supervisor,
        "max_turns": max_turns,
        "split_from": split_from,
        "individuals": individuals,
        "sessions": sessions,
        "workers": workers,
        "max_in_flight": max_in_flight,
        "ray_address": ray_address,
        "seed": seed,
    }
    models = {"reader_model": None if reader == "template" else reader, "llm": llm, "quality_judge": quality_judge}
    spec |= {k: model_from_spec(v, max_in_flight) for k, v in models.items() if v is not None}
    try:
        cfg = TodEvalConfig.model_validate(spec)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc, TodEvalConfig)) from None
    if max_tokens is not None:
        reader_sampling = cfg.sampling.reader.model_copy(update={"max_tokens": max_tokens})
        cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"reader": reader_sampling})})
    if cfg.reader == "template" and cfg.llm_roles() and cfg.llm is None:
        raise ConfigError(f"--reader template plays no model: name one with --llm for the llm {cfg.llm_roles()[0]}")
    _check_inputs(cfg)
    claim_output(out, cfg, may_change=_RESUMABLE_CHANGES)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the metrics JSON
        records = run_tod(cfg, out, console)
        metrics = compute_metrics(records) | {"setup": _setup(cfg)}
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    typer.echo(json.dumps(metrics))
    console.print(f"wrote {out / SESSIONS_FILE}, {out / 'metrics.json'}")


def _check_inputs(cfg: Any) -> None:
    """Paths the workers will read, checked before any model or Ray starts."""
    if not cfg.data.is_dir():
        raise ConfigError(f"--data {cfg.data}: not a folder")
    if not cfg.schema_path().is_file():
        raise ConfigError(f"{cfg.schema_path()}: no schema.json (pass --schema)")
    if cfg.judger is not None and not cfg.judger.is_dir():
        raise ConfigError(f"--judger {cfg.judger}: not a folder (a trained judger, or `none`)")
    if cfg.split_from is not None:
        from memrl.envs.tod.runner import eval_individual_ids

        eval_individual_ids(cfg.split_from)


def _setup(cfg: Any) -> dict[str, Any]:
    """What the numbers were measured with, so metrics files compare on their own."""
    reader = "template" if cfg.reader == "template" else cfg.reader_model.model
    return {
        "judger": None if cfg.judger is None else str(cfg.judger),
        "retriever": cfg.retriever,
        "alpha": cfg.alpha,
        "top_k": cfg.top_k,
        "top_units": cfg.top_units,
        "reader": reader,
        "intent": cfg.intent,
        "reasoner": cfg.reasoner,
        "user": cfg.user,
        "supervisor": cfg.supervisor,
        "max_turns": cfg.max_turns,
        "llm": cfg.llm_or_default().model if cfg.llm_roles() else None,
        "quality_judge": None if cfg.quality_judge is None else cfg.quality_judge.model,
    }
