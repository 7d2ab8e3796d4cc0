"""Export a checkpoint as a standalone HF model: LoRA merged, safetensors, tokenizer, and a model card."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from memrl.core import models
from memrl.core.checkpoints import (
    is_adapter,
    is_verl_checkpoint,
    load_causal_lm,
    read_info,
    resolve_model,
    tokenizer_source,
)
from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel

EXPORT_FILE = "memrl_export.json"
CARD_FILE = "README.md"
PIPELINE_TAG = "text-generation"
UNKNOWN_LICENSE = "unknown"  # one of the Hub's license identifiers


class ExportConfig(StrictModel):
    """A checkpoint -> a standalone HF model folder (LoRA merged, tokenizer, model card)."""

    checkpoint: str = Field(description="a training stage of this recipe, or a checkpoint folder")


def export_checkpoint(checkpoint: Path, out: Path, *, lora_alpha: int | None = None) -> Path:
    """Write `out` (merged model + tokenizer + card) and return it. Built beside `out`, then renamed into place."""
    if not checkpoint.exists():
        raise ConfigError(f"checkpoint {checkpoint} does not exist")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        source = _as_hf_folder(checkpoint, staging / "verl", lora_alpha)
        model = load_causal_lm(str(source))
        model.save_pretrained(staging / "model")  # safetensors: transformers 5 writes nothing else
        _save_tokenizer(str(source), staging / "model")
        resolved = Path(resolve_model(str(source)))
        info = read_info(resolved)
        meta: dict[str, Any] = {
            "source": str(checkpoint.resolve()),
            "base": info.base if info else None,
            "trainer": info.trainer if info else None,
            "steps": info.steps if info else None,
            "merged_lora": is_adapter(resolved),
            # A fine-tune is under its base model's license; "unknown" where no card of the base is at hand.
            "license": base_license(info.base) if info else UNKNOWN_LICENSE,
            "evaluation": {},
        }
        (staging / "model" / EXPORT_FILE).write_text(json.dumps(meta, indent=2))
        (staging / "model" / CARD_FILE).write_text(model_card(out.name, meta))
        shutil.rmtree(out, ignore_errors=True)
        (staging / "model").rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _as_hf_folder(checkpoint: Path, scratch: Path, lora_alpha: int | None) -> Path:
    if not is_verl_checkpoint(checkpoint):
        return checkpoint
    from memrl.train.verl.merge import merge_verl_checkpoint

    return merge_verl_checkpoint(checkpoint, scratch, lora_alpha=lora_alpha)


def _save_tokenizer(source: str, out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tokenizer_source(source)).save_pretrained(out)


def record_evaluation(model_dir: Path, label: str, metrics: dict[str, Any]) -> None:
    """Add evaluation numbers to an exported model's metadata and card (no-op for folders memrl did not export)."""
    meta_path = model_dir / EXPORT_FILE
    if not meta_path.is_file():
        return
    meta = json.loads(meta_path.read_text())
    meta.setdefault("evaluation", {})[label] = metrics
    meta_path.write_text(json.dumps(meta, indent=2))
    (model_dir / CARD_FILE).write_text(model_card(model_dir.name, meta))


_SHOWN = ("n", "score", "coverage", "format", "judge_score", "hallucination_rate", "notes_tokens", "judge_failures")


def base_license(base: str) -> str:
    """The `license` of the base model's card where one is on this machine (a model folder, an embedded model, or
    the Hub cache): never a download."""
    card = _local_card(base)
    if card is None:
        return UNKNOWN_LICENSE
    from huggingface_hub import ModelCard

    try:
        license_id = ModelCard.load(card).data.license
    except (OSError, ValueError):  # an unreadable card, or YAML the Hub's parser rejects
        return UNKNOWN_LICENSE
    return str(license_id) if license_id else UNKNOWN_LICENSE


def _local_card(base: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    embedded = models.lookup(base)
    folder = models.model_dir(embedded) if embedded is not None else Path(base).expanduser()
    if folder.is_dir():
        return folder / CARD_FILE if (folder / CARD_FILE).is_file() else None
    try:
        cached = try_to_load_from_cache(base, CARD_FILE)
    except HFValidationError:  # not a repo id either
        return None
    return Path(cached) if isinstance(cached, str) else None


def model_card(name: str, meta: dict[str, Any]) -> str:
    from huggingface_hub import ModelCardData

    header = ModelCardData(
        library_name="transformers",
        pipeline_tag=PIPELINE_TAG,
        license=meta.get("license") or UNKNOWN_LICENSE,
        tags=["memrl", "reflection", "grpo"],
        base_model=meta.get("base") or None,
    )
    lines = [
        "---",
        header.to_yaml(),
        "---",
        f"# {name}",
        "",
        "A session-level reflection model trained with memrl: after a conversation it updates its notes about the "
        "user's interaction preferences, as a JSON object with `user_preferences_reasoning` and `agent_notes`.",
        "",
        f"- base model: {meta.get('base') or 'unknown'}",
        f"- trained with: {meta.get('trainer') or 'unknown'}, {meta.get('steps') or '?'} steps",
        f"- LoRA merged into the weights: {'yes' if meta.get('merged_lora') else 'no'}",
        f"- exported from: `{meta.get('source')}`",
        "",
        "## Evaluation",
        "",
    ]
    evaluation = meta.get("evaluation") or {}
    if not evaluation:
        lines.append("Not evaluated yet: `memrl eval reflector --model <this folder> ...` adds the numbers here.")
    else:
        lines += ["| eval set | " + " | ".join(_SHOWN) + " |", "|---" * (len(_SHOWN) + 1) + "|"]
        for label, metrics in evaluation.items():
            cells = [_cell(metrics.get(key)) for key in _SHOWN]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "Reward: coverage (judge 0-3 scaled to 0-1) + format (0-1); see memrl docs/rewards.md."]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)
