"""Seeded sampling whose draw for a row depends on the seed and that row's prompt, not on the rest of its batch.

`generate` in transformers samples a whole batch from the one global generator, so a row's tokens change with the
rows that share its batch. In-process batches form by timing (`MicroBatcher` gathers what arrives within 20 ms), so a
seeded run would not repeat itself. vLLM gives every request its own generator; this does the same in-process: each
row gets a generator seeded from (seed, prompt, how many identical prompts came before it in the call), and decoding
takes the argmax of the tempered, top-p filtered scores plus Gumbel noise from that generator. The argmax of scores
plus standard Gumbel noise is a sample of their softmax (the Gumbel-max trick), so the distribution is the one
`do_sample=True` draws from.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper


def row_seeds(seed: int, prompts: Sequence[str]) -> list[int]:
    """One seed per row: identical prompts in a call get different seeds, in their order of arrival."""
    seen: Counter[str] = Counter()
    seeds = []
    for prompt in prompts:
        digest = hashlib.sha256(f"{seed}\0{seen[prompt]}\0{prompt}".encode()).digest()
        seen[prompt] += 1
        seeds.append(int.from_bytes(digest[:8], "little") >> 1)  # torch seeds are at most 64 bits, signed-safe here
    return seeds


class RowSeededSampling(LogitsProcessor):
    """For greedy `generate` (`do_sample=False`): turns each step's scores into one sample per row."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, device: str | torch.device) -> None:
        warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(temperature)]
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = self.warpers(input_ids, scores)
        vocab = scores.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g, device=scores.device) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=torch.finfo(uniform.dtype).tiny)))
        return scores + gumbel  # type: ignore[return-value]  # a float tensor, as transformers' own processors return
