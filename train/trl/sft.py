"""SFT warm-up with TRL's SFTTrainer: the loss covers the gold reflection only, never the prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.core.checkpoints import load_causal_lm, portable_ref, tokenizer_source
from memrl.core.errors import ConfigError
from memrl.core.outcomes import require_data
from memrl.train.config import SFTStage
from memrl.train.curves import LOSS_CURVE, loss_chart
from memrl.train.hf_trainer import TrainContext, apply_overrides, base_args, master_dtype, resume_point
from memrl.train.trl.common import (
    accumulation_steps,
    cheap_dropout_masks,
    peft_config,
    project_labelled_tokens_only,
    prompt_tokens,
    save_final,
)


def load_sft_split(data_dir: Path, split: str) -> Any:
    """The data_gen messages file as prompt/completion pairs (TRL then masks the prompt out of the loss)."""
    from datasets import load_dataset

    path = require_data(data_dir / "sft" / f"{split}.jsonl", "SFT data", "run the reflection_data stage first")
    data = load_dataset("json", data_files=str(path), split="train")
    return data.map(
        lambda row: {"prompt": row["messages"][:-1], "completion": row["messages"][-1:]},
        remove_columns=data.column_names,
    )


def train_sft(stage: SFTStage, base_model: str, data_dir: Path, ctx: TrainContext) -> Path:
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    train = load_sft_split(data_dir, "train")
    evaluation = load_sft_split(data_dir, "eval")
    accumulation = accumulation_steps(stage.batch_size, stage.micro_batch_size, ctx.stage, "batch_size")
    args = base_args(ctx, lr=stage.lr, checkpoints=stage.checkpoints)
    args.update(
        num_train_epochs=stage.epochs,
        max_steps=stage.max_steps or -1,
        per_device_train_batch_size=stage.micro_batch_size,
        per_device_eval_batch_size=stage.micro_batch_size,
        gradient_accumulation_steps=accumulation,
        warmup_ratio=stage.warmup_ratio,
        lr_scheduler_type=stage.lr_scheduler,
        max_length=stage.max_length,
        eval_strategy="epoch",
    )
    config = SFTConfig(**apply_overrides(SFTConfig, args, stage.overrides, ctx.stage))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(base_model))
    _check_some_fit(train, tokenizer, stage.max_length, ctx.stage)
    project_labelled_tokens_only()
    trainer = SFTTrainer(
        model=load_causal_lm(base_model, dtype=master_dtype(stage.lora is None)),
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        peft_config=peft_config(stage.lora) if stage.lora is not None else None,
    )
    cheap_dropout_masks(trainer)
    trainer.train(resume_from_checkpoint=resume_point(ctx.out_dir))
    final = save_final(trainer, tokenizer, ctx, base=portable_ref(base_model), trainer_name="trl-sft")
    if trainer.is_world_process_zero():
        loss_chart(trainer.state.log_history, ctx.out_dir / LOSS_CURVE, title=f"{ctx.run_name} (TRL SFT)")
    return final


def _check_some_fit(data: Any, tokenizer: Any, max_length: int, stage: str) -> None:
    """TRL drops samples whose completion is cut away entirely; fail clearly before it is left with none."""
    shortest = min(prompt_tokens(tokenizer, row["prompt"]) for row in data)
    if shortest >= max_length:
        raise ConfigError(
            f"stages.{stage}.max_length={max_length}: no SFT sample fits (the shortest prompt has {shortest} tokens)"
        )
