"""Each quickstart stage against the bare model doing the same work, in one run: wall time, cores busy, useful work
per second, and the ratio to the bare model (`bare_model.py`).

Runs `memrl run quickstart` stage by stage in one process (as the command does) into a fresh run folder (`--run-dir`,
removed first), then the bare model on the same work, and writes `quickstart_stages.json`:
- per stage: seconds, cores busy (CPU seconds of the process tree per wall second, `cpu_busy.py`), the 1-minute
  load average after it, the useful work (tokens generated for data and eval, tokens trained for SFT, tokens
  generated and trained for GRPO) and `vs_bare`: the bare model's seconds for the same work over the stage's
  seconds (1.0: the stage runs at the speed of the model; SFT and GRPO time `--bare-steps` steps and scale them),
  and the bare model's own cores busy on that work;
- the total, and the held-out rewards of base, SFT and GRPO from the run's report.json.
Not part of `make bench`: it trains for many minutes.

    OMP_NUM_THREADS=2 python benchmarks/quickstart_stages.py [--run-dir runs/quickstart-timed] [override ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bare_model import Recorder, grpo_steps, replay, sft_steps
from cpu_busy import CpuBusy, cpu_model, write_result

HERE = Path(__file__).parent
RECORDED = ("data", "eval")  # stages whose generate calls are replayed bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/quickstart-timed"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--bare-steps", type=int, default=3, help="SFT and GRPO steps the bare model runs")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, as `memrl run quickstart KEY=VALUE`")
    args = parser.parse_args()

    load_before = round(os.getloadavg()[0], 2)
    start = time.perf_counter()
    from rich.console import Console

    from memrl.app.recipe import load_recipe
    from memrl.app.runner import run_recipe

    imports = time.perf_counter() - start
    shutil.rmtree(args.run_dir, ignore_errors=True)
    loaded = load_recipe("quickstart", [f"output_dir={args.run_dir}", *args.overrides])
    console = Console()
    stages: dict[str, dict[str, Any]] = {}
    recorders: dict[str, Recorder] = {}
    for name in loaded.recipe.stages:
        recorder = recorders[name] = Recorder()
        with CpuBusy() as busy, recorder.recording() if name in RECORDED else contextlib.nullcontext():
            run_recipe(loaded, console, only=[name])
        stages[name] = {"seconds": round(busy.seconds, 1), "cores_busy": busy.cores, "load_1min": os.getloadavg()[0]}
    total = round(imports + sum(s["seconds"] for s in stages.values()), 1)

    recipe = loaded.recipe.stages
    base = str(Path(os.environ.get("MEMRL_CACHE", Path.home() / ".cache/memrl")) / "models" / "smollm2-135m-instruct")
    for name in RECORDED:
        calls = recorders[name].calls
        with CpuBusy() as busy:
            bare = replay(calls)
        stages[name] |= {"tokens_generated": sum(c.tokens for c in calls), "bare": bare | {"cores_busy": busy.cores}}
        stages[name]["vs_bare"] = round(bare["seconds"] / stages[name]["seconds"], 2)
    sft, grpo = recipe["sft"], recipe["grpo"]
    with CpuBusy() as busy:
        bare = sft_steps(base, args.run_dir, steps=args.bare_steps, batch_size=sft.batch_size,
                         max_length=sft.max_length, lr=sft.lr)  # fmt: skip
    bare["cores_busy"] = busy.cores
    stages["sft"] |= {"bare": bare, "vs_bare": _scaled(bare, sft.max_steps, stages["sft"]["seconds"])}
    with CpuBusy() as busy:
        bare = grpo_steps(base, args.run_dir, steps=args.bare_steps, rollouts=grpo.rollouts,
                          max_response=grpo.max_response_length, temperature=grpo.temperature, lr=grpo.lr)  # fmt: skip
    bare["cores_busy"] = busy.cores
    stages["grpo"] |= {"bare": bare, "vs_bare": _scaled(bare, grpo.max_steps, stages["grpo"]["seconds"])}

    report = json.loads((args.run_dir / "report.json").read_text())
    result = {
        "overrides": args.overrides,
        "imports_seconds": round(imports, 1),
        "stages": stages,
        "total_seconds": total,
        "mean_reward": report["mean_reward"],
        "learning": report["learning"],
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_before": load_before,
        },
    }
    write_result(args.out, "quickstart_stages", result)
    console.print_json(data=result)


def _scaled(bare: dict[str, Any], steps: int, seconds: float) -> float:
    """The bare model's seconds for all `steps`, from the steps it ran, over the stage's seconds."""
    return round(bare["seconds"] / max(bare["steps"], 1) * steps / seconds, 2)


if __name__ == "__main__":
    main()
