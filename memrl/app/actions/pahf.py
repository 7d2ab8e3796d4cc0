"""PAHF: `eval pahf` (the 4-phase protocol) and `data pahf` (memory-writer data from a run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.app.actions import Action
from memrl.data_gen.config import PahfDataConfig
from memrl.envs.pahf.config import PahfEvalConfig

# What may change between a run and its resumption besides how the work runs (runfolder.RUNTIME_KEYS): which users.
RESUMABLE_CHANGES = {"users"}


def _setup(cfg: PahfEvalConfig) -> dict[str, Any]:
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


def evaluate_pahf(cfg: PahfEvalConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.core.runfolder import claim
    from memrl.envs.driver import FAILED_FILE
    from memrl.envs.pahf.protocol import LeftOut, compute_metrics, plot_curves
    from memrl.envs.pahf.runner import TASKS_FILE, finished_tasks
    from memrl.envs.registry import evaluation

    cfg.domain_dir()  # a missing --data fails before any model or Ray starts
    claim(out, cfg, may_change=RESUMABLE_CHANGES)
    left_out = LeftOut()  # scenarios without a gold: named on the console and under metrics' `problems`
    run = evaluation("pahf")(cfg, out, console, left_out)
    tasks = {"planned": run.planned, "finished": len(run.records), "failed": len(run.failed), "retried": run.retried}
    metrics = compute_metrics(finished_tasks(run, out)) | {"tasks": tasks, "setup": _setup(cfg)}
    if left_out.scenarios:
        metrics["problems"] = left_out.summary()
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    plots = plot_curves(metrics, out)
    console.print(f"wrote {out / TASKS_FILE}, {out / 'metrics.json'}, {', '.join(p.name for p in plots)}")
    if run.failed:
        console.print(f"{len(run.failed)} tasks failed (see {out / FAILED_FILE}); rerun the same command to retry them")
    run.check("eval pahf")  # tasks failed and none finished: fail, now that the metrics say so
    return metrics


EVAL_PAHF = Action(
    "eval pahf",
    PahfEvalConfig,
    evaluate_pahf,
    "PAHF continual personalization: learn, test, drift, learn, test; writes metrics and learning curves. A rerun "
    "into the same folder resumes: finished tasks are kept and skipped, and each user's memory is restored.",
    refs=("data",),
)


def build_pahf_data(cfg: PahfDataConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.data_gen.pahf import build_pahf_dataset

    return build_pahf_dataset(cfg, out)


PAHF_DATA = Action(
    "data pahf",
    PahfDataConfig,
    build_pahf_data,
    "Memory-writer data: (feedback context -> note) records rewarded by the next decision each note informed.",
    refs=("run",),
)
