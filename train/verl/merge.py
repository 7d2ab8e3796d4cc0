"""verl FSDP checkpoints to Hugging Face folders, through verl's own model merger, with its LoRA alpha repaired.

verl's merger writes the base weights to the target folder and a trained LoRA adapter to `<target>/lora_adapter/`.
It takes the adapter's `lora_alpha` from `lora_train_meta.json`, which older checkpoints (and some save paths) lack;
it then writes `lora_alpha: 0`, an adapter that scales its update to nothing. `fix_lora_alpha` puts the real value
back (the recipe's, or the checkpoint's metadata) and records the base folder, so PEFT loads the adapter as trained.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from memrl.core.checkpoints import CheckpointInfo, is_adapter, last_step_dir, verl_shard_dir
from memrl.core.errors import ConfigError
from memrl.train.verl.overrides import CHECKPOINT_SUBDIR

LORA_META = "lora_train_meta.json"
ADAPTER_DIR = "lora_adapter"
ADAPTER_CONFIG = "adapter_config.json"
STEP_PREFIX = "global_step_"


def merge_command(local_dir: Path, target_dir: Path, *, python: str | None = None) -> list[str]:
    """verl 0.9.1's merger CLI for FSDP shards."""
    return [
        python or sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(local_dir),
        "--target_dir",
        str(target_dir),
    ]


def saved_lora_alpha(local_dir: Path) -> int | None:
    """The alpha verl recorded at training time, when it did (next to the shards, or in the step folder)."""
    for folder in (local_dir, local_dir.parent):
        meta = folder / LORA_META
        if meta.is_file():
            alpha = json.loads(meta.read_text()).get("lora_alpha")
            if isinstance(alpha, int | float) and alpha > 0:
                return int(alpha)
    return None


def fix_lora_alpha(target_dir: Path, *, lora_alpha: int | None = None, local_dir: Path | None = None) -> int | None:
    """Repair the adapter verl's merger wrote under `target_dir`; return its final alpha (None: no adapter).

    An alpha of 0 (or none) is replaced by `lora_alpha` (the recipe's), else by the checkpoint's metadata; a
    non-zero alpha is the training-time value and is kept.
    """
    config_path = target_dir / ADAPTER_DIR / ADAPTER_CONFIG
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text())
    alpha = config.get("lora_alpha") or 0
    if not alpha:
        alpha = lora_alpha or (saved_lora_alpha(local_dir) if local_dir is not None else None) or 0
        if not alpha:
            raise ConfigError(
                f"{config_path} has lora_alpha 0 and the checkpoint does not record the trained value: "
                "pass the recipe's LoRA alpha (--lora-alpha)"
            )
        config["lora_alpha"] = int(alpha)
    # The merger leaves the base unnamed; it wrote the base weights to target_dir, so name that folder.
    if not config.get("base_model_name_or_path"):
        config["base_model_name_or_path"] = str(target_dir.resolve())
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return int(alpha)


def merge_verl_checkpoint(
    checkpoint: Path, target_dir: Path, *, lora_alpha: int | None = None, log_path: Path | None = None
) -> Path:
    """Convert a verl FSDP checkpoint into `target_dir` and return what loads as the trained model: the repaired
    adapter folder for a LoRA run (its base is `target_dir`), else `target_dir` itself.

    For LoRA runs `target_dir` alone is the untrained base: always load the returned folder.
    """
    from memrl.train.verl.command import run_verl

    local_dir = verl_shard_dir(checkpoint)
    target_dir.mkdir(parents=True, exist_ok=True)
    log = log_path or target_dir.with_name(f"{target_dir.name}-merge.log")
    run_verl(merge_command(local_dir, target_dir), log)
    alpha = fix_lora_alpha(target_dir, lora_alpha=lora_alpha, local_dir=local_dir)
    return target_dir / ADAPTER_DIR if alpha is not None else target_dir


def save_final(out: Path, *, base: str, trainer: str, stage: str, lora_alpha: int | None) -> Path:
    """A finished verl run's `final/`: its last FSDP checkpoint merged (an adapter for LoRA runs, else the full
    model), with the checkpoint info written last, so that its presence means the stage finished."""
    merged = merge_verl_checkpoint(out / CHECKPOINT_SUBDIR, out / "merged", lora_alpha=lora_alpha)
    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(merged, final)
    last = last_step_dir(out / CHECKPOINT_SUBDIR, prefix=STEP_PREFIX)
    steps = int(last.name.removeprefix(STEP_PREFIX)) if last else 0
    CheckpointInfo(base, trainer, stage, steps, is_adapter(final)).save(final)
    return final
