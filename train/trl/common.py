"""What TRL's SFT and GRPO runs share beyond the HF Trainer's part (memrl.train.hf_trainer): prompt length, gradient
accumulation, the LoRA config, the fused LM head and dropout masks on CPU (`project_labelled_tokens_only`,
`cheap_dropout_masks`), the final save."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import CheckpointInfo
from memrl.core.errors import ConfigError
from memrl.core.files import atomic_write_text
from memrl.train.config import LoraConfig
from memrl.train.distributed import rank, world_size
from memrl.train.hf_trainer import TrainContext


def prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """Tokens of a chat prompt with the generation header. Newer tokenizers return a BatchEncoding, not a list."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if not isinstance(ids, list) else ids)


def accumulation_steps(total: int, micro: int, stage: str, what: str, processes: int | None = None) -> int:
    """Gradient accumulation that turns micro batches on each of `processes` devices (default: this launch's world
    size, 1 outside a launcher) into the stage's global batch."""
    processes = world_size() if processes is None else processes
    steps, remainder = divmod(total, micro * processes)
    if remainder:
        devices = f" x {processes} processes" if processes > 1 else ""
        raise ConfigError(f"stages.{stage}: {what} ({total}) must be a multiple of micro_batch_size ({micro}){devices}")
    return steps


# Every GRPO rollout's reward, a StepLog line each (step, key, reward, parts): the samples behind the curve's
# within-prompt slope (memrl.train.report). Each process of a launch scores its own share of a batch: its own file.
REWARDS_FILE = "rewards.jsonl"
REWARDS_FILES = "rewards*.jsonl"


def rewards_file(out_dir: Path) -> Path:
    r = rank()
    return out_dir / (REWARDS_FILE if r == 0 else f"rewards.rank{r}.jsonl")


class StepLog:
    """A JSON Lines file of what each optimizer step did, `{"step": N, ...}` a line, appended as the run trains; `step`
    is the step TRL logs its metrics under. A run resumed from `resumed` (its `checkpoint-N`) trains the steps after
    N again: their lines from the stopped run, and a torn last line, are dropped, so each step's lines are there once.
    """

    def __init__(self, path: Path, resumed: str | None = None) -> None:
        self.path = path
        kept = int(resumed.rpartition("-")[2]) if resumed else 0  # checkpoint-N: the steps through N are trained
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            keep = [line for line in lines if line.endswith("\n") and _line_step(line) <= kept]
            if len(keep) < len(lines):
                atomic_write_text(path, "".join(keep))

    def write(self, step: int, lines: Iterable[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.writelines(json.dumps({"step": step, **line}) + "\n" for line in lines)


def _line_step(line: str) -> float:
    """The step of a line of a StepLog; a line that is no record (a torn write) counts as past any checkpoint."""
    try:
        record = json.loads(line)
    except ValueError:
        return math.inf
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else math.inf


def peft_config(lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def project_labelled_tokens_only() -> None:
    """Make TRL's fused LM head project only the labelled positions on CPU, as it does on CUDA.

    The SFT and GRPO losses of TRL 1.16 go through a fused LM head that, off CUDA/XPU, projects every position of the
    batch (fixed tile shapes, for compiled backends such as Neuron) in fp32. Eager CPU compiles nothing, and the loss
    only reads the completion: a fifth of a quickstart SFT row. Projecting just those positions gives the same loss
    and makes an SFT step about 1.5x faster on 2 cores (benchmarks/README.md). TRL has no switch for it, so its device
    test is widened to the CPU; a TRL without that test is left as it is (this changes speed, never results).
    """
    import trl.trainer.utils as trl_utils

    device_test = getattr(trl_utils, "_use_triton", None)
    if device_test is None or getattr(device_test, "memrl_widened", False):
        return

    def projects_labelled_only(device: Any) -> bool:
        return device.type == "cpu" or bool(device_test(device))

    projects_labelled_only.memrl_widened = True  # type: ignore[attr-defined]
    trl_utils._use_triton = projects_labelled_only


def cheap_dropout_masks(trainer: Any) -> None:
    """A trainer that trains on the CPU draws its dropout masks (PEFT's LoRA dropout) a word at a time
    (memrl.core.dropout: the CPU's `bernoulli_` draws element by element off Intel); on a GPU nothing changes."""
    from memrl.core.dropout import cheap_dropout_on_cpu

    cheap_dropout_on_cpu(trainer.model, trainer.args.device)


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
