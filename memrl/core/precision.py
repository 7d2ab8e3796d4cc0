"""Which floating-point type a model computes in on this machine: bf16 where the hardware has bf16 instructions (a
GPU that supports it; a CPU with AVX512-BF16 or AMX), else fp32. One rule for training, sampling and serving, so a
policy is sampled at the precision its loss is computed at."""

from __future__ import annotations

from typing import Any


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX): then bf16 is faster, not emulated."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def compute_dtype(device: str) -> Any:
    """bf16 on a CUDA device that supports it and on a bf16-capable CPU, else fp32."""
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_bf16() else torch.float32
