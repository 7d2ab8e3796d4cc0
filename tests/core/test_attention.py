"""The split attention decodes what SDPA decodes: same logits at every step of a left-padded batch, in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memrl.core.attention import NAME, decode_fast_on_cpu, split_attention

PROMPTS = ["a b c d e f g h i j k l", "hello", "one two three four"]


def _decode_logits(model: torch.nn.Module, enc: dict[str, torch.Tensor], pad: int) -> torch.Tensor:
    out = model.generate(  # type: ignore[operator]
        **enc,
        max_new_tokens=10,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=pad,
    )
    return torch.stack(out.logits)


@pytest.mark.parametrize("fixture", ["tiny_qwen2", "tiny_llama"])
def test_split_attention_decodes_as_sdpa_does(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokenizer.pad_token_id = pad
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert int(enc["attention_mask"].sum()) < enc["attention_mask"].numel()  # the batch is padded
    with torch.inference_mode():
        sdpa = _decode_logits(model, enc, pad)
        model.set_attn_implementation(split_attention())
        split = _decode_logits(model, enc, pad)
    assert model.config._attn_implementation == NAME
    assert split.shape == sdpa.shape
    torch.testing.assert_close(split, sdpa, atol=1e-4, rtol=1e-4)


def test_only_a_cpu_sdpa_model_is_switched(tiny_qwen2: str) -> None:
    sdpa = AutoModelForCausalLM.from_pretrained(tiny_qwen2, attn_implementation="sdpa")
    eager = AutoModelForCausalLM.from_pretrained(tiny_qwen2, attn_implementation="eager")
    decode_fast_on_cpu(sdpa)
    decode_fast_on_cpu(eager)
    assert sdpa.config._attn_implementation == NAME
    assert eager.config._attn_implementation == "eager"  # a choice someone made stays


def test_a_saved_model_does_not_name_the_split_attention(tiny_qwen2: str, tmp_path: Path) -> None:
    """The name is registered in this process only: a checkpoint that recorded it would not load elsewhere."""
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    decode_fast_on_cpu(model)
    model.save_pretrained(str(tmp_path))
    config = (tmp_path / "config.json").read_text()
    assert NAME not in config
