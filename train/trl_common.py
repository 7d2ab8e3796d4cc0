"""What TRL's SFT and GRPO runs share: trainer arguments, pass-through overrides, resume, the final save."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import CheckpointInfo, last_step_dir, trainer_saved
from memrl.core.errors import ConfigError, closest
from memrl.core.precision import cpu_has_bf16
from memrl.core.yamlsafe import load_yaml
from memrl.train.config import LoggingTarget, LoraConfig
from memrl.train.distributed import world_size


@dataclass(frozen=True)
class TrainContext:
    """What a stage runner hands a trainer: where to write, how to log, the seed."""

    out_dir: Path
    stage: str
    seed: int
    report_to: str  # "wandb" or "none"
    run_name: str


def prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """Tokens of a chat prompt with the generation header. Newer tokenizers return a BatchEncoding, not a list."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if not isinstance(ids, list) else ids)


def device_args() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"bf16": torch.cuda.is_bf16_supported(), "fp16": False}
    # CPU: bf16 autocast where the cores have bf16 instructions (about 1.3x faster measured on 2 cores of a
    # Zen 4 EPYC), else fp32; no dataloader workers, the machine has few cores to share; no gradient checkpointing
    # (TRL's default): it recomputes every forward during backward to save memory, and on a CPU the compute is what
    # is short (the quickstart's SFT: 125 s -> 94 s). `overrides: [gradient_checkpointing=true]` brings it back.
    return {
        "use_cpu": True,
        "bf16": cpu_has_bf16(),
        "fp16": False,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": False,
    }


def master_dtype(full_parameter: bool) -> Any:
    """The dtype to load a model that is about to train in: float32 when every weight trains, else the checkpoint's
    own (None). transformers 5 loads a bf16 checkpoint (Qwen2.5, Llama 3.1) as bf16, and the optimizer then updates
    the bf16 weights in place: a step of lr 1e-6 is far below half a bf16 step of a typical weight and rounds away.
    TRL loads a model it is given by name in float32 for this reason (`create_model_from_path`); memrl hands it a
    loaded one, so it asks for float32 itself. The trainer's `bf16` still runs the forward and backward under bf16
    autocast. LoRA keeps the frozen base as stored: PEFT upcasts the adapters it trains to float32."""
    import torch

    return torch.float32 if full_parameter else None


def accumulation_steps(total: int, micro: int, stage: str, what: str, processes: int | None = None) -> int:
    """Gradient accumulation that turns micro batches on each of `processes` devices (default: this launch's world
    size, 1 outside a launcher) into the stage's global batch."""
    processes = world_size() if processes is None else processes
    steps, remainder = divmod(total, micro * processes)
    if remainder:
        devices = f" x {processes} processes" if processes > 1 else ""
        raise ConfigError(f"stages.{stage}: {what} ({total}) must be a multiple of micro_batch_size ({micro}){devices}")
    return steps


def base_args(ctx: TrainContext, *, lr: float, checkpoints: LoggingTarget) -> dict[str, Any]:
    return {
        "output_dir": str(ctx.out_dir),
        "learning_rate": lr,
        "save_steps": checkpoints.save_steps,
        "save_strategy": "steps",
        "save_total_limit": checkpoints.keep,  # the newest N checkpoint-*/ folders; older ones are deleted
        "logging_steps": checkpoints.logging_steps,
        "report_to": ctx.report_to,
        "run_name": ctx.run_name,
        "seed": ctx.seed,
        "data_seed": ctx.seed,
        **device_args(),
    }


def apply_overrides(config_cls: type, args: dict[str, Any], overrides: Sequence[str], stage: str) -> dict[str, Any]:
    """`name=value` pairs set fields of the TRL config class; unknown names fail before training starts."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    out = dict(args)
    for item in overrides:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"stages.{stage}.overrides: {item!r} is not name=value")
        if name not in fields:
            match = closest(name, fields)
            hint = f" (did you mean {match!r}?)" if match else ""
            raise ConfigError(f"stages.{stage}.overrides: {config_cls.__name__} has no field {name!r}{hint}")
        out[name] = load_yaml(raw, f"stages.{stage}.overrides: {item!r}", ConfigError) if raw.strip() else ""
    return out


def peft_config(lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def resume_point(out_dir: Path) -> str | None:
    """The newest whole checkpoint of an interrupted run of this stage (resume continues the same data order); one
    whose save was cut short is passed over."""
    last = last_step_dir(out_dir, complete=trainer_saved)
    return str(last) if last is not None else None


def save_final(trainer: Any, tokenizer: Any, ctx: TrainContext, *, base: str, trainer_name: str) -> Path:
    """Write `final/` atomically enough: the info file goes last, so its presence means the stage finished."""
    final = ctx.out_dir / "final"
    trainer.save_model(str(final))  # on every rank: a sharded model is gathered here
    if not trainer.is_world_process_zero():  # one of several processes: rank 0 writes the rest
        return final
    tokenizer.save_pretrained(str(final))
    (ctx.out_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    adapter = (final / "adapter_config.json").is_file()
    CheckpointInfo(base, trainer_name, ctx.stage, int(trainer.state.global_step), adapter).save(final)
    return final


def is_finished(out_dir: Path) -> bool:
    return (out_dir / "final" / "memrl_checkpoint.json").is_file()
