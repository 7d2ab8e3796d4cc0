"""Train the memory judger on the HF Trainer: the head gives one logit per pair, `compute_loss` applies BCE.

Training rows are the stage's `selection` of the train split (what evaluation ranks: the retrieved units of queries
with a positive); `alpha_dev_fraction` of the train individuals is kept out of training to choose the fusion alpha.
A stage writes `final/`: the merged model (LoRA folded into the base, for plain loading) with its tokenizer,
`memrl_judger.json` (how to score with it, with the chosen alpha) and, last, `memrl_checkpoint.json` (the stage
finished). Distributed runs save the LoRA adapter instead (merging a ZeRO-3 sharded model is the loader's job);
`load_judger` reads both.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import CheckpointInfo, portable_ref, resolve_model
from memrl.core.errors import ConfigError
from memrl.data_gen.judger_pairs import JudgerPair, read_pairs, write_pairs
from memrl.envs.tod.ranking import ALPHA_RULE, GAIN_K, alpha_within_noise
from memrl.rollout.judger.heads import Head, build_head
from memrl.rollout.judger.scorer import JudgerInfo
from memrl.train.config import JudgerStage
from memrl.train.curves import LOSS_CURVE, loss_chart
from memrl.train.distributed import rank, world_size
from memrl.train.hf_trainer import TrainContext, apply_overrides, base_args, master_dtype, resume_point
from memrl.train.judger.bce import auto_pos_weight, judger_bce
from memrl.train.judger.data import (
    PAIRS_FILE,
    Collator,
    PairsDataset,
    counts,
    require_pairs,
    retrieved_keys,
    select_pairs,
    split_dev,
)
from memrl.train.judger.deepspeed_zero import deepspeed_config


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


ALPHA_GRID = tuple(round(i / 10, 1) for i in range(11))
ALPHA_METRIC = f"recall@{GAIN_K}"  # the per-query recall `evaluate_judger` gives for each alpha of the sweep


def training_split(stage: JudgerStage, data_dir: Path, ctx: TrainContext) -> tuple[list[JudgerPair], list[JudgerPair]]:
    """(selected training rows, dev rows to choose the alpha on); the counts are printed once."""
    path = require_pairs(data_dir, "train")
    rows = read_pairs(path)
    train, dev = split_dev(rows, stage.alpha_dev_fraction, ctx.seed)
    sel = stage.selection
    kept = None
    if sel.retriever is not None:  # on every row, so the cache holds whatever the dev split
        cache = path.with_name(f"{path.name}.{sel.retriever}-top{sel.top_units}.kept.json")
        kept = retrieved_keys(rows, sel.retriever, sel.top_units, cache)
    selected = select_pairs(
        train,
        require_positive=sel.require_positive,
        kept=kept,
        random_negatives=sel.random_negatives,
        seed=ctx.seed,
        where=f"stages.{ctx.stage}.selection",
    )
    # Alpha is chosen on dev's recall@5, which only queries with a positive count towards and only the retrieved
    # pairs decide: scoring those alone gives the same rankings at a fraction of the judger's time.
    if any(r.label == 1 for r in dev):
        dev = select_pairs(dev, require_positive=True, kept=kept, random_negatives=0, seed=ctx.seed)
    else:
        dev = []
    if rank() == 0:
        from rich.console import Console

        dev_note = f"; alpha dev: {len({r.persona_id for r in dev})} individuals" if dev else ""
        if not dev and stage.alpha_dev_fraction > 0:
            dev_note = "; alpha not chosen: no dev individual with a positive pair (too few individuals?)"
        Console(stderr=True, soft_wrap=True).print(
            f"{ctx.stage}: training on {counts(selected).line()} of {counts(train).line()}{dev_note}"
        )
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        summary = {"selected": asdict(counts(selected)), "train": asdict(counts(train)), "dev": asdict(counts(dev)),
                   "pos_weight_auto": auto_pos_weight(r.label for r in selected)}  # fmt: skip
        (ctx.out_dir / "selection.json").write_text(json.dumps(summary, indent=2))
    return selected, dev


def train_judger(stage: JudgerStage, base_model: str, data_dir: Path, ctx: TrainContext) -> Path:
    """Train on `data_dir`'s train split; resume from the stage's last checkpoint; returns `final/`."""
    import torch
    from transformers import AutoTokenizer, TrainingArguments, set_seed

    rows, dev = training_split(stage, data_dir, ctx)
    train = PairsDataset(rows)
    pos_weight = auto_pos_weight(train.labels) if stage.pos_weight == "auto" else stage.pos_weight
    world = world_size()
    per_step = stage.micro_batch_size * world
    if stage.batch_size % per_step:
        raise ConfigError(
            f"stages.{ctx.stage}: batch_size ({stage.batch_size}) must be a multiple of micro_batch_size "
            f"({stage.micro_batch_size}) x {world} GPU(s)"
        )
    args = base_args(ctx, lr=stage.lr, checkpoints=stage.checkpoints)
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
    # bf16 weights where an optimiser keeps fp32 copies (DeepSpeed) or only fp32 adapters train (LoRA); float32
    # otherwise, also from a bf16 checkpoint, which transformers 5 would load as bf16 (see master_dtype).
    low_precision = torch.cuda.is_available() and bool(args["bf16"]) and (stage.lora or stage.deepspeed)
    # The head's new weights (a cross-encoder's classifier, LoRA's A) are drawn here, before the Trainer seeds:
    # seeded now, one seed is one run.
    set_seed(ctx.seed)
    model = head.load_model(path, dtype=torch.bfloat16 if low_precision else master_dtype(stage.lora is None))
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
    return _save_final(trainer, tokenizer, stage, ctx, base=portable_ref(base_model), dev=dev)


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


def _save_final(
    trainer: Any, tokenizer: Any, stage: JudgerStage, ctx: TrainContext, *, base: str, dev: list[JudgerPair]
) -> Path:
    """Merged model where this process holds all of it; the adapter under several processes. Info files last, the
    alpha chosen on `dev` (when there is one) between them."""
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
        if dev:
            alpha, rule = alpha_on_dev(final, dev, ctx.out_dir, stage)
            JudgerInfo(stage.head, base, stage.max_length, adapter, alpha, rule).save(final)
        CheckpointInfo(base, f"judger-{stage.head}", ctx.stage, int(trainer.state.global_step), adapter).save(final)
    return final


def alpha_on_dev(
    final: Path, dev: list[JudgerPair], out_dir: Path, stage: JudgerStage
) -> tuple[float | None, str | None]:
    """The fusion alpha of ALPHA_GRID chosen on the dev individuals, ranked as evaluation ranks, and how, in a few
    words: the smallest alpha whose per-query recall@5 is within the paired bootstrap noise of the best alpha's
    (`ranking.alpha_within_noise`). The sweep, each alpha's interval against the best and the rule go to
    `alpha_selection.json`; `dev_auc` is over the pairs scored (the retrieved ones and the positives). None: no
    recall to compare."""
    from memrl.train.judger.evaluate import evaluate_judger

    folder = out_dir / "alpha_dev"
    folder.mkdir(parents=True, exist_ok=True)
    pairs = write_pairs(dev, folder / PAIRS_FILE)
    retriever, top_units = stage.selection.retriever or "dense", stage.selection.top_units
    metrics = evaluate_judger(
        str(final), pairs, folder, retriever=retriever, top_units=top_units, alpha=0.5, alphas=ALPHA_GRID
    )
    per_query = metrics[f"alpha_sweep_{ALPHA_METRIC}_per_query"]
    choice = alpha_within_noise(
        {a: [math.nan if v is None else float(v) for v in per_query[str(a)]] for a in ALPHA_GRID}
    )
    note = None
    if choice.alpha is not None:
        note = (f"the smallest alpha within the dev noise of the best, alpha {choice.best} at {ALPHA_METRIC} "
                f"{choice.sweep[str(choice.best)]:.3f} over {choice.queries} dev queries")  # fmt: skip
    selection = {
        "alpha": choice.alpha,
        "rule": ALPHA_RULE,
        "best": choice.best,
        "metric": ALPHA_METRIC,
        "sweep": choice.sweep,
        "against_best": choice.against_best,
        "dev_individuals": len({r.persona_id for r in dev}),
        "dev_queries": metrics.get("queries"),
        "dev_queries_with_gold": choice.queries,
        "dev_auc": metrics.get("auc"),
        "retriever": retriever,
        "top_units": top_units,
    }
    (out_dir / "alpha_selection.json").write_text(json.dumps(selection, indent=2))
    return choice.alpha, note
