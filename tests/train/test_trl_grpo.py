"""TRL's GRPO: the grpo stage's `vllm` key (GRPOConfig fields TRL 1.16 accepts, one line where vLLM is missing), and
rollouts on `model.generate` from the trained policy: no LoRA dropout, the adapter's effect kept, and the base weights
bit-identical afterwards."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from memrl.core.errors import ConfigError
from memrl.train.config import GRPOStage
from memrl.train.trl.grpo import require_vllm, sampling_policy, vllm_args


def stage(**kwargs: object) -> GRPOStage:
    return GRPOStage.model_validate({"kind": "grpo", "model": "policy", "data": "data", **kwargs})


def test_vllm_key_gives_colocated_generation_that_grpo_config_accepts(tmp_path: Path) -> None:
    assert vllm_args(stage()) == {}  # default: TRL's own model.generate
    args = vllm_args(stage(vllm=True, max_prompt_length=1024, max_response_length=512))
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **args)
    assert (config.use_vllm, config.vllm_mode, config.vllm_max_model_length) == (True, "colocate", 1536)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_asked_for_without_vllm_is_one_line() -> None:
    require_vllm(stage(), "grpo")  # not asked for: nothing to check
    with pytest.raises(ConfigError, match=r"^stages\.grpo\.vllm: vLLM is not installed") as err:
        require_vllm(stage(vllm=True), "grpo")
    assert "\n" not in str(err.value)


def _adapted(path: str) -> object:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules="all-linear", init_lora_weights=False)
    adapted = peft.get_peft_model(model, lora)
    adapted.train()
    return adapted


def _logits(model: object, ids: object) -> object:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("merge", [True, False])
def test_sampling_is_the_dropout_free_policy_and_leaves_the_base_exact(tiny_qwen2: str, merge: bool) -> None:
    model = _adapted(tiny_qwen2)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.eval()
    policy = _logits(model, ids)  # the adapted model, no dropout
    with model.disable_adapter():
        base_only = _logits(model, ids)
    model.train()
    torch.manual_seed(1)
    assert not torch.allclose(_logits(model, ids), policy, atol=1e-4)  # train mode: dropout on the LoRA path

    with sampling_policy(model, merge=merge):
        assert not model.training
        sampled = _logits(model, ids)
        assert torch.equal(sampled, _logits(model, ids))  # no dropout left
    assert torch.allclose(sampled, policy, atol=1e-4)  # the adapter still acts (merged or beside its base)
    assert not torch.allclose(sampled, base_only, atol=1e-3)

    assert model.training
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), name  # bit-exact: no merge/unmerge drift
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_a_failed_sampling_still_restores_the_base(tiny_qwen2: str) -> None:
    model = _adapted(tiny_qwen2)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="sampling failed"), sampling_policy(model, merge=True):
        raise RuntimeError("sampling failed")
    assert model.training
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_a_full_model_is_only_put_in_eval_mode(tiny_qwen2: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    model.train()
    with sampling_policy(model, merge=True):
        assert not model.training
    assert model.training


def test_sampling_in_bf16_gives_every_parameter_back_its_own_fp32_tensor(tiny_qwen2: str) -> None:
    """Where the loss runs under bf16 autocast, the rollouts are sampled in bf16: inside, every parameter is bf16
    and the policy is the adapted one within bf16 rounding; afterwards each parameter is its fp32 self again, the
    same tensor objects, so the optimizer's state and the trainable weights lose nothing."""
    model = _adapted(tiny_qwen2)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    model.eval()
    policy = _logits(model, ids)
    model.train()
    before = {name: (p, p.data, p.detach().clone()) for name, p in model.named_parameters()}
    with sampling_policy(model, merge=True, dtype=torch.bfloat16):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        sampled = _logits(model, ids).float()
    drift = (sampled - policy).abs().max() / policy.abs().max()
    assert 0 < drift < 0.03  # bf16 rounding (about 1% here), nothing more
    for name, param in model.named_parameters():
        same, data, value = before[name]
        assert param is same and param.data.data_ptr() == data.data_ptr() and torch.equal(param, value), name
