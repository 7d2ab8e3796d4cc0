"""Reward throughput with the LLM coverage judge: one sample at a time vs the judge's concurrent path vs its cache.

The judge model is `fixed_latency_server.py` (every request answered after 50 ms with a valid verdict), reached
through the real path: `RewardScorer` (format reward, notes extraction) -> `LLMJudge` -> OpenAI backend -> HTTP.
N distinct reflections are scored three ways, each timed on its own:

1. sequential: one `RewardScorer.ascore` call per sample, awaited before the next, cache off;
2. concurrent: all N in one `ascore` call, so the judge keeps up to `--concurrency` requests in flight; a fresh
   disk cache (`JudgeCache`, SQLite) stores every verdict on the way;
3. cached: the same N again, every verdict read from that cache, no request sent (median of 5 passes).

Reports samples per second of each and the ratios concurrent/sequential and cached/sequential.

    python benchmarks/judge_throughput.py [--samples 64] [--concurrency 8] [--latency 0.05] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cpu_busy import write_result

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from fixed_latency_server import JUDGE_PREFIX, running_server, served  # noqa: E402

PREFERENCES = [
    ("Please keep it short.", "Keep answers under five sentences."),
    ("Use bullet points, not paragraphs.", "Format explanations as bullet points."),
    ("Tell me how sure you are.", "State a confidence level with the final answer."),
    ("Number the steps, please.", "Number every step of a solution."),
    ("Skip the pleasantries.", "Answer directly, without greetings or filler."),
    ("Show me an example first.", "Start with a worked example before the general rule."),
]


def samples(n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """n reflections in the reflection prompt's JSON contract, each distinct (so each is its own cache entry)."""
    completions, truths = [], []
    for i in range(n):
        picked = [PREFERENCES[(i + j) % len(PREFERENCES)] for j in range(1 + i % 3)]
        notes = "\n".join(f"- {note} (session {i})" for _, note in picked)
        reply = {"user_preferences_reasoning": f"The user objected {len(picked)} times.", "agent_notes": notes}
        completions.append(json.dumps(reply))
        truths.append({"enforcements": [said for said, _ in picked]})
    return completions, truths


def _scorer(base: str, cache_dir: Path | None, concurrency: int) -> Any:
    from memrl.rewards.config import JudgeConfig, RewardConfig
    from memrl.rewards.reward import RewardScorer
    from memrl.rollout.config import OpenAIModelConfig

    model = OpenAIModelConfig(
        backend="openai", model="fixed-judge", endpoint=f"{base}{JUDGE_PREFIX}v1", max_concurrency=concurrency
    )
    judge = JudgeConfig(
        kind="llm",
        model=model,
        cache=cache_dir is not None,
        cache_dir=str(cache_dir) if cache_dir else None,
    )
    return RewardScorer(RewardConfig(judge=judge))


async def _measure(base: str, n: int, concurrency: int, cache_dir: Path) -> dict[str, Any]:
    completions, truths = samples(n + 1)
    (warm_c, *completions), (warm_t, *truths) = completions, truths  # the warm-up sample is none of the n
    sequential = _scorer(base, None, concurrency)
    cached = _scorer(base, cache_dir, concurrency)
    for scorer in (sequential, cached):  # warm-up: imports, client connection, cache file
        await scorer.ascore([warm_c], [warm_t])
    out: dict[str, Any] = {}

    async def timed(
        name: str, scorer: Any, batches: list[tuple[list[str], list[dict[str, Any]]]], repeats: int = 1
    ) -> None:
        """Median over `repeats` passes (a cached pass takes milliseconds: one alone is mostly noise)."""
        before = served(base)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            parts = [p for c, t in batches for p in await scorer.ascore(c, t)]
            times.append(time.perf_counter() - start)
            if any(p.score is None for p in parts) or len(parts) != n:
                raise SystemExit(f"{name}: the judge failed on some samples")
        seconds = statistics.median(times)
        out[name] = {
            "seconds": round(seconds, 4),
            "samples_per_second": round(n / seconds, 2),
            "requests": served(base) - before,
        }
        print(f"{name}: {n} samples in {seconds:.3f} s ({n / seconds:.1f}/s)", flush=True)

    await timed("sequential", sequential, [([c], [t]) for c, t in zip(completions, truths, strict=True)])
    await timed("concurrent", cached, [(completions, truths)])
    await timed("cached", cached, [(completions, truths)], repeats=5)
    out["cache_hits_per_cached_pass"] = cached.judge.cache.hits // 5
    return out


def run(n: int, concurrency: int, latency: float) -> dict[str, Any]:
    with running_server(latency) as base, tempfile.TemporaryDirectory(prefix="judge-cache-") as tmp:
        result = asyncio.run(_measure(base, n, concurrency, Path(tmp)))
    seq = result["sequential"]["samples_per_second"]
    result["concurrent_over_sequential"] = round(result["concurrent"]["samples_per_second"] / seq, 2)
    result["cached_over_sequential"] = round(result["cached"]["samples_per_second"] / seq, 2)
    result["ideal_sequential_samples_per_second"] = round(1 / latency, 2)
    result["ideal_concurrent_over_sequential"] = min(concurrency, n)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64, help="reflections scored in each pass")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="judge requests in flight (the judge model's max_concurrency)"
    )
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the server waits before each reply")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    result = {
        "samples": args.samples,
        "concurrency": args.concurrency,
        "latency_s": args.latency,
        **run(args.samples, args.concurrency, args.latency),
        "machine": {"cpus": os.cpu_count()},
    }
    write_result(args.out, "judge_throughput", result)
    print(
        f"concurrent/sequential: {result['concurrent_over_sequential']}x "
        f"(ideal {result['ideal_concurrent_over_sequential']}x), "
        f"cached/sequential: {result['cached_over_sequential']}x"
    )


if __name__ == "__main__":
    main()
