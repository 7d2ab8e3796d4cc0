"""Env overhead and endpoint-bound efficiency of the collab environment at 1, 2 and 4 Ray actors, in one run.

1. Scripted zero-latency model (in-process): simulated turns per second; the cost of memrl itself (prompts,
   JSON parsing, checkers, grading, memory updates) with no model time at all.
2. Fixed-latency endpoint (`fixed_latency_server.py`, 50 ms per call), through the real `run_collab` path (Ray
   actors, OpenAI client, streaming output), once per actor count. Per count: sessions per second; efficiency =
   ideal time (calls x latency / concurrency) / measured time, where concurrency = min(users, requests in flight);
   the time each call held its request slot beyond the latency (client, env, Ray, waiting for a core); and how
   many of the machine's cores were busy (Linux), which tells a saturated event loop from a saturated machine.
3. The bare OpenAI client, same server and concurrency, no env: the share of the ideal the client alone reaches.

With more users than requests in flight (the default: 64 users, 32 in flight, as the collab issue asks) a user
waits for a free request slot rather than a free slot waiting for a user, so the ideal bound is in flight / latency.

    python benchmarks/collab_overhead.py [--workers 1 2 4] [--users 64] [--in-flight 32] [--sessions 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from fixed_latency_server import CANNED, running_server, served  # noqa: E402


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
            turns += sum(t["role"] == "assistant" for t in record.turns)

    start = time.perf_counter()
    await asyncio.gather(*(one_user(p) for p in sample_profiles(users, 0)))
    elapsed = time.perf_counter() - start
    return {"turns": turns, "seconds": round(elapsed, 3), "turns_per_second": round(turns / elapsed, 1)}


def _fixed_latency(
    base: str, users: int, sessions: int, latency: float, in_flight: int, workers: int, run_dir: Path
) -> dict[str, float]:
    """One `run_collab` with `workers` Ray actors against the fixed-latency server at `base`."""
    model = OpenAIModelConfig(backend="openai", model="fixed", endpoint=f"{base}/v1", max_concurrency=in_flight)
    cfg = CollabEvalConfig(
        users=users, sessions=sessions, model=model, max_in_flight=in_flight, workers=workers, eval_problems=100
    )
    before, cores = served(base), BusyCores.start()
    records = run_collab(cfg, run_dir, Console(stderr=True))
    calls = served(base) - before
    if len(records) != users * sessions:  # a failed session is logged and skipped: the rates would mean nothing
        raise SystemExit(f"{workers} actor(s): {len(records)} of {users * sessions} sessions finished")
    window = max(r.finished_at for r in records) - min(r.started_at for r in records)
    concurrency = min(users, in_flight)  # each user runs its sessions, and each session its calls, one at a time
    ideal = calls * latency / concurrency
    start = min(r.started_at for r in records)
    # Actors start one by one (a process each, importing memrl): until the last one runs, fewer calls are in flight.
    skew = max(r.started_at for r in records if r.session == 0) - start
    return {
        "workers": workers,
        "sessions": len(records),
        "calls": calls,
        "calls_per_session": round(calls / len(records), 2),
        "seconds": round(window, 3),
        "ideal_seconds": round(ideal, 3),
        "sessions_per_second": round(len(records) / window, 3),
        "ideal_sessions_per_second": round(len(records) / ideal, 3),
        "efficiency": round(ideal / window, 3),
        # How long each call kept its request slot beyond the endpoint's latency: what memrl and the machine add.
        "slot_overhead_per_call_ms": round((window * concurrency / calls - latency) * 1e3, 2),
        "cores_busy": cores.busy() if cores else None,
        "actor_startup_skew_seconds": round(skew, 3),
    }


class BusyCores:
    """Busy CPU cores of the whole machine since `start()`, from /proc/stat (Linux only)."""

    def __init__(self) -> None:
        self._cpu, self._t0 = self._cpu_seconds(), time.perf_counter()

    @staticmethod
    def _cpu_seconds() -> float:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    def busy(self) -> float:
        return round((self._cpu_seconds() - self._cpu) / (time.perf_counter() - self._t0), 2)

    @classmethod
    def start(cls) -> BusyCores | None:
        return cls() if Path("/proc/stat").exists() else None


async def _client_ceiling(base_url: str, in_flight: int, calls: int, latency: float) -> float:
    """Calls per second of the bare OpenAI client against the same server: what the client alone reaches here."""
    from memrl.rollout.openai_http import OpenAIBackend

    backend = OpenAIBackend(model="fixed", base_url=base_url, max_concurrency=in_flight)
    messages: Conversation = [{"role": "user", "content": "hi"}]

    await backend.achat(messages)  # connect once before the clock starts

    async def chain(index: int) -> None:
        # Starts spread over one latency, as calls are in a steady state: started together, every reply would
        # arrive in one burst and wait for the loop to work through the others.
        await asyncio.sleep(latency * index / in_flight)
        for _ in range(calls // in_flight):
            await backend.achat(messages)

    start = time.perf_counter()
    await asyncio.gather(*(chain(i) for i in range(in_flight)))
    return (calls // in_flight) * in_flight / (time.perf_counter() - start)


def run(
    users: int, sessions: int, latency: float, in_flight: int, workers: Sequence[int], workdir: Path
) -> dict[str, Any]:
    """Both measurements; Ray starts once and serves every actor count in turn."""
    from memrl.envs.ray_start import start_ray

    result: dict[str, Any] = {"scripted_zero_latency": asyncio.run(_scripted(users, sessions))}
    print(f"scripted: {result['scripted_zero_latency']['turns_per_second']} turns/s", flush=True)
    rows = []
    with running_server(latency) as base, contextlib.ExitStack() as stack:
        start_ray(None, stack)
        for n in workers:
            rows.append(_fixed_latency(base, users, sessions, latency, in_flight, n, workdir / f"workers-{n}"))
            print(
                f"{n} actor(s): {rows[-1]['sessions_per_second']} sessions/s, efficiency {rows[-1]['efficiency']}, "
                f"{rows[-1]['slot_overhead_per_call_ms']} ms per call beyond the latency",
                flush=True,
            )
        calls = max(int(r["calls"]) for r in rows)
        ceiling = asyncio.run(_client_ceiling(f"{base}/v1", min(users, in_flight), calls, latency))
    result["fixed_latency_endpoint"] = {
        "users": users,
        "sessions_per_user": sessions,
        "latency_s": latency,
        "in_flight": in_flight,
        "by_workers": rows,
        # The bare client, same server, same requests in flight: the share of the ideal this machine allows.
        "client_only_efficiency": round(ceiling / (min(users, in_flight) / latency), 3),
    }
    return result


def table(result: dict[str, Any]) -> str:
    fixed = result["fixed_latency_endpoint"]
    lines = [
        "| Ray actors | sessions/s | ideal sessions/s | efficiency | per call beyond latency | cores busy | "
        "last actor started after |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in fixed["by_workers"]:
        lines.append(
            f"| {r['workers']} | {r['sessions_per_second']:.2f} | {r['ideal_sessions_per_second']:.2f} | "
            f"{r['efficiency']:.2f} | {r['slot_overhead_per_call_ms']:.1f} ms | {r['cores_busy']} | "
            f"{r['actor_startup_skew_seconds']:.2f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64, help="simulated users, each running its sessions in order")
    parser.add_argument("--sessions", type=int, default=3, help="sessions per user")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the server waits before each reply")
    parser.add_argument("--in-flight", type=int, default=32, help="requests in flight at most, all actors together")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="Ray actor counts, run in turn")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="collab-overhead-") as tmp:
        result = run(args.users, args.sessions, args.latency, args.in_flight, args.workers, Path(tmp))
    result["machine"] = {"cpus": os.cpu_count()}
    (args.out / "collab_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    ceiling = result["fixed_latency_endpoint"]["client_only_efficiency"]
    print(f"bare client, same server and concurrency: efficiency {ceiling}")


if __name__ == "__main__":
    main()
