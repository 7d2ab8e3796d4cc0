"""Attention for decoding on CPU: SDPA for the prompt, plain matmul + softmax for each new token.

PyTorch's CPU SDPA kernel is slow for a single query row against a padded KV cache: on 2 AMD EPYC cores (SmolLM2-135M
in bf16, 16 prompts of 378 tokens) a decoding step took 136 ms with SDPA, 68 with transformers' `eager` attention and
40 with the split attention's matmul + softmax, in which the query heads of one key/value head read its cache in place
(58 when the cache was first repeated to every query head, as eager does), while eager read the prompts in 5.3 s where
SDPA took 3.3 (benchmarks/cpu_attention.py). The split attention takes each path where it is faster; either computes
the same attention, rounding aside.
"""

from __future__ import annotations

from typing import Any

NAME = "memrl_cpu_split"


def _split_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, Any]:
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or module.training:  # a prompt, or a training pass (its backward is SDPA's)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    # Each key/value head serves `groups` query heads: the query rows of a group read their head's cache in place,
    # as one matmul (repeating the cache to every query head, as SDPA's callers do, copies it at every step).
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)) * scale
    if attention_mask is not None:  # SDPA's mask, (batch, 1, 1, keys): True (or 0.0) where the token may be read
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask[..., : key.shape[-2]], float("-inf"))
        else:
            scores = scores + attention_mask[..., : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).reshape(batch, heads, 1, dim)
    return out.transpose(1, 2).contiguous(), weights.reshape(batch, heads, 1, -1)


def split_attention() -> str:
    """Register the split attention with transformers (once) and return its `attn_implementation` name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _split_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def decode_fast_on_cpu(model: Any) -> None:
    """Give a model on CPU whose attention is SDPA the split attention (a GPU keeps its own kernels)."""
    if model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return
    model.set_attn_implementation(split_attention())
