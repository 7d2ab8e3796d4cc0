"""Collab sessions per minute against the local `transformers serve`, quiet and with the CPU oversubscribed.

The served path of a collab run in small: `run_collab` with the rule user, the agent on SmolLM2 served once by memrl
(`transformers serve --continuous-batching`, streamed requests with the progress deadline) to two Ray workers
(`workers: 2`; without it, a local run loads the model in its own process, the quickstart's path since issue 30),
every user at once.
It runs once on a quiet machine and once beside k x cores busy-loop processes for each k in `--loads`. For each
run: sessions finished, sessions failed, wall time, sessions per minute, and the ratio to the quiet run beside the
share of the CPU a fair scheduler leaves to the run, 1 / (1 + k). The target: every session finishes at every load,
and the ratio stays at or above that share.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cpu_busy import write_result
from rich.console import Console

from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.runner import collab_run
from memrl.envs.driver import FAILED_FILE

HERE = Path(__file__).parent


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """`n` processes that each keep one core busy for as long as the block runs."""
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.join()


def _config(users: int, sessions: int, in_flight: int) -> CollabEvalConfig:
    """The quickstart data stage's collab settings (recipes/quickstart.yaml), at `users` x `sessions`."""
    return CollabEvalConfig.model_validate(
        {
            "agent": "none",
            "simulator": "rule",
            "users": users,
            "sessions": sessions,
            "max_turns": 2,
            "max_in_flight": in_flight,
            "workers": 2,  # the served path: without workers, an hf model loads in the run's own process
            "split": "train",
            "model": {"backend": "hf", "model": "smollm2"},
            "sampling": {"agent": {"temperature": 0.7, "max_tokens": 48, "seed": 0}},
        }
    )


def one_run(load: int, users: int, sessions: int, in_flight: int, workdir: Path) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    out = workdir / f"load-{load}"
    with busy_loops(load * cores):
        started = time.monotonic()
        try:
            run = collab_run(_config(users, sessions, in_flight), out, Console(stderr=True))
            finished, error = len(run.records), run.fault
        except Exception as exc:  # a run that dies is a measurement too: nothing finished
            finished, error = 0, str(exc)
        seconds = time.monotonic() - started
    failed_file = out / FAILED_FILE
    failed = len(failed_file.read_text().splitlines()) if failed_file.exists() else 0
    return {
        "load": load,
        "busy_processes": load * cores,
        "planned": users * sessions,
        "finished": finished,
        "failed_attempts": failed,
        "error": error,
        "seconds": round(seconds, 1),
        "sessions_per_minute": round(60 * finished / seconds, 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def run(loads: Sequence[int], users: int, sessions: int, in_flight: int) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="serving-load-") as tmp:
        for load in [0, *loads]:
            rows.append(one_run(load, users, sessions, in_flight, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    quiet = rows[0]["sessions_per_minute"] or float("nan")
    for row in rows:
        row["ratio_to_quiet"] = round(row["sessions_per_minute"] / quiet, 3)
        row["cpu_share_left"] = round(1 / (1 + row["load"]), 3)
        row["meets_target"] = row["finished"] == row["planned"] and row["ratio_to_quiet"] >= row["cpu_share_left"]
    sizes = {"users": users, "sessions_per_user": sessions, "max_in_flight": in_flight}
    return {**sizes, "cpus": os.cpu_count(), "runs": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| busy processes | sessions done | failed attempts | seconds | sessions/min | ratio to quiet | "
        "CPU share left |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['busy_processes']} ({r['load']}x) | {r['finished']}/{r['planned']} | {r['failed_attempts']} | "
            f"{r['seconds']:.0f} | {r['sessions_per_minute']:.2f} | {r['ratio_to_quiet']:.2f} | "
            f"{r['cpu_share_left']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=4, help="simulated users, all at once")
    parser.add_argument("--sessions", type=int, default=1, help="sessions per user, in order")
    parser.add_argument("--in-flight", type=int, default=20, help="requests in flight (the quickstart's 20)")
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 2, 3], help="busy loops per core, in turn")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args.loads, args.users, args.sessions, args.in_flight)
    write_result(args.out, "serving_load", result)
    print(table(result))


if __name__ == "__main__":
    main()
