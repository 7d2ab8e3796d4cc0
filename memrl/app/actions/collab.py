"""`eval collab`: a multi-session collab evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.app.actions import Action
from memrl.envs.collab.config import RESUMABLE_CHANGES, CollabEvalConfig


def evaluate_collab(cfg: CollabEvalConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.core.runfolder import claim
    from memrl.envs.collab.metrics import write_report
    from memrl.envs.collab.problems import get_task
    from memrl.envs.collab.runner import finished_sessions
    from memrl.envs.registry import evaluation

    get_task(cfg.task)  # an unknown task fails here, before any model starts
    claim(out, cfg, may_change=RESUMABLE_CHANGES)
    run = evaluation("collab")(cfg, out, console)
    metrics = write_report(finished_sessions(run, out), out, failed=run.failed)
    summary = {k: metrics.get(k) for k in ("task_success", "user_effort", "length", "sessions", "users")}
    summary |= {"failed": len(run.failed), "pending": run.pending, "retried": run.retried}
    if run.failed:
        console.print(
            f"{len(run.failed)} session(s) failed ({out / 'failed.jsonl'}) and {run.pending} more wait on them; "
            "metrics cover finished sessions only: rerun the same command to run them",
            style="yellow",
            markup=False,
        )
    console.print(f"wrote {out / 'sessions.jsonl'}, {out / 'metrics.json'}, {out / 'sessions.png'}")
    run.check("eval collab")  # sessions failed and none finished: fail, now that the metrics say so
    return summary


EVAL_COLLAB = Action(
    "eval collab",
    CollabEvalConfig,
    evaluate_collab,
    "Multi-session collaboration: users with preferences work with an agent; writes metrics and a plot. A rerun "
    "into the same folder resumes: finished sessions are kept and skipped, failed ones run again.",
    refs=("problems", "profiles"),
)
