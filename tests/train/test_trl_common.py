"""On CPU, TRL's fused LM head projects only the labelled positions once memrl widens its device test: the same
loss and gradients as projecting every position."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trl_utils = pytest.importorskip("trl.trainer.utils")

from transformers import AutoModelForCausalLM  # noqa: E402

from memrl.train.trl.common import project_labelled_tokens_only  # noqa: E402


def _loss_and_grads(model: object, ids: object, labels: object) -> tuple[float, list[object]]:
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    return out.loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_labelled_only_projection_keeps_loss_and_gradients(tiny_qwen2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from trl.kernels.chunked_logprob import _use_triton as original  # the pinned TRL's device test

    cpu = torch.device("cpu")
    monkeypatch.setattr(trl_utils, "_use_triton", original)  # as TRL ships it (a TRL run earlier may have widened it)
    assert original(cpu) is False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    ids = torch.randint(3, model.config.vocab_size, (3, 24))
    labels = ids.clone()
    labels[:, :18] = -100  # a prompt, then the completion the loss reads
    labels[2, 18:21] = -100  # a shorter completion in the same batch

    every_position = _loss_and_grads(model, ids, labels)
    project_labelled_tokens_only()
    project_labelled_tokens_only()  # idempotent: widened once
    assert trl_utils._use_triton(cpu) is True
    assert trl_utils._use_triton.memrl_widened
    labelled_only = _loss_and_grads(model, ids, labels)

    assert labelled_only[0] == pytest.approx(every_position[0], rel=1e-5)
    assert len(labelled_only[1]) == len(every_position[1]) > 0
    for fast, full in zip(labelled_only[1], every_position[1], strict=True):
        assert torch.allclose(fast, full, atol=1e-5, rtol=1e-4)


def test_a_cpu_trainer_draws_lora_dropout_a_word_at_a_time(tiny_qwen2: str, tmp_path: Path) -> None:
    """What TRL's SFT and GRPO stages call after building their trainer: the adapter TRL wrapped trains on CPU with
    WordMaskDropout and saves the dropout its config asked for."""
    import json

    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from memrl.core.dropout import word_mask_dropout
    from memrl.train.trl.common import cheap_dropout_masks

    out = tmp_path
    rows = {"prompt": [[{"role": "user", "content": f"say {i}"}] for i in range(4)]}
    rows["completion"] = [[{"role": "assistant", "content": f"{i} {i} {i}"}] for i in range(4)]
    args = SFTConfig(str(out / "sft"), max_steps=1, per_device_train_batch_size=2, report_to="none", use_cpu=True)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32),
        args=args,
        train_dataset=Dataset.from_dict(rows),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    cheap_dropout_masks(trainer)
    swapped = [m for m in trainer.model.modules() if isinstance(m, word_mask_dropout())]
    assert swapped and not any(type(m) is torch.nn.Dropout for m in trainer.model.modules())
    trainer.train()
    assert trainer.state.global_step == 1
    trainer.save_model(str(out / "final"))
    assert json.loads((out / "final" / "adapter_config.json").read_text())["lora_dropout"] == 0.1
