"""Train the memory judger on the HF Trainer: the head gives one logit per pair, `compute_loss` applies BCE.

A stage writes `final/`: the merged model (LoRA folded into the base, for plain loading) with its tokenizer,
`memrl_judger.json` (how to score with it) and, last, `memrl_checkpoint.json` (the stage finished). Distributed
runs save the LoRA adapter instead (merging a ZeRO-3 sharded model is the loader's job); `load_judger` reads both.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import CheckpointInfo, portable_ref, resolve_model
from memrl.core.errors import ConfigError
from memrl.rewards.bce import auto_pos_weight, judger_bce
from memrl.rollout.judger.heads import Head, build_head
from memrl.rollout.judger.scorer import JudgerInfo
from memrl.train.config import JudgerStage
from memrl.train.curves import LOSS_CURVE, loss_chart
from memrl.train.judger.data import Collator, PairsDataset, read_pairs, require_pairs
from memrl.train.judger.launch import deepspeed_config
from memrl.train.trl_common import TrainContext, apply_overrides, base_args, resume_point


def _trainer_class() -> type:
    from transformers import Trainer

    class JudgerTrainer(Trainer):
        """The HF Trainer with the judger's loss: BCE on the head's logit, positives weighted by `pos_weight`."""

        def __init__(self, *args: Any, head: Head, pos_weight: float | None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.head = head
            self.pos_weight = pos_weight
            # The loss is a per-batch mean: let the Trainer divide it over gradient accumulation itself.
            self.model_accepts_loss_kwargs = False

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            labels = inputs.pop("labels")
            logits = self.head.logits(model, inputs)
            loss = judger_bce(logits, labels, self.pos_weight)
            return (loss, {"logits": logits}) if return_outputs else loss

    return JudgerTrainer


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def train_judger(stage: JudgerStage, base_model: str, data_dir: Path, ctx: TrainContext) -> Path:
    """Train on `data_dir`'s train split; resume from the stage's last checkpoint; returns `final/`."""
    import torch
    from transformers import AutoTokenizer, TrainingArguments

    rows = read_pairs(require_pairs(data_dir, "train"))
    train = PairsDataset(rows)
    pos_weight = auto_pos_weight(train.labels) if stage.pos_weight == "auto" else stage.pos_weight
    world = world_size()
    per_step = stage.micro_batch_size * world
    if stage.batch_size % per_step:
        raise ConfigError(
            f"stages.{ctx.stage}: batch_size ({stage.batch_size}) must be a multiple of micro_batch_size "
            f"({stage.micro_batch_size}) x {world} GPU(s)"
        )
    args = base_args(
        ctx, lr=stage.lr, save_steps=stage.checkpoints.save_steps, logging_steps=stage.checkpoints.logging_steps
    )
    if stage.bf16 is not None:
        args["bf16"] = stage.bf16
    if stage.deepspeed is not None:
        if not torch.cuda.is_available():
            raise ConfigError(f"stages.{ctx.stage}.deepspeed: DeepSpeed needs CUDA GPUs; set it to null on CPU")
        args["deepspeed"] = str(deepspeed_config(stage.deepspeed))
    args.update(
        num_train_epochs=stage.epochs,
        max_steps=_max_steps(stage, len(train)),
        per_device_train_batch_size=stage.micro_batch_size,
        gradient_accumulation_steps=stage.batch_size // per_step,
        save_total_limit=2,
        remove_unused_columns=False,  # the collator tokenises JudgerInputs; nothing to drop
        label_names=["labels"],
    )
    if stage.warmup_ratio:  # as steps: transformers deprecates warmup_ratio
        args["warmup_steps"] = math.ceil(stage.warmup_ratio * _total_steps(stage, len(train)))
    # Built before the model: with ZeRO-3 the arguments make `from_pretrained` load the weights sharded.
    training_args = TrainingArguments(**apply_overrides(TrainingArguments, args, stage.overrides, ctx.stage))

    path = resolve_model(base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    head = build_head(stage.head, tokenizer, stage.max_length)
    # bf16 weights where an optimiser keeps fp32 copies (DeepSpeed) or only fp32 adapters train (LoRA).
    low_precision = torch.cuda.is_available() and bool(args["bf16"]) and (stage.lora or stage.deepspeed)
    model = head.load_model(path, dtype=torch.bfloat16 if low_precision else None)
    if stage.lora is not None:
        from peft import get_peft_model

        model = get_peft_model(model, _peft_config(stage, head))
    trainer = _trainer_class()(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=Collator(head),
        processing_class=tokenizer,
        head=head,
        pos_weight=pos_weight,
    )
    trainer.train(resume_from_checkpoint=resume_point(ctx.out_dir))
    return _save_final(trainer, tokenizer, stage, ctx, base=portable_ref(base_model))


def _total_steps(stage: JudgerStage, examples: int) -> int:
    """Optimizer steps of the run: `epochs` over the data, capped by `max_steps` (whichever ends first)."""
    steps = max(1, math.ceil(stage.epochs * math.ceil(examples / stage.batch_size)))
    return min(steps, stage.max_steps) if stage.max_steps is not None else steps


def _max_steps(stage: JudgerStage, examples: int) -> int:
    """The Trainer's max_steps: the cap when there is one (one recipe fits small and large data), else -1."""
    return _total_steps(stage, examples) if stage.max_steps is not None else -1


def _peft_config(stage: JudgerStage, head: Head) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    assert stage.lora is not None
    return PeftLoraConfig(
        r=stage.lora.rank,
        lora_alpha=stage.lora.alpha,
        lora_dropout=stage.lora.dropout,
        target_modules=stage.lora.target_modules,
        task_type=head.peft_task,
        modules_to_save=list(head.modules_to_save) or None,
    )


def _save_final(trainer: Any, tokenizer: Any, stage: JudgerStage, ctx: TrainContext, *, base: str) -> Path:
    """Merged model where this process holds all of it; the adapter under several processes. Info files last."""
    final = ctx.out_dir / "final"
    adapter = stage.lora is not None and world_size() > 1
    if stage.lora is not None and not adapter:
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(str(final))
    else:
        trainer.save_model(str(final))  # every rank takes part: ZeRO-3 gathers the shards here
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(final))
        (ctx.out_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        loss_chart(trainer.state.log_history, ctx.out_dir / LOSS_CURVE, title=f"{ctx.run_name} (judger BCE)")
        JudgerInfo(stage.head, base, stage.max_length, adapter).save(final)
        CheckpointInfo(base, f"judger-{stage.head}", ctx.stage, int(trainer.state.global_step), adapter).save(final)
    return final
