"""On CPU, TRL's fused LM head projects only the labelled positions once memrl widens its device test: the same
loss and gradients as projecting every position."""

from __future__ import annotations

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
