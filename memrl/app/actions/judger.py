"""`eval judger`: Recall@k of the gold memories on held-out queries, retrieval alone, the judger alone, fused."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt
from rich.console import Console

from memrl.app.actions import Action
from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.tod.config import FusionAlpha, FusionScale


class JudgerEval(StrictModel):
    judger: Path | None = Field(
        default=None, description="a trained judger (stage folder or its final/); None: retrieval alone"
    )
    data: Path | None = Field(
        default=None,
        description="judger data: the folder `memrl data judger` wrote, its eval/ split or that split's pairs.jsonl "
        "(in a recipe, default: the recipe's `data`)",
    )
    retriever: Literal["dense", "bm25", "hybrid"] = Field(default="dense", description="dense | bm25 | hybrid")
    top_units: PositiveInt | None = Field(default=3, description="memory units kept by intent alignment; None: all")
    alpha: FusionAlpha = None
    fusion: FusionScale = "rank"
    alphas: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], description="the alpha sweep (any grid)"
    )
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 3, 5], min_length=1, description="the k of Recall@k")
    batch_size: PositiveInt = Field(default=32, description="pairs per judger forward pass")
    max_queries: PositiveInt | None = Field(default=None, description="only the first N queries (smoke runs)")


def evaluate(cfg: JudgerEval, out: Path, console: Console) -> dict[str, Any]:
    from memrl.train.judger.data import require_pairs
    from memrl.train.judger.evaluate import evaluate_judger

    if cfg.data is None:
        raise ConfigError("no judger data: pass --data (or, for a recipe, `data:` on the stage or data=DIR)")
    return evaluate_judger(
        None if cfg.judger is None else str(cfg.judger),
        require_pairs(cfg.data, "eval"),
        out,
        retriever=cfg.retriever,
        alpha=cfg.alpha,
        fusion=cfg.fusion,
        top_units=cfg.top_units,
        alphas=cfg.alphas,
        ks=cfg.ks,
        batch_size=cfg.batch_size,
        max_queries=cfg.max_queries,
        console=console,
    )


EVAL_JUDGER = Action(
    "eval judger",
    JudgerEval,
    evaluate,
    "Recall@k of the gold memories: retrieval alone, the judger alone and fused side by side, judger_gain@5, an "
    "alpha sweep, and the judger's AUC, Brier score and ECE. A rerun into the same folder reuses the pair scores "
    "already written.",
    refs=("judger", "data"),
)
