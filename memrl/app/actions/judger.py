"""`eval judger`: Recall@k of the gold memories on held-out queries, retrieval alone, the judger alone, fused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.app.actions import Action
from memrl.train.judger.config import JudgerEvalConfig


def evaluate(cfg: JudgerEvalConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.train.judger.evaluate import evaluate_config  # torch and the judger's heads: only when it runs

    return evaluate_config(cfg, out, console)


EVAL_JUDGER = Action(
    "eval judger",
    JudgerEvalConfig,
    evaluate,
    "Recall@k of the gold memories: retrieval alone, the judger alone and fused side by side, judger_gain@5, an "
    "alpha sweep, and the judger's AUC, Brier score and ECE. A rerun into the same folder reuses the pair scores "
    "already written.",
    refs=("judger", "data"),
)
