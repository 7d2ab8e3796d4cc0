"""Decoding on CPU with SDPA, eager and the split attention (`memrl.core.attention`), in one run on one model.

A batch of chat prompts about the length of the reflector's (a session and its instructions: ~380 tokens with
SmolLM2's template), left-padded as `HFBackend` pads them, is read (prefill: one new token) and then decoded for
`--new-tokens` greedy tokens, at the dtype memrl decodes in. Each implementation runs `--repeats` times in turn; the
fastest run counts. Reported per implementation: prefill seconds, decoding seconds per step, and the ratios the split
attention is judged by: its decoding against SDPA's and its prefill against eager's.

    OMP_NUM_THREADS=2 python benchmarks/cpu_attention.py [--model smollm2] [--batch 16] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from cpu_busy import machine, write_result

from memrl.core.attention import split_attention
from memrl.core.models import compute_dtype, pull

HERE = Path(__file__).parent
SENTENCES = [
    "I'm stuck on a problem about ages and sums; can you help me set it up?",
    "Give me one small step at a time and check with me before moving on.",
    "Please answer in plain words first, then show the numbers.",
    "That is too long: keep each reply to a few lines.",
    "Start with the answer, then explain how you got there.",
]


def prompts(batch: int, words: int) -> list[list[dict[str, str]]]:
    """`batch` user messages of about `words` words each, of uneven length (the batch pads, as real ones do)."""
    text = " ".join(SENTENCES * (words // 60 + 2)).split()
    return [[{"role": "user", "content": " ".join(text[: words - 7 * (i % 5)])}] for i in range(batch)]


def timed(model: Any, enc: dict[str, Any], new_tokens: int, pad: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    return time.perf_counter() - start


def measure(model: Any, enc: dict[str, Any], new_tokens: int, pad: int, repeats: int) -> dict[str, float]:
    timed(model, enc, 2, pad)  # warm-up
    prefill = min(timed(model, enc, 1, pad) for _ in range(repeats))
    whole = min(timed(model, enc, new_tokens + 1, pad) for _ in range(repeats))
    return {"prefill_s": round(prefill, 3), "decode_s_per_step": round((whole - prefill) / new_tokens, 4)}


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a model memrl pulls (smollm2, tiny-qwen2, ...)")
    parser.add_argument("--batch", type=int, default=16, help="prompts decoded together")
    parser.add_argument("--words", type=int, default=300, help="words per prompt (~380 tokens with the template)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    path = str(pull(args.model))
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts(args.batch, args.words)
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    dtype = compute_dtype("cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()
    runs: dict[str, dict[str, float]] = {}
    for name in ("sdpa", "eager", "split"):
        model.set_attn_implementation(split_attention() if name == "split" else name)
        runs[name] = measure(model, enc, args.new_tokens, pad, args.repeats)
        print(f"{name}: {runs[name]}", flush=True)
    result = {
        "model": args.model,
        "dtype": str(dtype).removeprefix("torch."),
        "batch": args.batch,
        "prompt_tokens": int(enc["input_ids"].shape[1]),
        "new_tokens": args.new_tokens,
        "runs": runs,
        "split_decode_over_sdpa": round(runs["sdpa"]["decode_s_per_step"] / runs["split"]["decode_s_per_step"], 2),
        "split_prefill_over_eager": round(runs["eager"]["prefill_s"] / runs["split"]["prefill_s"], 2),
        "torch_threads": torch.get_num_threads(),
        "machine": machine(),
    }
    write_result(args.out, "cpu_attention", result)
    print(
        f"split attention: decoding {result['split_decode_over_sdpa']}x SDPA's speed, prefill "
        f"{result['split_prefill_over_eager']}x eager's ({args.batch} prompts of {result['prompt_tokens']} tokens, "
        f"{result['dtype']})"
    )


if __name__ == "__main__":
    main()
