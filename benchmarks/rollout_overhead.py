"""Rollout overhead: episodes/s of memrl's online-RL rollout path against a bare loop over the same collab episodes.

A scripted zero-latency policy (the agent's JSON with a fresh number in every reply, as sampled replies differ, so no
cache of the checkers or the grader serves a repeat; the replies are built and tokenized before the clock starts)
plays the rule user on the arithmetic set, so only memrl's own work is timed:

- **bare loop**: for each batch, the episodes of `collab_episodes` (the same `CollabEpisode`s) played with
  `envs.episode.play`, the canned reply read as the trainer reads it, all episodes of the batch gathered on one loop;
- **rollout path**: `train/online` `Player.play` on the same batches, what TRL's `rollout_func` runs: the prompt and
  every user turn rendered into the policy's chat template (SmolLM2's), the canned reply's tokens closed and decoded,
  trajectories with their env masks.

Each session is played `--group` times in a batch, as GRPO plays each prompt once per rollout of its group (the
recipes use 4 to 8), so both paths get the same repeated episodes. Both repeat `--repeats` times, interleaved; the
ratio is rollout-path episodes/s over bare-loop episodes/s (best repeat of each). Target: at least 0.8.

    python benchmarks/rollout_overhead.py [--users 4] [--sessions 4] [--group 4] [--max-turns 4] [--batch 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memrl.core.models import pull
from memrl.envs.collab.rl import CollabRLConfig, collab_episodes, episode_rows
from memrl.envs.episode import PolicyReply, play
from memrl.rollout.base import Message
from memrl.train.online.chat_tokens import TurnTokens
from memrl.train.online.rollout import Player

HERE = Path(__file__).parent
REPLY_TOKENS = 128


def canned(n: int) -> str:
    """The n-th scripted reply: the agent's JSON whose answer (a number the rule user grades) differs every time."""
    response = f"- Add the numbers.\n- The answer is {n}.\nTL;DR: {n}."
    reasoning = "The user gave the whole problem; answer it."
    return json.dumps({"user_preferences_reasoning": "None known yet.", "reasoning": reasoning, "response": response})


def bare(specs: list[str], batch: int, source: Any, loop: asyncio.AbstractEventLoop, replies: Iterator[str]) -> int:
    async def policy(observation: list[Message]) -> PolicyReply:
        return next(replies)

    async def run_batch(chunk: list[str]) -> None:
        episodes = [source(spec) for spec in chunk]

        async def one(e: Any) -> None:
            async def read(observation: list[Message]) -> PolicyReply:
                return e.read_reply(await policy(observation))  # the reply read as the trainer reads it

            await play(e.episode, read)
            e.episode.record()

        await asyncio.gather(*(one(e) for e in episodes))

    for start in range(0, len(specs), batch):
        loop.run_until_complete(run_batch(specs[start : start + batch]))
    return len(specs)


def rollout(
    specs: list[str], batch: int, player: Player, replies: Iterator[list[int]], loop: asyncio.AbstractEventLoop
) -> int:
    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], None]:
        return [next(replies) for _ in contexts], None

    done = 0
    for start in range(0, len(specs), batch):
        trajectories = player.play(specs[start : start + batch], generate, loop)
        done += sum(t.status == "done" for t in trajectories)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--group", type=int, default=4, help="episodes per session (the GRPO group)")
    parser.add_argument("--batch", type=int, default=16, help="episodes per rollout call (a GRPO generation batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    cfg = CollabRLConfig(users=args.users, sessions=args.sessions, max_turns=args.max_turns)
    specs = [spec for spec in episode_rows(cfg) for _ in range(args.group)]
    source = collab_episodes(cfg, REPLY_TOKENS)
    turns = TurnTokens.of(AutoTokenizer.from_pretrained(pull("smollm2")))
    needed = (len(specs) * args.repeats + args.batch) * args.max_turns  # every reply of every run, warm-up included
    texts = iter([canned(2 * n) for n in range(needed)])  # the two paths never share a reply
    ids = [
        [*turns.tokenizer.encode(canned(2 * n + 1), add_special_tokens=False), turns.end_of_turn] for n in range(needed)
    ]
    player = Player(source, turns, max_turn_tokens=max(map(len, ids)) + 8, max_episode_tokens=1 << 20)
    id_iter = iter(ids)
    loop = asyncio.new_event_loop()
    rollout(specs[: args.batch], args.batch, player, id_iter, loop)  # warm-up: template, regexes, sympy
    bare(specs[: args.batch], args.batch, source, loop, texts)
    best: dict[str, float] = {"bare": 0.0, "rollout": 0.0}
    for _ in range(args.repeats):
        for name in ("bare", "rollout"):
            start = time.perf_counter()
            if name == "bare":
                n = bare(specs, args.batch, source, loop, texts)
            else:
                n = rollout(specs, args.batch, player, id_iter, loop)
                assert n == len(specs), f"only {n} of {len(specs)} rollout episodes finished"
            best[name] = max(best[name], n / (time.perf_counter() - start))
    loop.close()
    result = {
        "episodes": len(specs),
        "group": args.group,
        "batch": args.batch,
        "max_turns": args.max_turns,
        "repeats": args.repeats,
        "bare_episodes_per_second": round(best["bare"], 1),
        "rollout_episodes_per_second": round(best["rollout"], 1),
        "rollout_over_bare": round(best["rollout"] / best["bare"], 3),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rollout_overhead.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
