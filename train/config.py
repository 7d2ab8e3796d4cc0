"""Typed recipe stages of the training pipeline: SFT warm-up and GRPO, on TRL, verl or LLaMA-Factory.

One schema serves every trainer; each trainer module translates it (TRL arguments, verl Hydra overrides,
LLaMA-Factory YAML). Knobs one trainer lacks are refused there with a clear line, never silently dropped.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
)

from memrl.core.schema import StrictModel
from memrl.rewards.config import RewardConfig, UnscoredStop
from memrl.train import registry
from memrl.train.placement import Placement

# A stage's `trainer`: the backends of memrl.train.registry that train its kind, as a Literal (the JSON schema, the
# CLI's choices and the error naming the allowed ones); a backend registered later passes the field's validator.
if TYPE_CHECKING:
    SFTTrainer: TypeAlias = str
    GRPOTrainer: TypeAlias = str
    OnlineTrainer: TypeAlias = str
else:
    SFTTrainer, GRPOTrainer, OnlineTrainer = (Literal[registry.names(k)] for k in ("sft", "grpo", "online_grpo"))


def trainers_help(kind: str) -> str:
    """`<name>: <summary>` of each backend that trains `kind`."""
    return "; ".join(f"{name}: {registry.backend(name).summary}" for name in registry.names(kind))


class LoraConfig(StrictModel):
    rank: PositiveInt = 8
    alpha: PositiveInt = 16
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: str | list[str] = Field(default="all-linear", description="'all-linear' or module names")


class ClusterConfig(StrictModel):
    """Where a stage runs. TRL: in-process on CPU or one GPU; with several visible GPUs, one process per GPU (at most
    gpus_per_node) under `accelerate launch`; several nodes: `memrl run` on each, NODE_RANK and MASTER_ADDR set."""

    nnodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 8
    ray_address: str | None = Field(
        default=None, description="submit with `ray job submit --address`; default: launch locally"
    )


class LoggingTarget(StrictModel):
    save_steps: PositiveInt = Field(default=50, description="checkpoint every N optimizer steps")
    keep: PositiveInt = Field(
        default=2,
        description="checkpoints kept on disk, the newest (every trainer; a 7B's full-parameter checkpoint with its "
        "Adam state is ~90 GB); `final/` comes on top",
    )
    logging_steps: PositiveInt = 1


class SFTStage(StrictModel):
    """Supervised warm-up on gold reflections (paper Table 5: lr 1e-6, 4 epochs, batch 64, cutoff 32768)."""

    kind: Literal["sft"]
    trainer: SFTTrainer = "trl"
    model: str = Field(description="a key of the recipe's `models`: the base model to fine-tune")
    data: str = Field(description="a reflection_data stage of this recipe, or a dataset folder it wrote")
    lora: LoraConfig | None = Field(default_factory=LoraConfig, description="null: full fine-tuning")
    lr: PositiveFloat = 1e-6
    epochs: PositiveFloat = 4
    max_steps: PositiveInt | None = Field(default=None, description="stop after N steps (overrides epochs)")
    batch_size: PositiveInt = Field(default=64, description="global batch, in sequences")
    micro_batch_size: PositiveInt = Field(default=1, description="per device; the rest is gradient accumulation")
    max_length: PositiveInt = Field(default=32768, description="cutoff in tokens")
    warmup_ratio: NonNegativeFloat = 0.0
    lr_scheduler: Literal["linear", "cosine", "constant"] = Field(
        default="linear", description="decay after the warm-up (verl: cosine or constant)"
    )
    checkpoints: LoggingTarget = LoggingTarget()
    cluster: ClusterConfig = ClusterConfig()
    placement: Placement = Field(
        default_factory=Placement, description="GPU stages: served models on reserved GPUs of this node, or elsewhere"
    )
    overrides: list[str] = Field(default_factory=list, description="extra trainer overrides, passed through")

    @field_validator("trainer", mode="wrap")
    @classmethod
    def _registered(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return registry.admit("sft")(value, handler)

    @field_serializer("trainer")
    def _name(self, trainer: str) -> str:  # a backend registered later is no name of the Literal
        return trainer


class PolicyOptimStage(StrictModel):
    """What every GRPO stage (the reflector's `grpo`, the agent's `collab_grpo`) says about the policy, its groups
    and where it runs. Each kind adds its data and reward and sets the defaults that differ (lr, max_steps,
    batch_size, rollouts, kl_coef); `response_budget` is the tokens a sample may generate after its prompt."""

    trainer: GRPOTrainer = Field(default="trl", description=trainers_help("grpo"))
    model: str = Field(description="a key of the recipe's `models`: the base model")
    init: str | None = Field(default=None, description="an sft stage of this recipe (or a checkpoint) to start from")
    lora: LoraConfig | None = Field(default_factory=LoraConfig, description="null: full fine-tuning")
    lr: PositiveFloat
    max_steps: PositiveInt
    batch_size: PositiveInt
    micro_batch_size: PositiveInt = Field(default=1, description="per device, in samples (sequences or episodes)")
    rollouts: PositiveInt
    kl_coef: NonNegativeFloat
    # grpo: per-sequence token mean (length-biased); dapo: token mean over the batch; dr_grpo: sum over a fixed
    # length and no std scaling. The last two remove GRPO's preference for long wrong / short right answers.
    loss: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    max_prompt_length: PositiveInt = Field(
        default=2048, description="tokens of a prompt (TRL drops longer prompts, verl filters them out)"
    )
    temperature: PositiveFloat = 1.0
    checkpoints: LoggingTarget = LoggingTarget()
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="where it runs (TRL: launch size)")
    placement: Placement = Field(
        default_factory=Placement, description="GPU stages: served models on reserved GPUs of this node, or elsewhere"
    )
    overrides: list[str] = Field(
        default_factory=list, description="extra GRPOConfig fields (trl) or Hydra overrides (verl), name=value"
    )

    @field_validator("trainer", mode="wrap")
    @classmethod
    def _registered(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A backend that trains the stage's kind (every world's `<world>_grpo` is `online_grpo`)."""
        return registry.admit(getattr(cls, "layout_kind", "grpo"))(value, handler)

    @field_serializer("trainer")
    def _name(self, trainer: str) -> str:  # a backend registered later is no name of the Literal
        return trainer

    @property
    @abstractmethod
    def response_budget(self) -> int:
        """Tokens a sample may generate after its prompt: each stage kind says what a sample is."""


class GRPOStage(PolicyOptimStage):
    """GRPO on the reflection reward (paper Table 5: lr 1e-6, 200 steps, batch 64, 8 rollouts, KL 0.003)."""

    kind: Literal["grpo"]
    data: str = Field(description="a reflection_data stage of this recipe, or a dataset folder it wrote")
    reward: RewardConfig = RewardConfig()
    unscored: UnscoredStop = Field(
        default_factory=UnscoredStop, description="stop the run when most samples stay unscored step after step"
    )
    lr: PositiveFloat = 1e-6
    max_steps: PositiveInt = 200
    batch_size: PositiveInt = Field(default=64, description="prompts per step")
    rollouts: PositiveInt = Field(default=8, description="samples per prompt (the GRPO group)")
    kl_coef: NonNegativeFloat = Field(default=0.003, description="KL loss coefficient; 0 drops the reference model")
    max_response_length: PositiveInt = 1024
    vllm: bool = Field(
        default=False,
        description="trainer trl: generate rollouts with vLLM colocated on the training GPU (verl always uses vLLM)",
    )

    @property
    def response_budget(self) -> int:
        return self.max_response_length


class JudgerSelection(StrictModel):
    """Which train pairs the judger learns from: what evaluation ranks (the pairs of the units retrieval keeps, in
    queries that have a positive) plus a few random negatives of other units, so it has seen the rest too."""

    require_positive: bool = Field(default=True, description="drop queries without a positive pair")
    retriever: Literal["dense", "bm25", "hybrid"] | None = Field(
        default="dense", description="keep the pairs of the units this retriever ranks first, as eval does; null: all"
    )
    top_units: PositiveInt = Field(default=3, description="units kept per query (eval's top_units)")
    random_negatives: NonNegativeInt = Field(default=4, description="per query, negatives of other units (seeded)")


class JudgerStage(StrictModel):
    """The memory judger: P(a stored QA pair fills a slot the dialogue lacks), trained with BCE on an HF Trainer.

    One GPU or CPU runs in-process; a cluster of more than one GPU runs the same stage under torchrun.
    """

    kind: Literal["judger"]
    model: str = Field(description="a key of the recipe's `models`: the base model")
    head: Literal["cross_encoder", "seq_cls", "yes_no"] = Field(
        default="cross_encoder", description="cross_encoder (an encoder such as MiniLM), seq_cls or yes_no (causal LMs)"
    )
    data: str | None = Field(
        default=None, description="judger data folder (train/, eval/) or a stage of this recipe; default: `data`"
    )
    lora: LoraConfig | None = Field(default=None, description="null: full fine-tuning (the small cross-encoder)")
    lr: PositiveFloat = 5e-5
    epochs: PositiveFloat = 2
    max_steps: PositiveInt | None = Field(
        default=None, description="stop after at most N steps (or at the end of `epochs`, whichever comes first)"
    )
    batch_size: PositiveInt = Field(default=32, description="global batch, in pairs")
    micro_batch_size: PositiveInt = Field(default=16, description="per device; the rest is gradient accumulation")
    max_length: PositiveInt = Field(default=256, description="tokens per input; the oldest turns go first")
    warmup_ratio: NonNegativeFloat = 0.0
    pos_weight: PositiveFloat | Literal["auto"] | None = Field(
        default="auto", description="weight of the positive terms; auto: negatives / positives of the selected rows"
    )
    selection: JudgerSelection = JudgerSelection()
    alpha_dev_fraction: float = Field(
        default=0.15,
        ge=0,
        lt=1,
        description="train individuals held out of training to choose the fusion alpha on; 0: no alpha saved",
    )
    deepspeed: str | None = Field(default=None, description="zero2, zero3 (bundled configs) or a DeepSpeed JSON path")
    bf16: bool | None = Field(default=None, description="null: where the device supports it")
    checkpoints: LoggingTarget = LoggingTarget()
    cluster: ClusterConfig = Field(
        default_factory=lambda: ClusterConfig(gpus_per_node=1), description="more than one GPU: launched by torchrun"
    )
    placement: Placement = Field(
        default_factory=Placement, description="served models on reserved GPUs of this node, kept off the judger's"
    )
    overrides: list[str] = Field(default_factory=list, description="extra TrainingArguments fields, name=value")

    @property
    def world_size(self) -> int:
        """torchrun's processes: one per GPU that the placement plan leaves the judger, on each node."""
        from memrl.train.placement import trainer_cluster

        return self.cluster.nnodes * trainer_cluster(self).gpus_per_node

    @property
    def distributed(self) -> bool:
        return self.world_size > 1
