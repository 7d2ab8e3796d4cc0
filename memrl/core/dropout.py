"""Dropout for training on CPU whose mask takes one random 64-bit word per four elements.

PyTorch draws a CPU dropout mask (`bernoulli_`) with MKL's vectorised generator only where `cpuinfo` names the vendor
Intel; elsewhere it draws one element at a time under the generator's lock (aten/src/ATen/native/cpu/
DistributionKernels.cpp). On 2 AMD EPYC cores PEFT's dropout over the inputs of a LoRA on every linear layer was 43%
of the forward of a GRPO loss step. `WordMaskDropout` cuts each random word into four 16-bit draws and drops an element
whose draw falls in the lowest p share of the 2^16 values: the same dropout, with p rounded to a multiple of 1/65536
(0.05 drops 0.0500031 of the elements). benchmarks/lora_dropout.py times a loss step with each.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

SLICES = 65536  # the values a 16-bit draw takes


@cache
def word_mask_dropout() -> type[nn.Module]:
    """The `WordMaskDropout` module class, defined on first use: torch loads with it, never on import of memrl.core."""
    import torch
    from torch import nn

    class WordMaskDropout(nn.Module):
        """`nn.Dropout(p)` in effect (train mode: each element zeroed with probability p, the rest scaled by
        1 / (1 - p); eval mode: the identity), its mask cut from 64-bit words of the default generator."""

        def __init__(self, p: float) -> None:
            super().__init__()
            if not 0 < p < 1:
                raise ValueError(f"dropout probability must lie strictly between 0 and 1, got {p}")
            self.p = p
            self.threshold = round(p * SLICES) - SLICES // 2  # int16 draws below this are dropped
            self.scale = 1 / (1 - p)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.training:
                return x
            n = x.numel()
            # random_(-2**63, None) fills every bit of each word (PyTorch's full 64-bit range path).
            words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), None)
            keep = words.view(torch.int16)[:n].view(x.shape) >= self.threshold
            return x * keep.to(x.dtype).mul_(self.scale)  # one product forward, one backward

        def extra_repr(self) -> str:
            return f"p={self.p}"

    return WordMaskDropout


def cheap_dropout_on_cpu(model: nn.Module, device: Any) -> int:
    """Swap each `nn.Dropout` of `model` with 0 < p < 1 for a `WordMaskDropout` of the same p when `device` (where
    training runs) is the CPU; a GPU keeps its own kernel. Returns how many were swapped."""
    import torch
    from torch import nn

    if torch.device(device).type != "cpu":
        return 0
    swaps = [
        (parent, name, child.p)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Dropout and 0 < child.p < 1
    ]
    cls = word_mask_dropout()
    for parent, name, p in swaps:
        setattr(parent, name, cls(p))
    return len(swaps)
