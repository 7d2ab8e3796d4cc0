"""TRL's GRPOTrainer, sampling its rollouts from the policy the loss trains, as a vLLM rollout would.

TRL's plain `model.generate` path samples with the model in train mode: every LoRA layer applies dropout to the
rollouts, and every decoding step runs the adapter beside its base layer. verl and TRL's vLLM path sample from merged
weights with no dropout. Here the same holds on `model.generate`: eval mode for the sampling, and on CPU the adapter
merged into a copy-restored base (decoding on a few cores is bound by the number of operations per token, so the
merged model decodes about 1.5x faster: benchmarks/README.md, "quickstart_stages.py"), in bf16 where the loss runs
under bf16 autocast. Imported only where TRL runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from trl import GRPOTrainer


@contextlib.contextmanager
def sampling_policy(model: Any, merge: bool, dtype: torch.dtype | None = None) -> Iterator[None]:
    """`model` in eval mode; with `merge`, a PEFT adapter folded into its base layers, which get back their exact
    weights afterwards (merge then unmerge alone would leave rounding drift in the base, step after step); with
    `dtype`, every parameter cast to it for the sampling and given back its own tensor afterwards (no rounding)."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    was_training = model.training
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if merge and isinstance(model, PeftModel):
        for layer in model.modules():
            if isinstance(layer, BaseTunerLayer):
                base: Any = layer.get_base_layer()
                params = (base.weight, getattr(base, "bias", None))
                saved += [(p, p.detach().clone()) for p in params if isinstance(p, torch.Tensor)]
        model.merge_adapter()
    model.eval()
    originals: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    if dtype is not None:
        originals = [(p, p.data) for p in model.parameters() if p.dtype != dtype]
        for param, data in originals:
            param.data = data.to(dtype)
    try:
        yield
    finally:
        for param, data in originals:
            param.data = data
        if saved:
            model.unmerge_adapter()
            with torch.no_grad():
                for tensor, original in saved:
                    tensor.copy_(original)
        model.train(was_training)


class PolicySamplingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose `model.generate` rollouts come from the trained policy without dropout (see the module)."""

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        if self.use_vllm:  # vLLM holds its own synced, merged copy of the weights
            return super()._generate_single_turn(*args, **kwargs)
        on_cpu = self.accelerator.device.type == "cpu"  # on a GPU the copy would cost memory for little speed
        # On CPU the loss runs under bf16 autocast where the cores have bf16 (hf_trainer.device_args); sampling in
        # bf16 too decodes about 1.7x faster than TRL's fp32 `generate` (benchmarks/README.md).
        dtype = torch.bfloat16 if on_cpu and self.args.bf16 else None
        with sampling_policy(self.model, on_cpu, dtype):
            return super()._generate_single_turn(*args, **kwargs)
