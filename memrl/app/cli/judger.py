"""`memrl eval judger`: ranking metrics of a trained memory judger. Heavy imports stay inside the command."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memrl.core.errors import ConfigError

console = Console(stderr=True)


def eval_judger(
    model: Annotated[str, typer.Option(help="a trained judger (stage folder or its final/); 'none': retrieval only")],
    data: Annotated[Path, typer.Option(help="judger data: the eval split folder (J/eval), its pairs.jsonl, or J")],
    out: Annotated[Path, typer.Option(help="output dir: scores.jsonl, metrics.json")],
    retriever: Annotated[str, typer.Option(help="dense | bm25 | hybrid")] = "dense",
    alpha: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="fused = alpha * retrieval + (1 - alpha) * judger")
    ] = 0.5,
    top_units: Annotated[int, typer.Option(min=0, help="memory units kept by intent alignment (0: all)")] = 3,
    batch_size: Annotated[int, typer.Option(min=1, help="pairs per judger forward pass")] = 32,
) -> None:
    """Recall@1/3/5 of the gold memories with the judger fused at alpha, retrieval alone, the judger alone, an
    alpha sweep, and the judger's AUC. A rerun with the same --out reuses the pair scores already written."""
    from memrl.envs.tod.retrieval import RETRIEVERS
    from memrl.train.judger.data import require_pairs

    if retriever not in RETRIEVERS:
        raise ConfigError(f"--retriever: expected one of {', '.join(RETRIEVERS)}, got {retriever!r}")
    pairs = require_pairs(data, "eval")
    judger = None if model.lower() == "none" else model
    # Libraries print at import time (transformers announces wandb's offline mode); stdout carries only the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        from memrl.train.judger.evaluate import evaluate_judger

        metrics = evaluate_judger(
            judger,
            pairs,
            out,
            retriever=retriever,
            alpha=alpha,
            top_units=top_units or None,
            batch_size=batch_size,
            console=console,
        )
    typer.echo(json.dumps(metrics))
