"""TRL's fused LM head on CPU: project only the positions the loss reads (see `project_labelled_tokens_only`).

Imported only where TRL runs (it imports TRL).
"""

from __future__ import annotations

from typing import Any


def project_labelled_tokens_only() -> None:
    """Make TRL's fused LM head project only the labelled positions on CPU, as it does on CUDA.

    The SFT and GRPO losses of TRL 1.16 go through a fused LM head that, off CUDA/XPU, projects every position of the
    batch (fixed tile shapes, for compiled backends such as Neuron) in fp32. Eager CPU compiles nothing, and the loss
    only reads the completion: a fifth of a quickstart SFT row. Projecting just those positions gives the same loss
    and makes an SFT step about 1.5x faster on 2 cores (benchmarks/README.md). TRL has no switch for it, so its device
    test is widened to the CPU; a TRL without that test is left as it is (this changes speed, never results).
    """
    import trl.trainer.utils as trl_utils

    device_test = getattr(trl_utils, "_use_triton", None)
    if device_test is None or getattr(device_test, "memrl_widened", False):
        return

    def projects_labelled_only(device: Any) -> bool:
        return device.type == "cpu" or bool(device_test(device))

    projects_labelled_only.memrl_widened = True  # type: ignore[attr-defined]
    trl_utils._use_triton = projects_labelled_only
