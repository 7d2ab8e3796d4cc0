"""Memory-judger scoring throughput for the three heads: batched scoring, one pair at a time, and the bare forward.

Each head runs on an embedded model with a fresh, untrained head (built the way `load_judger` builds one; training
changes weights, not speed): `cross_encoder` on all-MiniLM-L6-v2, `seq_cls` on tiny-qwen2, `yes_no` on
tiny-llama. M synthetic (dialogue, missing slots, stored QA pair) inputs of varied length, like the TOD pipeline's
candidates, are scored three ways, each pass repeated `--repeats` times in turn and the fastest kept:

- **batched**: `JudgerScorer.score(items, batch_size)`, everything included (prompt rendering, tokenization,
  batching, the forward, the sigmoid, the reordering);
- **one at a time**: one `score([item], batch_size=1)` call per pair;
- **bare forward**: the physical limit, the model alone on the same tokens: the scorer's own batches (at most
  `batch_size` pairs of similar token counts, padded) are made beforehand, and only the head's forward is timed;
- **tokenize**: `head.tokenize(items)` alone, the largest part of what batched adds to the bare forward.

Batched and one-at-a-time probabilities must agree to 1e-3. Reports pairs per second of each, batched as a
fraction of the bare forward, batched over one at a time, and the milliseconds of tokenization (and whether the
causal heads' prompts were spliced from pre-tokenized fixed text).

    python benchmarks/judger_scoring.py [--pairs 64] [--batch-size 32] [--repeats 10] [--heads ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpu_busy import machine, write_result

HERE = Path(__file__).parent

# head -> (embedded base model, max_length): the tiny models' 1k-token BPE vocabulary makes prompts ~3x longer
HEADS: dict[str, tuple[str, int]] = {
    "cross_encoder": ("all-minilm-l6-v2", 256),
    "seq_cls": ("tiny-qwen2", 512),
    "yes_no": ("tiny-llama", 512),
}

SLOTS = {
    "date": ("What date is the reservation for?", ["March 3rd", "next Friday", "the 12th", "Sunday"]),
    "time": ("What time is the reservation?", ["6 pm", "7:30 pm", "noon", "8 pm"]),
    "party_size": ("How many people are coming?", ["2", "4", "6", "8"]),
    "city": ("Which city is the restaurant in?", ["San Jose", "Oakland", "Berkeley", "Fremont"]),
    "destination": ("Where is the ride going?", ["the airport", "Union Station", "the stadium"]),
}
UTTERANCES = [
    "I'd like to book a table again, like last time.",
    "Sure, which restaurant would you like?",
    "The same Italian place we went to before, La Piazza.",
    "Great choice. Anything else I should know?",
    "We might bring a couple of friends, and one of them is vegetarian.",
    "Noted. Do you want an outdoor seat if the weather is good?",
    "Yes please, somewhere quiet if possible.",
]


def pairs(m: int, seed: int = 0) -> list[Any]:
    """m judger inputs: dialogues of 1-7 turns, 1-3 missing slots, one stored QA pair each."""
    from memrl.rollout.judger.inputs import JudgerInput

    rng = random.Random(seed)
    out = []
    for _ in range(m):
        turns = [
            {"speaker": "user" if i % 2 == 0 else "assistant", "utterance": UTTERANCES[i]}
            for i in range(rng.randint(1, len(UTTERANCES)))
        ]
        missing = rng.sample(sorted(SLOTS), rng.randint(1, 3))
        slot = rng.choice(sorted(SLOTS))
        question, answers = SLOTS[slot]
        intent = "reserve a table at La Piazza" if slot != "destination" else "book a ride"
        out.append(JudgerInput(turns, missing, question, rng.choice(answers), intent, slot))
    return out


def build_scorer(head_name: str, max_length: int) -> Any:
    """An untrained judger with this head on its embedded base model, on the CPU."""
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging

    from memrl.core import models
    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.scorer import JudgerScorer

    path = models.resolve(HEADS[head_name][0])
    logging.set_verbosity_error()  # the fresh head is the point: no "newly initialized" warning
    torch.manual_seed(0)
    head = build_head(head_name, AutoTokenizer.from_pretrained(path), max_length)
    return JudgerScorer(head.load_model(path), head, "cpu")


def bare_batches(scorer: Any, items: list[Any], batch_size: int) -> list[dict[str, Any]]:
    """The model inputs of the scorer's own batches, made beforehand: what the bare forward reads."""
    return [batch for _, batch in scorer.batches(items, batch_size)]


def fastest(passes: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Seconds of each pass, the fastest of `repeats` rounds (the passes take turns, so load hits them alike)."""
    best = dict.fromkeys(passes, float("inf"))
    for _ in range(repeats):
        for name, run in passes.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def run_head(head_name: str, m: int, batch_size: int, repeats: int) -> dict[str, Any]:
    import torch

    base, max_length = HEADS[head_name]
    scorer = build_scorer(head_name, max_length)
    items = pairs(m)
    batches = bare_batches(scorer, items, batch_size)
    scorer.score(items[:batch_size], batch_size=batch_size)  # warm-up: allocator, kernels

    def bare() -> None:
        with torch.inference_mode():
            for batch in batches:
                scorer.head.logits(scorer.model, batch)

    batched: list[float] = []
    single: list[float] = []
    seconds = fastest(
        {
            "bare_forward": bare,
            "batched": lambda: batched.__setitem__(slice(None), scorer.score(items, batch_size=batch_size)),
            "one_at_a_time": lambda: single.__setitem__(
                slice(None), [p for item in items for p in scorer.score([item], batch_size=1)]
            ),
            "tokenize": lambda: scorer.head.tokenize(items),
        },
        repeats,
    )
    diff = max(abs(a - b) for a, b in zip(batched, single, strict=True))
    if diff > 1e-3:
        raise SystemExit(f"{head_name}: batched and one-at-a-time scores differ by {diff:.2g}")
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)
    return {
        "base": base,
        "max_length": max_length,
        "tokens": tokens,
        "padded_tokens": padded,
        **{name: {"seconds": round(s, 4), "pairs_per_second": round(m / s, 1)} for name, s in seconds.items()},
        "tokenize_ms": round(seconds["tokenize"] * 1e3, 2),
        "spliced": getattr(scorer.head, "splicer", None) is not None,
        "batched_over_bare_forward": round(seconds["bare_forward"] / seconds["batched"], 3),
        "batched_over_one_at_a_time": round(seconds["one_at_a_time"] / seconds["batched"], 2),
        "max_score_difference": diff,
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64, help="(dialogue, memory) pairs scored each way")
    parser.add_argument("--batch-size", type=int, default=32, help="JudgerScorer.score's default")
    parser.add_argument("--repeats", type=int, default=10, help="rounds of the three passes; the fastest counts")
    parser.add_argument("--heads", nargs="+", choices=list(HEADS), default=list(HEADS))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    heads = {name: run_head(name, args.pairs, args.batch_size, args.repeats) for name in args.heads}
    result = {
        "pairs": args.pairs,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "heads": heads,
        "machine": machine(),
    }
    write_result(args.out, "judger_scoring", result)
    for name, r in heads.items():
        print(
            f"{name}: batched {r['batched']['pairs_per_second']} pairs/s = {r['batched_over_bare_forward']} of the "
            f"bare forward ({r['bare_forward']['pairs_per_second']}), {r['batched_over_one_at_a_time']}x one at a "
            f"time ({r['one_at_a_time']['pairs_per_second']}); tokenize {r['tokenize_ms']} ms"
            + (", spliced" if r["spliced"] else "")
        )


if __name__ == "__main__":
    main()
