"""Typed config of an MS-TOD evaluation (what `memrl eval tod` builds from its flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from memrl.core.schema import StrictModel
from memrl.envs.tod.retrieval import Fusion
from memrl.rollout.config import HFModelConfig, ModelConfig, SamplingConfig

DEFAULT_CHAT_MODEL = HFModelConfig(backend="hf", model="smollm2")


FusionAlpha = Annotated[
    float | None,
    Field(
        ge=0.0,
        le=1.0,
        description="fused = alpha * retrieval + (1 - alpha) * judger, both per-query scaled; default: the alpha the "
        "judger chose on its training split, else 0.5",
    ),
]
FusionScale = Annotated[
    Fusion, Field(description="per-query scale of both scores before fusing: rank | zscore | minmax (earlier)")
]
"""The fusion settings `eval tod` and `eval judger` share."""


class TodSampling(StrictModel):
    """Sampling per LLM role: greedy, so a rerun of the same setup says the same things."""

    intent: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=48)
    reasoner: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=256)
    reader: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=128)
    user: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=64)
    supervisor: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=192)
    quality: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=128)


class TodEvalConfig(StrictModel):
    data: Path = Field(description="MS-TOD folder: persona_*.json, schema.json, optional memory/")
    schema_file: Path | None = Field(
        default=None,
        description="SGD schema.json, or an SGD folder (its train/dev/test schemas merged); default: DATA/schema.json",
    )
    strict: bool = Field(
        default=False, description="fail on the first foreign slot or unreadable file instead of dropping and counting"
    )
    judger: Path | None = Field(default=None, description="trained judger folder; None: retrieval alone")
    retriever: Literal["dense", "bm25", "hybrid"] = Field(
        default="dense", description="dense (MiniLM) | bm25 | hybrid retrieval over the memory QA pairs"
    )
    alpha: FusionAlpha = None
    fusion: FusionScale = "rank"
    top_k: PositiveInt = Field(default=5, description="QA pairs the reader gets")
    top_units: PositiveInt | None = Field(default=3, description="memory units kept by intent alignment; None: all")
    reader: Literal["template", "llm"] = Field(
        default="llm", description="template (offline) or llm (reader_model writes the confirmation)"
    )
    reader_model: ModelConfig = Field(default=DEFAULT_CHAT_MODEL, description="the reader's model")
    intent: Literal["schema", "llm"] = Field(default="schema", description="intent extractor: schema (offline) | llm")
    reasoner: Literal["schema", "llm"] = Field(
        default="schema", description="missing-slot reasoner: schema (offline) | llm"
    )
    user: Literal["rule", "llm"] = Field(default="rule", description="user simulator: rule | llm")
    supervisor: Literal["rule", "llm"] = Field(default="rule", description="supervisor: rule | llm")
    llm: ModelConfig | None = Field(default=None, description="model of the llm roles; default: the reader's")
    quality_judge: ModelConfig | None = Field(default=None, description="rates confirmation responses 1-10")
    max_turns: PositiveInt = Field(default=10, description="assistant turns before a task fails")
    split_from: Path | None = Field(default=None, description="judger data folder: evaluate its eval individuals")
    individuals: PositiveInt | None = Field(default=None, description="the first N individuals; None: all")
    sessions: PositiveInt | None = Field(default=None, description="the first N confirming sessions; None: all")
    sampling: TodSampling = TodSampling()
    seed: int = Field(default=0, description="seed of sampling and of every random choice")
    workers: PositiveInt | None = Field(
        default=None,
        description="Ray actors; default: min(sessions, CPUs, 8), or none on a local run whose models are all `hf` "
        "(one worker in this process batches their requests)",
    )
    max_in_flight: PositiveInt = Field(default=32, description="sessions in flight, all workers together")
    ray_address: str | None = Field(default=None, description="Ray cluster address; default: a local Ray")

    def schema_path(self) -> Path:
        return self.schema_file or self.data / "schema.json"

    def llm_or_default(self) -> ModelConfig:
        return self.llm or self.reader_model

    def llm_roles(self) -> list[str]:
        """The roles played by `llm_or_default()`."""
        kinds = {"intent": self.intent, "reasoner": self.reasoner, "user": self.user, "supervisor": self.supervisor}
        return [role for role, kind in kinds.items() if kind == "llm"]
