"""GRPO with TRL's GRPOTrainer on one node (CPU ok): the reflection reward from `memrl.rewards`, and the trainer
every TRL GRPO stage runs (`policy_sampling_trainer_class`).

Its `model.generate` rollouts come from the policy the loss trains, as verl's and TRL's vLLM rollouts do: TRL's plain
path samples in train mode (LoRA dropout on every rollout, the adapter beside its base layer at every step). Here the
model samples in eval mode and, on CPU, with the adapter merged into a copy-restored base (decoding on a few cores is
bound by the operations per token: about 1.5x faster, benchmarks/README.md, "quickstart_stages.py"), in bf16 where
the loss runs under bf16 autocast (`sampling_policy`). torch and TRL load when a stage runs, not on import.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memrl.core.attention import decode_fast_on_cpu
from memrl.core.checkpoints import (
    adapter_base,
    is_adapter,
    load_causal_lm,
    portable_ref,
    resolve_model,
    tokenizer_source,
)
from memrl.core.errors import ConfigError
from memrl.core.outcomes import require_data
from memrl.rewards.unscored import UnscoredWatch
from memrl.train.config import GRPOStage, PolicyOptimStage
from memrl.train.endpoints import require_reachable, stage_endpoints
from memrl.train.hf_trainer import TrainContext, apply_overrides, base_args, master_dtype, resume_point
from memrl.train.trl.common import (
    StepLog,
    accumulation_steps,
    cheap_dropout_masks,
    peft_config,
    project_labelled_tokens_only,
    prompt_tokens,
    rewards_file,
    save_final,
)

if TYPE_CHECKING:
    import torch


def load_rl_split(data_dir: Path, split: str, tokenizer: Any, max_prompt_length: int) -> tuple[Any, int]:
    """RL prompts with their ground truth; prompts longer than the budget are dropped (TRL has no prompt cut)."""
    from datasets import load_dataset

    path = require_data(data_dir / "rl" / f"{split}.jsonl", "RL data", "run the reflection_data stage first")
    data = load_dataset("json", data_files=str(path), split="train")
    data = data.select_columns([c for c in ("prompt", "ground_truth", "key") if c in data.column_names])

    kept = data.filter(lambda row: prompt_tokens(tokenizer, row["prompt"]) <= max_prompt_length)
    return kept, len(data) - len(kept)


def policy_model(stage: PolicyOptimStage, base_model: str) -> tuple[Any, Any, str]:
    """(model, peft_config, base ref). An SFT adapter keeps training as is; a full model gets a fresh adapter. On CPU
    the model samples its rollouts with the split attention (memrl.core.attention): the loss's passes are unchanged."""
    start = resolve_model(stage.init) if stage.init else resolve_model(base_model)
    dtype = master_dtype(stage.lora is None)  # full fine-tuning: float32 master weights (see master_dtype)
    lora = None
    if is_adapter(Path(start)):
        base = adapter_base(Path(start))
        # LoRA: the SFT adapter keeps training; full fine-tuning starts from the merged warm-up.
        model = (
            load_causal_lm(start, trainable_adapter=True)
            if stage.lora is not None
            else load_causal_lm(start, dtype=dtype)
        )
    else:
        lora = peft_config(stage.lora) if stage.lora is not None else None
        model, base = load_causal_lm(start, dtype=dtype), portable_ref(stage.init or base_model)
    import torch

    if not torch.cuda.is_available():  # the trainer runs on the CPU then (hf_trainer.device_args), its rollouts too
        decode_fast_on_cpu(model)
    return model, lora, base


def vllm_args(stage: GRPOStage) -> dict[str, Any]:
    """GRPOConfig fields for generation: TRL's model.generate, or vLLM colocated in this process (`vllm: true`)."""
    if not stage.vllm:
        return {}
    # The context vLLM must hold: the longest kept prompt plus the response budget.
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_max_model_length": stage.max_prompt_length + stage.max_response_length,
    }


def require_vllm(stage: GRPOStage, name: str) -> None:
    if stage.vllm and importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"stages.{name}.vllm: vLLM is not installed (pip install vllm, on a GPU machine)")


def grpo_args(stage: PolicyOptimStage, ctx: TrainContext, reward_weights: list[float]) -> dict[str, Any]:
    """GRPOConfig fields of any GRPO stage (the trainer-specific ones are added by its caller)."""
    completions = stage.batch_size * stage.rollouts
    args = base_args(ctx, lr=stage.lr, checkpoints=stage.checkpoints)
    args.update(
        max_steps=stage.max_steps,
        per_device_train_batch_size=stage.micro_batch_size,
        gradient_accumulation_steps=accumulation_steps(
            completions, stage.micro_batch_size, ctx.stage, "batch_size x rollouts"
        ),
        generation_batch_size=completions,  # one generation round feeds exactly one optimizer step
        num_generations=stage.rollouts,
        # dr_grpo divides each sample's summed loss by this constant: the whole response budget (an episode's, for
        # the agent), as verl's loss_scale_factor does (train/verl/overrides.py): both trainers take the same step.
        max_completion_length=stage.response_budget,
        temperature=stage.temperature,
        beta=stage.kl_coef,
        loss_type=stage.loss,
        scale_rewards="none" if stage.loss == "dr_grpo" else "group",
        reward_weights=reward_weights,
    )
    return args


@contextlib.contextmanager
def sampling_policy(model: Any, merge: bool, dtype: torch.dtype | None = None) -> Iterator[None]:
    """`model` in eval mode; with `merge`, a PEFT adapter folded into its base layers, which get back their exact
    weights afterwards (merge then unmerge alone would leave rounding drift in the base, step after step); with
    `dtype`, every parameter cast to it for the sampling and given back its own tensor afterwards (no rounding)."""
    import torch
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    was_training = model.training
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if merge and isinstance(model, PeftModel):
        for layer in model.modules():
            if isinstance(layer, BaseTunerLayer):
                base: Any = layer.get_base_layer()
                params = (base.weight, getattr(base, "bias", None))
                saved += [(p, p.detach().clone()) for p in params if isinstance(p, torch.Tensor)]
        model.merge_adapter()
    model.eval()
    originals: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    if dtype is not None:
        originals = [(p, p.data) for p in model.parameters() if p.dtype != dtype]
        for param, data in originals:
            param.data = data.to(dtype)
    try:
        yield
    finally:
        for param, data in originals:
            param.data = data
        if saved:
            model.unmerge_adapter()
            with torch.no_grad():
                for tensor, original in saved:
                    tensor.copy_(original)
        model.train(was_training)


def policy_sampling_trainer_class() -> type:
    """TRL's GRPOTrainer whose `model.generate` rollouts come from the trained policy without dropout (see the
    module), defined when a stage runs: importing TRL is heavy."""
    import torch
    from trl import GRPOTrainer

    class PolicySamplingGRPOTrainer(GRPOTrainer):
        """GRPOTrainer sampling from the policy the loss trains (`sampling_policy`)."""

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            if self.use_vllm:  # vLLM holds its own synced, merged copy of the weights
                return super()._generate_single_turn(*args, **kwargs)
            on_cpu = self.accelerator.device.type == "cpu"  # on a GPU the copy would cost memory for little speed
            # On CPU the loss runs under bf16 autocast where the cores have bf16 (hf_trainer.device_args); sampling in
            # bf16 too decodes about 1.7x faster than TRL's fp32 `generate` (benchmarks/README.md).
            dtype = torch.bfloat16 if on_cpu and self.args.bf16 else None
            with sampling_policy(self.model, on_cpu, dtype):
                return super()._generate_single_turn(*args, **kwargs)

    return PolicySamplingGRPOTrainer


def train_grpo(stage: GRPOStage, base_model: str, data_dir: Path, ctx: TrainContext, console: Any) -> Path:
    require_vllm(stage, ctx.stage)  # before any model is loaded
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from memrl.train.trl.rewards import grpo_rewards

    endpoints = stage_endpoints(stage)
    require_reachable(endpoints)  # a dead judge fails here, in seconds, not as a run of advantage-0 steps
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(stage.init or base_model))
    train, dropped = load_rl_split(data_dir, "train", tokenizer, stage.max_prompt_length)
    if dropped:
        console.print(f"{ctx.stage}: dropped {dropped} prompts longer than {stage.max_prompt_length} tokens")
    if len(train) == 0:
        raise ConfigError(f"stages.{ctx.stage}: no training prompt fits max_prompt_length={stage.max_prompt_length}")
    watch = UnscoredWatch(stage.unscored, [e.label for e in endpoints])
    resumed = resume_point(ctx.out_dir)
    log = StepLog(rewards_file(ctx.out_dir), resumed)
    funcs, weights = grpo_rewards(stage.reward, data_dir, watch, log)  # the judge reward, and the outcome if set
    args = grpo_args(stage, ctx, weights) | vllm_args(stage)
    config = GRPOConfig(**apply_overrides(GRPOConfig, args, stage.overrides, ctx.stage))
    model, lora, base = policy_model(stage, base_model)
    project_labelled_tokens_only()
    trainer = policy_sampling_trainer_class()(
        model=model,
        reward_funcs=[*funcs],  # a fresh list: TRL types its list of sync functions only
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=lora,
    )
    cheap_dropout_masks(trainer)
    trainer.train(resume_from_checkpoint=resumed)
    return save_final(trainer, tokenizer, ctx, base=base, trainer_name="trl-grpo")
