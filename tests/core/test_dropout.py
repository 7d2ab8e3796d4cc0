"""WordMaskDropout is dropout: each element zeroed with probability p, the rest scaled by 1 / (1 - p), the identity in
eval mode, its gradient the mask; swapped in for PEFT's LoRA dropout on CPU only."""

from __future__ import annotations

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from memrl.core.dropout import cheap_dropout_on_cpu, word_mask_dropout

WordMaskDropout = word_mask_dropout()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9])
def test_drops_each_element_with_probability_p_and_keeps_the_mean(p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_003  # not a multiple of four: the last word is cut
    out = WordMaskDropout(p).train()(torch.ones(n))
    dropped = float((out == 0).float().mean())
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(dropped - p) < 5 * sigma
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))
    assert abs(float(out.mean()) - 1) < 5 * sigma / (1 - p)


def test_the_draws_of_a_word_are_independent() -> None:
    """The four 16-bit slices of a word drop at p each and together as independent draws would."""
    torch.manual_seed(1)
    p, words = 0.25, 400_000
    out = WordMaskDropout(p).train()(torch.ones(words * 4)).view(words, 4) == 0
    for k in range(4):
        assert abs(float(out[:, k].float().mean()) - p) < 5 * math.sqrt(p * (1 - p) / words)
    both = float((out[:, 0] & out[:, 3]).float().mean())
    assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / words)


def test_a_seed_repeats_its_mask_and_eval_mode_is_the_identity() -> None:
    x = torch.randn(3, 7, 5)
    dropout = WordMaskDropout(0.3).train()
    torch.manual_seed(7)
    first = dropout(x)
    torch.manual_seed(7)
    assert torch.equal(dropout(x), first)
    assert not torch.equal(dropout(x), first)  # the generator moved on
    assert dropout.eval()(x) is x


def test_the_gradient_is_the_scaled_mask() -> None:
    torch.manual_seed(3)
    x = torch.randn(4, 9, requires_grad=True)
    out = WordMaskDropout(0.2).train()(x)
    out.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (out.detach() != 0).float() / 0.8)


def test_p_outside_zero_and_one_is_refused() -> None:
    for p in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            WordMaskDropout(p)


def test_lora_dropout_is_swapped_on_cpu_only(tiny_qwen2: str) -> None:
    def lora_model(dropout: float) -> torch.nn.Module:
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
        config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM")
        return get_peft_model(base, config).train()

    model = lora_model(0.05)
    layers = sum(1 for m in model.modules() if type(m) is torch.nn.Dropout)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert cheap_dropout_on_cpu(model, torch.device("cuda")) == 0  # a GPU keeps its own kernel
    assert cheap_dropout_on_cpu(model, "cpu") == layers > 0
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    assert {m.p for m in model.modules() if isinstance(m, WordMaskDropout)} == {0.05}
    assert model.state_dict().keys() == before.keys()  # an adapter saves what it saved before
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()  # trains through the swapped modules
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)
    assert cheap_dropout_on_cpu(lora_model(0.0), "cpu") == 0  # no dropout: PEFT's identity stays
