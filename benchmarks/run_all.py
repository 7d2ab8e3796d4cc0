"""Run every benchmark in turn (each in its own process, on the CPU) and write one markdown table of their ratios.

Each benchmark writes its JSON under the output folder; this driver then reads those files and writes
`bench.md` there (one row per measurement: what it compares and the ratio measured in this run) and prints it.
`make bench` runs this.

    python benchmarks/run_all.py [--out benchmarks/results] [--quick] [--only collab_overhead judge_throughput ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

# benchmark -> extra arguments (full, quick)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "collab_overhead": ([], ["--users", "8", "--sessions", "2"]),
    "collab_grpo_step": ([], ["--steps", "2", "--users", "2", "--max-turn-tokens", "16"]),
    "cpu_attention": ([], ["--batch", "4", "--words", "100", "--new-tokens", "16", "--repeats", "1"]),
    "judge_throughput": ([], ["--samples", "32"]),
    "lora_dropout": ([], ["--batch", "2", "--tokens", "128", "--completion", "16", "--repeats", "1"]),
    "judger_scoring": ([], ["--pairs", "32", "--repeats", "2"]),
    "pahf_memory": ([], ["--quick"]),
    "rollout_overhead": ([], ["--users", "8", "--sessions", "2", "--repeats", "2"]),
}

Row = tuple[str, str, str, str]  # measurement, what it compares, ratio, detail


def _collab_rows(r: dict[str, Any]) -> list[Row]:
    fixed = r["fixed_latency_endpoint"]
    conc = min(fixed["users"], fixed["in_flight"])
    latency_ms = round(fixed["latency_s"] * 1e3)
    rows: list[Row] = []
    for w in fixed["by_workers"]:
        n = w["workers"]
        rows.append(
            (
                f"collab env, {n} Ray actor{'s' if n > 1 else ''}",
                f"efficiency: ideal time (calls x {latency_ms} ms / {conc} in flight) / measured time",
                f"{w['efficiency']:.2f}",
                f"{w['sessions_per_second']:.2f} sessions/s of {w['ideal_sessions_per_second']:.2f} ideal; "
                f"{w['slot_overhead_per_call_ms']:.1f} ms per call beyond the latency; {w['cores_busy']} cores busy; "
                f"last actor started {w['actor_startup_skew_seconds']:.1f} s after the first",
            )
        )
    rows.append(
        (
            "bare OpenAI client, no env",
            f"efficiency of the client alone, same server, {conc} in flight, calls spread over one latency",
            f"{fixed['client_only_efficiency']:.2f}",
            f"scripted zero-latency env: {r['scripted_zero_latency']['turns_per_second']:.0f} simulated turns/s",
        )
    )
    return rows


def _collab_grpo_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    if "grpo" in r:
        g, mine, trl = r["grpo"], r["grpo"]["memrl"], r["grpo"]["trl"]
        same = (
            f"{int(mine['sequences'])} sequences of {mine['prompt_tokens'] / mine['sequences']:.0f} prompt tokens, "
            f"{r['model']}, LoRA"
        )
        rows += [
            (
                "collab GRPO step (TRL + memrl `rollout_func`)",
                f"s/step, memrl's multi-turn collab episodes / TRL's own single-turn GRPO on the same prompts, "
                f"completions forced to memrl's mean length ({same})",
                f"{g['step_over_trl']:.2f}",
                f"{mine['seconds_per_step']:.2f} vs {trl['seconds_per_step']:.2f} s/step; generate "
                f"{mine['generate_seconds']:.2f} vs {trl['generate_seconds']:.2f} s ({int(mine['generate_calls'])} "
                f"calls vs 1), forward+backward+optimizer {mine['train_seconds']:.2f} vs {trl['train_seconds']:.2f} s, "
                f"env and Player {mine['rollout_beyond_generate_seconds']:.2f} s",
            )
        ]
    if "heldout" in r:
        h = r["heldout"]
        rows.append(
            (
                "collab held-out session (`collab_heldout` path, hf backend, greedy)",
                f"s/session, `run_collab` over {h['sessions']} sessions / bare `generate` of the same replies "
                f"(batched per round, {h['bare_generate']['dtype']})",
                f"{h['sessions_over_bare']:.2f}",
                f"{h['sessions_seconds_per_session']:.2f} vs {h['bare_seconds_per_session']:.2f} s/session, "
                f"sessions alone; with server and Ray start-up {h['seconds_per_session']:.2f} s/session "
                f"({h['wall_over_bare']:.0f}x)",
            )
        )
    return rows


def _attention_rows(r: dict[str, Any]) -> list[Row]:
    runs, shape = r["runs"], f"{r['batch']} prompts of {r['prompt_tokens']} tokens, {r['model']} in {r['dtype']}"
    split, sdpa, eager = runs["split"], runs["sdpa"], runs["eager"]
    return [
        (
            "CPU decoding, split attention vs SDPA",
            f"decoding steps/s, `memrl.core.attention` / transformers' SDPA ({shape})",
            f"{r['split_decode_over_sdpa']:.2f}x",
            f"{split['decode_s_per_step'] * 1e3:.0f} vs {sdpa['decode_s_per_step'] * 1e3:.0f} ms a step",
        ),
        (
            "CPU prefill, split attention vs eager",
            f"prompts read/s, `memrl.core.attention` / transformers' eager attention ({shape})",
            f"{r['split_prefill_over_eager']:.2f}x",
            f"{split['prefill_s']:.2f} vs {eager['prefill_s']:.2f} s (SDPA {sdpa['prefill_s']:.2f})",
        ),
    ]


def _dropout_rows(r: dict[str, Any]) -> list[Row]:
    steps = r["step_s"]
    what = f"steps/s, forward + backward of {r['batch']} x {r['tokens']} tokens, {r['model']} + rank-16 LoRA"
    cpu = r["machine"]["cpu"]
    return [
        (
            "CPU GRPO loss step, word-mask vs nn.Dropout LoRA dropout",
            f"{what}, dropout 0.05 both",
            f"{r['word_mask_speedup']:.2f}x",
            f"{steps['word mask 0.05']:.2f} vs {steps['nn.Dropout 0.05']:.2f} s a step, {cpu}",
        ),
        (
            "CPU GRPO loss step, LoRA dropout 0 vs 0.05",
            f"{what}, nn.Dropout",
            f"{r['no_dropout_speedup']:.2f}x",
            f"{steps['none']:.2f} vs {steps['nn.Dropout 0.05']:.2f} s a step, {cpu}",
        ),
    ]


def _judge_rows(r: dict[str, Any]) -> list[Row]:
    n, conc, seq = r["samples"], r["concurrency"], r["sequential"]["samples_per_second"]
    return [
        (
            "LLM-judge reward, concurrent",
            f"samples/s, one `ascore` of {n} ({conc} in flight) / {n} one-sample calls; cache off in both",
            f"{r['concurrent_over_sequential']:.2f}x",
            f"{r['concurrent']['samples_per_second']:.0f} vs {seq:.1f} samples/s; ideal {conc}x",
        ),
        (
            "LLM-judge reward, cached",
            f"samples/s, second pass of the same {n} from the disk cache / sequential",
            f"{r['cached_over_sequential']:.0f}x",
            f"{r['cached']['samples_per_second']:.0f} samples/s, {r['cache_hits_per_cached_pass']} cache hits",
        ),
    ]


def _judger_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for head, h in r["heads"].items():
        pps = {k: h[k]["pairs_per_second"] for k in ("batched", "bare_forward", "one_at_a_time")}
        name = f"memory judger, {head} ({h['base']})"
        rows += [
            (
                f"{name}, batched vs bare forward",
                f"pairs/s, `JudgerScorer.score` batch {r['batch_size']} / the model's forward alone on the same "
                f"padded batches ({r['pairs']} pairs)",
                f"{h['batched_over_bare_forward']:.2f}",
                f"{pps['batched']:.0f} vs {pps['bare_forward']:.0f} pairs/s; "
                f"{h['padded_tokens']} padded tokens for {h['tokens']}",
            ),
            (
                f"{name}, batched vs one at a time",
                f"pairs/s, batch {r['batch_size']} / one pair per `score` call",
                f"{h['batched_over_one_at_a_time']:.2f}x",
                f"{pps['batched']:.0f} vs {pps['one_at_a_time']:.0f} pairs/s; {r['torch_threads']} torch threads",
            ),
        ]
    return rows


def _pahf_rows(r: dict[str, Any]) -> list[Row]:
    return [
        (
            f"PAHF memory, {int(row['notes']):,} notes",
            f"top-{r['k']} query latency, SQLite note store / FAISS flat index",
            f"{row['ratio']:.0f}x",
            f"{row['sqlite_ms']:.2f} vs {row['faiss_ms']:.3f} ms/query (median of {r['queries']})",
        )
        for row in r["rows"]
    ]


def _rollout_rows(r: dict[str, Any]) -> list[Row]:
    same = f"the same {r['episodes']} collab episodes (scripted zero-latency policy, rule user, {r['max_turns']} turns)"
    rows = [
        (
            "online-RL rollout path (train/online Player)",
            f"episodes/s, Player / bare `play` loop over {same}",
            f"{r['rollout_over_bare']:.2f}",
            f"{r['rollout_episodes_per_second']:.0f} vs {r['bare_episodes_per_second']:.0f} episodes/s, batches of "
            f"{r['batch']}; target >= 0.8",
        ),
        (
            f"online-RL rollout path, users on {r['workers']} Ray actors",
            f"episodes/s, Player with `env.workers` / bare in-process `play` loop over {same}",
            f"{r['actors_over_bare']:.2f}",
            f"{r['actor_episodes_per_second']:.0f} vs {r['bare_episodes_per_second']:.0f} episodes/s",
        ),
    ]
    fixed = r["fixed_latency_policy"]
    for where, users in (("in_process", "users in-process"), ("actors", f"users on {r['workers']} Ray actors")):
        f = fixed[where]
        rows.append(
            (
                f"online-RL rollout, fixed-latency policy endpoint ({users})",
                f"efficiency: ideal time (rounds x {fixed['latency_s'] * 1000:.0f} ms) / measured time, "
                f"{f['in_flight']} requests in flight per round",
                f"{f['efficiency']:.2f}",
                f"{f['calls']} calls in {f['seconds']:.2f} s; {f['per_round_beyond_latency_ms']:.0f} ms per round "
                f"beyond the latency; the bare OpenAI client alone reaches {f['client_only_efficiency']:.2f}",
            )
        )
    return rows


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "collab_overhead": _collab_rows,
    "collab_grpo_step": _collab_grpo_rows,
    "cpu_attention": _attention_rows,
    "lora_dropout": _dropout_rows,
    "judge_throughput": _judge_rows,
    "judger_scoring": _judger_rows,
    "pahf_memory": _pahf_rows,
    "rollout_overhead": _rollout_rows,
}


def markdown(results: dict[str, dict[str, Any]], seconds: dict[str, float], load: dict[str, float], header: str) -> str:
    lines = [header, "", "| measurement | compares | ratio | detail |", "| --- | --- | ---: | --- |"]
    for name, result in results.items():
        lines += [f"| {' | '.join(row)} |" for row in ROWS[name](result)]
    timing = ", ".join(f"{name} {s:.0f} s (load {load[name]:.1f})" for name, s in seconds.items())
    lines += [
        "",
        f"Wall time per benchmark, with the 1-minute load average when it ended: {timing}; "
        f"total {sum(seconds.values()):.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="smaller sizes for every benchmark (a smoke run)")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    load: dict[str, float] = {}  # other jobs on the machine skew every ratio: the table says how busy it was
    for name in args.only:
        full, quick = BENCHMARKS[name]
        command = [sys.executable, str(HERE / f"{name}.py"), "--out", str(args.out), *(quick if args.quick else full)]
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        subprocess.run(command, check=True, env=env)
        seconds[name] = time.perf_counter() - start
        load[name] = os.getloadavg()[0]
        results[name] = json.loads((args.out / f"{name}.json").read_text())
    header = (
        f"Measured {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
        f"{' (--quick sizes)' if args.quick else ''}; each ratio comes from one run."
    )
    table = markdown(results, seconds, load, header)
    (args.out / "bench.md").write_text(table)
    print()
    print(table, end="")


if __name__ == "__main__":
    main()
