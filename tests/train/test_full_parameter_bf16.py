"""Full-parameter training of a bf16 checkpoint moves its weights at lr 1e-6.

transformers 5 loads a bf16 checkpoint as bf16; an optimizer step of 1e-6 on bf16 weights rounds away for all but
the weights nearest zero (about 1% of a random init), so a run "completes" flat. memrl's own loading path now gives
the trainer float32 master weights, as TRL does for a model it loads by name. One step on the tiny model through
each full-parameter path (TRL SFT, the GRPO policy, the judger) and the share of weights that changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memrl.train.config import GRPOStage, JudgerStage, SFTStage
from memrl.train.hf_trainer import TrainContext

LR = 1e-6  # the 7B recipes' SFT and GRPO learning rate


@pytest.fixture(scope="module")
def bf16_model(tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen2 saved in bf16, as Qwen2.5 and Llama 3.1 ship (config.json says bfloat16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16") / "model"
    AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_qwen2).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    return out


def changed_share(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The share of the weights (elements) whose value differs, across every tensor the two share by name."""
    names = sorted(set(before) & set(after))
    assert names, "no tensor in common"
    changed = sum(int((before[n].float() != after[n].float()).sum()) for n in names)
    return changed / sum(before[n].numel() for n in names)


def _sft_data(root: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"Reflect on session {i}."}, {"role": "assistant", "content": "ok"}]}
        for i in range(4)
    ]
    for split in ("train", "eval"):
        path = root / "sft" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_one_full_parameter_sft_step_at_lr_1e6_moves_the_weights(bf16_model: Path, tmp_path: Path) -> None:
    from memrl.train.trl.sft import train_sft

    stage = SFTStage(kind="sft", model="policy", data="d", lora=None, lr=LR, max_steps=1, batch_size=2,
                     micro_batch_size=2, max_length=64)  # fmt: skip
    final = train_sft(stage, str(bf16_model), _sft_data(tmp_path / "data"), TrainContext(tmp_path / "sft", "sft", 0,
                      "none", "bf16"))  # fmt: skip
    share = changed_share(load_file(bf16_model / "model.safetensors"), load_file(final / "model.safetensors"))
    assert share > 0.5, f"only {share:.1%} of the weights moved"


def test_the_full_parameter_grpo_policy_trains_float32_master_weights(bf16_model: Path) -> None:
    from memrl.core.attention import split_attention
    from memrl.train.trl.grpo import policy_model

    stage = GRPOStage(kind="grpo", model="policy", data="d", lora=None)
    model, lora, _ = policy_model(stage, str(bf16_model))
    assert lora is None and {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == split_attention()  # its rollouts decode with the split attention
    with_lora = GRPOStage(kind="grpo", model="policy", data="d")  # LoRA: the frozen base stays as stored
    assert {p.dtype for p in policy_model(with_lora, str(bf16_model))[0].parameters()} == {torch.bfloat16}


def test_one_full_parameter_judger_step_at_lr_1e6_moves_the_weights(bf16_model: Path, tmp_path: Path) -> None:
    from test_judger_model import write_pairs

    from memrl.train.judger.trainer import train_judger

    data = write_pairs(tmp_path / "pairs", train=4, evaluation=1)
    stage = JudgerStage(kind="judger", model="judger", head="yes_no", lr=LR, max_steps=1, batch_size=4,
                        micro_batch_size=4, max_length=96, alpha_dev_fraction=0,
                        selection={"retriever": None, "random_negatives": 0})  # fmt: skip
    final = train_judger(stage, str(bf16_model), data, TrainContext(tmp_path / "judger", "judger", 0, "none", "bf16"))
    share = changed_share(load_file(bf16_model / "model.safetensors"), load_file(final / "model.safetensors"))
    assert share > 0.5, f"only {share:.1%} of the weights moved"
