"""What runs on the HF Trainer share (TRL's SFT and GRPO, the judger): trainer arguments, pass-through overrides,
resume, the finished mark."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import last_step_dir, trainer_saved
from memrl.core.errors import ConfigError, closest
from memrl.core.models import cpu_has_bf16
from memrl.core.yamlsafe import load_yaml
from memrl.train.config import LoggingTarget


@dataclass(frozen=True)
class TrainContext:
    """What a stage runner hands a trainer: where to write, how to log, the seed."""

    out_dir: Path
    stage: str
    seed: int
    report_to: str  # "wandb" or "none"
    run_name: str


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
    """`name=value` pairs set fields of the trainer's config class (TRL's, or `TrainingArguments`); unknown names
    fail before training starts."""
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


def resume_point(out_dir: Path) -> str | None:
    """The newest whole checkpoint of an interrupted run of this stage (resume continues the same data order); one
    whose save was cut short is passed over."""
    last = last_step_dir(out_dir, complete=trainer_saved)
    return str(last) if last is not None else None


def is_finished(out_dir: Path) -> bool:
    return (out_dir / "final" / "memrl_checkpoint.json").is_file()
