"""A GRPO loss step of the CPU reflector with PEFT's LoRA dropout, memrl's word-mask dropout and none, in one run.

The step `reflector-quickstart` takes per optimizer step, minus the sampling: SmolLM2 with a rank-16 LoRA on every
linear layer (memrl's `peft_config`), `--batch` sequences of about the reflector's prompt + reply length, a forward
under the bf16 autocast the trainer uses where the cores have bf16, log-probabilities of the last `--completion`
tokens only (as TRL's loss reads them), and the backward. Each way runs `--repeats` times in turn; the fastest run
counts. Reported: seconds per step for each, and their ratios. PEFT draws a dropout mask over every LoRA layer's input,
prompt tokens included; how much PyTorch's `nn.Dropout` costs depends on the CPU's random-number path, which is why
memrl trains on CPU with `WordMaskDropout` (memrl.core.dropout), the same p.

    OMP_NUM_THREADS=2 python benchmarks/lora_dropout.py [--batch 8] [--tokens 420] [--completion 70]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from cpu_busy import cpu_model, machine, write_result

from memrl.core.dropout import cheap_dropout_on_cpu
from memrl.core.models import cpu_has_bf16, pull
from memrl.train.config import LoraConfig
from memrl.train.trl.common import peft_config

HERE = Path(__file__).parent


def step_seconds(model: Any, ids: torch.Tensor, completion: int, bf16: bool) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids, logits_to_keep=completion + 1).logits[:, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -completion:, None]).squeeze(-1)
    (-logps.mean()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a model memrl pulls (smollm2, tiny-qwen2, ...)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (2 prompts x 4 rollouts)")
    parser.add_argument("--tokens", type=int, default=420, help="tokens per sequence, prompt and reply")
    parser.add_argument("--completion", type=int, default=70, help="reply tokens the loss reads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    torch.manual_seed(0)
    path = str(pull(args.model))
    bf16 = cpu_has_bf16()
    runs: dict[str, float] = {}
    for way, dropout in (("nn.Dropout 0.05", 0.05), ("word mask 0.05", 0.05), ("none", 0.0)):
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model = get_peft_model(base, peft_config(LoraConfig(rank=16, alpha=32, dropout=dropout))).train()
        if way.startswith("word mask"):
            cheap_dropout_on_cpu(model, "cpu")
        ids = torch.randint(0, base.config.vocab_size, (args.batch, args.tokens))
        step_seconds(model, ids, args.completion, bf16)  # warm-up
        runs[way] = min(step_seconds(model, ids, args.completion, bf16) for _ in range(args.repeats))
        print(f"{way}: {runs[way]:.3f} s a step", flush=True)
    result = {
        "model": args.model,
        "bf16_autocast": bf16,
        "batch": args.batch,
        "tokens": args.tokens,
        "completion": args.completion,
        "step_s": {way: round(seconds, 4) for way, seconds in runs.items()},
        "word_mask_speedup": round(runs["nn.Dropout 0.05"] / runs["word mask 0.05"], 2),
        "no_dropout_speedup": round(runs["nn.Dropout 0.05"] / runs["none"], 2),
        "torch_threads": torch.get_num_threads(),
        "machine": machine(),
    }
    write_result(args.out, "lora_dropout", result)
    print(
        f"a loss step with the word-mask dropout: {result['word_mask_speedup']}x as fast as with nn.Dropout, without "
        f"dropout {result['no_dropout_speedup']}x ({args.batch} x {args.tokens} tokens, {cpu_model()})"
    )


if __name__ == "__main__":
    main()
