"""Rollout overhead: episodes/s of memrl's online-RL rollout path against a bare loop over the same collab episodes,
in-process and with the users on Ray actors; and the rollout's efficiency with a fixed-latency endpoint as policy.

1. A scripted zero-latency policy (the agent's JSON with a fresh number in every reply, as sampled replies differ,
   so no cache of the checkers or the grader serves a repeat; the replies are built and tokenized before the clock
   starts) plays the rule user on the arithmetic set, so only memrl's own work is timed:

   - **bare loop**: for each batch, the episodes of `in_process` (the same `CollabEpisode`s) played with
     `envs.episode.play`, the canned reply read as the trainer reads it, all episodes of the batch gathered on one
     loop;
   - **rollout path**: `train/online` `Player.play` on the same batches, what TRL's `rollout_func` runs: the prompt
     and every user turn rendered into the policy's chat template (SmolLM2's), the canned reply's tokens closed and
     decoded, trajectories with their env masks;
   - **actor path**: the same `Player.play` with the episodes on `--workers` Ray actors (`envs/episode_actors.py`,
     what `env.workers` selects): each round one call per actor carrying its episodes.

   Each session is played `--group` times in a batch, as GRPO plays each prompt once per rollout of its group (the
   recipes use 4 to 8). All paths repeat `--repeats` times, interleaved; each ratio is a path's episodes/s over the
   bare loop's (best repeat of each). Target for the in-process rollout path: at least 0.8.

2. A fixed-latency endpoint as the policy (`fixed_latency_server.py`, `--latency` per call): each round, every live
   episode's context is decoded and sent as one OpenAI chat request (the openai async client, all of the round's
   requests in flight together), and the reply tokenized. Efficiency, as in `collab_overhead.py`: ideal time
   (calls x latency / in flight, in flight = the batch) / measured time, for the in-process and the actor path.

    python benchmarks/rollout_overhead.py [--users 4] [--sessions 4] [--group 4] [--max-turns 4] [--batch 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cpu_busy import write_result

from memrl.core.models import pull
from memrl.envs.collab.rows import CollabRLConfig
from memrl.envs.episode import PolicyReply, play
from memrl.rollout.base import Message
from memrl.train.online.chat_tokens import TurnTokens
from memrl.train.online.episodes import episode_rows, episode_source, in_process
from memrl.train.online.rollout import Generate, Player

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from fixed_latency_server import running_server, served  # noqa: E402

REPLY_TOKENS = 128
PATHS = ("bare", "rollout", "actors")


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


def scripted(replies: Iterator[list[int]]) -> Generate:
    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], None]:
        return [next(replies) for _ in contexts], None

    return generate


def rollout(specs: list[str], batch: int, player: Player, generate: Generate, loop: asyncio.AbstractEventLoop) -> int:
    done = 0
    for start in range(0, len(specs), batch):
        trajectories = player.play(specs[start : start + batch], generate, loop)
        done += sum(t.status == "done" for t in trajectories)
    return done


class EndpointPolicy:
    """A `Generate` asking an OpenAI endpoint: every context of the round decoded and sent at once, replies
    tokenized as the policy's; `rounds` and `in_flight` (the most requests sent together) for the ideal time, and
    `seconds` spent in it (the policy's own time: the client, decoding, tokenizing)."""

    def __init__(self, base_url: str, turns: TurnTokens, loop: asyncio.AbstractEventLoop) -> None:
        import openai

        self.turns, self.loop = turns, loop
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key="EMPTY", max_retries=0, http_client=openai.DefaultAioHttpClient()
        )
        self.rounds = self.in_flight = 0
        self.seconds = 0.0

    async def _ask(self, context: list[int]) -> list[int]:
        text = self.turns.tokenizer.decode(context)
        reply = await self.client.chat.completions.create(model="fixed", messages=[{"role": "user", "content": text}])
        content = reply.choices[0].message.content or ""
        return [*self.turns.tokenizer.encode(content, add_special_tokens=False), self.turns.end_of_turn]

    def __call__(self, contexts: list[list[int]]) -> tuple[list[list[int]], None]:
        async def together() -> list[list[int]]:
            return list(await asyncio.gather(*(self._ask(c) for c in contexts)))

        self.rounds += 1
        self.in_flight = max(self.in_flight, len(contexts))
        start = time.perf_counter()
        replies = self.loop.run_until_complete(together())
        self.seconds += time.perf_counter() - start
        return replies, None

    def bare(self, rounds: int, in_flight: int) -> float:
        """Seconds the client alone takes for `rounds` rounds of `in_flight` requests sent together (no env)."""

        async def together() -> None:
            await asyncio.gather(*(self._ask([self.turns.end_of_turn] * 256) for _ in range(in_flight)))

        start = time.perf_counter()
        for _ in range(rounds):
            self.loop.run_until_complete(together())
        return time.perf_counter() - start

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())


def endpoint_efficiency(
    base: str, specs: list[str], batch: int, player: Player, latency: float, loop: asyncio.AbstractEventLoop
) -> dict[str, Any]:
    """One pass of the Player over `specs` with the fixed-latency endpoint as the policy."""
    policy = EndpointPolicy(f"{base}/v1", player.turns, loop)
    try:
        policy([[player.turns.end_of_turn]])  # connect once before the clock starts
        policy.rounds, policy.seconds = 0, 0.0
        before, start = served(base), time.perf_counter()
        done = rollout(specs, batch, player, policy, loop)
        seconds = time.perf_counter() - start
        calls = served(base) - before
        client = policy.bare(policy.rounds, policy.in_flight)
    finally:
        policy.close()
    if done != len(specs):
        raise SystemExit(f"only {done} of {len(specs)} episodes finished against the endpoint")
    ideal = calls * latency / batch  # every round sends all of its batch's live episodes at once
    return {
        "episodes": done,
        "calls": calls,
        "rounds": policy.rounds,
        "in_flight": policy.in_flight,
        "seconds": round(seconds, 3),
        "ideal_seconds": round(ideal, 3),
        "efficiency": round(ideal / seconds, 3),
        # What each round adds to the latency: the client, prompts decoded, replies tokenized, the users' turns, Ray.
        "per_round_beyond_latency_ms": round((seconds / policy.rounds - latency) * 1e3, 2),
        "policy_seconds": round(policy.seconds, 3),  # of which inside the Generate function (client and tokenizer)
        # The bare client, the same rounds of requests sent together, no env: the share of the ideal it allows here.
        "client_only_efficiency": round(policy.rounds * latency / client, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--group", type=int, default=4, help="episodes per session (the GRPO group)")
    parser.add_argument("--batch", type=int, default=16, help="episodes per rollout call (a GRPO generation batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="Ray actors of the actor path")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the policy endpoint takes per call")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from transformers import AutoTokenizer

    cfg = CollabRLConfig(users=args.users, sessions=args.sessions, max_turns=args.max_turns)
    specs = [spec for spec in episode_rows(cfg) for _ in range(args.group)]
    turns = TurnTokens.of(AutoTokenizer.from_pretrained(pull("smollm2")))
    needed = (len(specs) * args.repeats + args.batch) * args.max_turns  # every reply of a path, warm-up included
    texts = iter([canned(len(PATHS) * n) for n in range(needed)])  # the paths never share a reply

    def ids(path: int) -> Iterator[list[int]]:
        encode = turns.tokenizer.encode
        return iter(
            [
                [*encode(canned(len(PATHS) * n + path), add_special_tokens=False), turns.end_of_turn]
                for n in range(needed)
            ]
        )

    replies = {"rollout": ids(1), "actors": ids(2)}
    with contextlib.ExitStack() as stack:
        local = in_process(cfg, REPLY_TOKENS)
        remote = episode_source(cfg.model_copy(update={"workers": args.workers}), REPLY_TOKENS)
        stack.callback(remote.close)
        players: dict[str, Player] = {}
        for name, source in (("rollout", local), ("actors", remote)):
            players[name] = Player(source, turns, max_turn_tokens=REPLY_TOKENS + 64, max_episode_tokens=1 << 20)
        loop = asyncio.new_event_loop()
        stack.callback(loop.close)
        for name in ("rollout", "actors"):  # warm-up: template, regexes, sympy, the actors' imports
            rollout(specs[: args.batch], args.batch, players[name], scripted(replies[name]), loop)
        bare(specs[: args.batch], args.batch, local, loop, texts)
        best = dict.fromkeys(PATHS, 0.0)
        for _ in range(args.repeats):
            for name in PATHS:
                start = time.perf_counter()
                if name == "bare":
                    n = bare(specs, args.batch, local, loop, texts)
                else:
                    n = rollout(specs, args.batch, players[name], scripted(replies[name]), loop)
                    assert n == len(specs), f"only {n} of {len(specs)} {name} episodes finished"
                best[name] = max(best[name], n / (time.perf_counter() - start))
        with running_server(args.latency) as base:
            endpoint = {
                name: max(
                    (
                        endpoint_efficiency(base, specs, args.batch, players[name], args.latency, loop)
                        for _ in range(args.repeats)
                    ),
                    key=lambda r: r["efficiency"],
                )
                for name in ("rollout", "actors")
            }
    result = {
        "episodes": len(specs),
        "group": args.group,
        "batch": args.batch,
        "max_turns": args.max_turns,
        "repeats": args.repeats,
        "workers": args.workers,
        "bare_episodes_per_second": round(best["bare"], 1),
        "rollout_episodes_per_second": round(best["rollout"], 1),
        "rollout_over_bare": round(best["rollout"] / best["bare"], 3),
        "actor_episodes_per_second": round(best["actors"], 1),
        "actors_over_bare": round(best["actors"] / best["bare"], 3),
        "fixed_latency_policy": {
            "latency_s": args.latency,
            "in_process": endpoint["rollout"],
            "actors": endpoint["actors"],
        },
    }
    write_result(args.out, "rollout_overhead", result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
