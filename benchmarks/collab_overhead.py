"""Framework overhead of the collab environment, as ratios measured in one run.

1. Scripted zero-latency model (in-process): simulated turns per second; the cost of memrl itself (prompts,
   JSON parsing, checkers, grading, memory updates) with no model time at all.
2. Fixed-latency endpoint (50 ms per call, 32 requests in flight, Ray workers, the real `run_collab` path):
   sessions per second as a fraction of the ideal bound 32 / (0.05 s x calls per session).

    python benchmarks/collab_overhead.py [--users 32] [--sessions 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx2
from rich.console import Console

from memrl.envs.collab.agents import AgentKind, AgentMemory, CollabAgent, Reflector
from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import load_problems
from memrl.envs.collab.profiles import sample_profiles
from memrl.envs.collab.runner import run_collab
from memrl.envs.collab.session import SessionSpec, run_session
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.rollout.base import ChatBackend, Completion, Conversation, SamplingParams
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.serve import free_port

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from fixed_latency_server import CANNED  # noqa: E402


class ScriptedBackend(ChatBackend):
    """Answers instantly with the canned reply: zero model time, so only memrl's own work is measured."""

    name = "scripted"

    async def achat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        self.usage.record(completion := Completion(CANNED, 0, 0, "stop"))
        return completion

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        return [Completion(CANNED, 0, 0, "stop") for _ in conversations]


async def _scripted(users: int, sessions: int) -> dict[str, float]:
    backend = ScriptedBackend()
    params = SamplingParams(max_tokens=256)
    agent = CollabAgent(AgentKind.MEMORY, backend, params, Reflector(backend, params))
    grader = Grader()
    simulator = RuleUserSimulator(grader)
    problems = load_problems("arith", limit=sessions, seed=0)
    turns = 0

    async def one_user(profile: object) -> None:
        nonlocal turns
        memory = AgentMemory()
        for index, problem in enumerate(problems):
            spec = SessionSpec(profile, problem, index)  # type: ignore[arg-type]
            record, memory = await run_session(spec, agent, simulator, grader, memory)
            turns += sum(t["role"] == "assistant" for t in record["turns"])

    start = time.perf_counter()
    await asyncio.gather(*(one_user(p) for p in sample_profiles(users, 0)))
    elapsed = time.perf_counter() - start
    return {"turns": turns, "seconds": round(elapsed, 3), "turns_per_second": round(turns / elapsed, 1)}


def _fixed_latency(
    users: int, sessions: int, latency: float, in_flight: int, workers: int, out: Path
) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "fixed_latency_server.py"), "--port", str(port), "--latency", str(latency)]
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx2.get(f"{base}/health").status_code == 200:
                    break
            except httpx2.HTTPError:
                time.sleep(0.1)
        model = OpenAIModelConfig(backend="openai", model="fixed", endpoint=f"{base}/v1", max_concurrency=in_flight)
        cfg = CollabEvalConfig(
            users=users, sessions=sessions, model=model, max_in_flight=in_flight, workers=workers, eval_problems=100
        )
        run_dir = out / "fixed-latency-run"
        if run_dir.exists():
            for f in run_dir.glob("*.jsonl"):
                f.unlink()
        records = run_collab(cfg, run_dir, Console(stderr=True))
        calls = httpx2.get(f"{base}/stats").json()["served"]
        ceiling = asyncio.run(_client_ceiling(f"{base}/v1", in_flight, calls))
    finally:
        server.terminate()
        server.wait()
    window = max(r["finished_at"] for r in records) - min(r["started_at"] for r in records)
    per_session = calls / len(records)
    ideal = in_flight / (latency * per_session)
    actual = len(records) / window
    return {
        "sessions": len(records),
        "calls": calls,
        "calls_per_session": round(per_session, 2),
        "seconds": round(window, 3),
        "sessions_per_second": round(actual, 3),
        "ideal_sessions_per_second": round(ideal, 3),
        "fraction_of_ideal": round(actual / ideal, 3),
        # The bare client, same server, same requests in flight: the share of the ideal this machine allows.
        "client_only_fraction_of_ideal": round(ceiling / (in_flight / latency), 3),
    }


async def _client_ceiling(base_url: str, in_flight: int, calls: int) -> float:
    """Calls per second of the bare OpenAI client against the same server: what this machine allows at all."""
    from memrl.rollout.openai_http import OpenAIBackend

    backend = OpenAIBackend(model="fixed", base_url=base_url, max_concurrency=in_flight)
    messages: Conversation = [{"role": "user", "content": "hi"}]

    async def chain() -> None:
        for _ in range(calls // in_flight):
            await backend.achat(messages)

    start = time.perf_counter()
    await asyncio.gather(*(chain() for _ in range(in_flight)))
    return (calls // in_flight) * in_flight / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "scripted_zero_latency": asyncio.run(_scripted(args.users, args.sessions)),
        "fixed_latency_endpoint": _fixed_latency(
            args.users, args.sessions, args.latency, args.in_flight, args.workers, args.out
        ),
        "machine": {"cpus": os.cpu_count()},
    }
    (args.out / "collab_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
