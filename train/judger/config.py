"""What `eval judger` is told: which judger, which pairs, how retrieval and fusion run, what is reported."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from memrl.core.schema import StrictModel
from memrl.envs.tod.config import FusionAlpha, FusionScale


class JudgerEvalConfig(StrictModel):
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
