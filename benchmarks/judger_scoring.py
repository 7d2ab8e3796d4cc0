"""Memory-judger scoring throughput: the scorer's length-sorted batches vs one (dialogue, memory) pair at a time.

The judger is the cross_encoder head on the embedded all-MiniLM-L6-v2 with a fresh, untrained 1-logit classifier
(built the way `load_judger` builds one; training changes weights, not speed). M synthetic (dialogue, missing
slots, stored QA pair) inputs of varied length, like the TOD pipeline's candidates, are scored by
`JudgerScorer.score` with `--batch-size` and then one call per pair (batch_size 1); both must give the same
probabilities. Reports pairs per second of each and the ratio batched/one-at-a-time.

    python benchmarks/judger_scoring.py [--pairs 64] [--batch-size 32] [--max-length 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

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


def build_scorer(max_length: int) -> Any:
    """An untrained cross-encoder judger on the embedded MiniLM, on the CPU."""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    from memrl.core import models
    from memrl.rollout.judger.heads import build_head
    from memrl.rollout.judger.scorer import JudgerScorer

    path = models.resolve("all-minilm-l6-v2")
    logging.set_verbosity_error()  # the fresh classifier is the point: no "newly initialized" warning
    head = build_head("cross_encoder", AutoTokenizer.from_pretrained(path), max_length)
    return JudgerScorer(head.load_model(path), head, "cpu")


def run(m: int, batch_size: int, max_length: int) -> dict[str, Any]:
    import torch

    scorer = build_scorer(max_length)
    items = pairs(m)
    scorer.score(items[:batch_size], batch_size=batch_size)  # warm-up: allocator, kernels
    start = time.perf_counter()
    batched = scorer.score(items, batch_size=batch_size)
    batched_s = time.perf_counter() - start
    start = time.perf_counter()
    single = [p for item in items for p in scorer.score([item], batch_size=1)]
    single_s = time.perf_counter() - start
    diff = max(abs(a - b) for a, b in zip(batched, single, strict=True))
    if diff > 1e-3:
        raise SystemExit(f"batched and one-at-a-time scores differ by {diff:.2g}")
    return {
        "pairs": m,
        "batch_size": batch_size,
        "max_length": max_length,
        "torch_threads": torch.get_num_threads(),
        "batched": {"seconds": round(batched_s, 4), "pairs_per_second": round(m / batched_s, 1)},
        "one_at_a_time": {"seconds": round(single_s, 4), "pairs_per_second": round(m / single_s, 1)},
        "batched_over_one_at_a_time": round(single_s / batched_s, 2),
        "max_score_difference": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64, help="(dialogue, memory) pairs scored each way")
    parser.add_argument("--batch-size", type=int, default=32, help="JudgerScorer.score's default")
    parser.add_argument("--max-length", type=int, default=256, help="tokens per input (the judger stage default)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    result = {**run(args.pairs, args.batch_size, args.max_length), "machine": {"cpus": os.cpu_count()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "judger_scoring.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"batched: {result['batched']['pairs_per_second']} pairs/s, "
        f"one at a time: {result['one_at_a_time']['pairs_per_second']} pairs/s, "
        f"ratio {result['batched_over_one_at_a_time']}x"
    )


if __name__ == "__main__":
    main()
