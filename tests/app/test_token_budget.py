"""verl packs micro batches by tokens, with a per-GPU budget derived from the stage's lengths and
the arithmetic in the dry run (GRPO and collab took 64 micro-steps of fixed micro batches of 2 per update)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from memrl.app.recipe import load_recipe
from memrl.app.runner import plan_lines
from memrl.core.errors import ConfigError


def _dry_run(tmp_path: Path, recipe: str, stage: str, *overrides: str) -> str:
    loaded = load_recipe(recipe, [f"output_dir={tmp_path / 'run'}", *overrides]).recipe
    ctx = loaded.context(tmp_path / "run", Console(file=io.StringIO()))
    try:
        return "\n".join(plan_lines(loaded, ctx, stage))  # the verl command is checked against verl's config on the way
    finally:
        ctx.close()


def test_grpo_packs_micro_batches_by_tokens(tmp_path: Path) -> None:
    text = _dry_run(tmp_path, "reflector-qwen2.5-7b", "grpo")
    assert "actor_rollout_ref.actor.use_dynamic_bsz=true" in text
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=6144" in text
    assert "6144 tokens per GPU = 2 (micro_batch_size) x 3072; the longest sample is 3072 = 2048 prompt + 1024" in text
    # 64 prompts x 8 rollouts over the 4 training GPUs: 128 samples each; 4 of half the longest share a micro-step
    assert "an update is 128 samples per GPU (4 GPUs): 64 micro-steps when every sample is that long, about 32" in text
    assert "(fixed micro batches of 2: 64 whatever their length)" in text
    collab = _dry_run(tmp_path, "collaborator-qwen2.5-7b", "collab")
    assert "actor_rollout_ref.actor.use_dynamic_bsz=true" in collab and "16384 tokens per GPU = 2 (micro" in collab


def test_sft_packs_by_tokens_on_the_whole_node(tmp_path: Path) -> None:
    text = _dry_run(tmp_path, "reflector-qwen2.5-7b", "sft")
    assert "data.use_dynamic_bsz=true" in text and "data.max_token_len_per_gpu=32768" in text
    assert "--nproc_per_node=8" in text and "an update is 8 samples per GPU (8 GPUs)" in text


def test_a_budget_from_the_overrides_is_used_and_must_hold_the_longest_sample(tmp_path: Path) -> None:
    key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    text = _dry_run(tmp_path, "reflector-qwen2.5-7b", "grpo", f"stages.grpo.overrides=[{key}=24576]")
    assert "24576 tokens per GPU = set by the overrides" in text and "16 micro-steps when every sample" in text
    with pytest.raises(ConfigError, match=rf"{key}=2048 cannot hold the longest sample \(3072 tokens"):
        _dry_run(tmp_path, "reflector-qwen2.5-7b", "grpo", f"stages.grpo.overrides=[{key}=2048]")
