"""Wall time of each quickstart stage, in one process as `memrl run quickstart` runs them, and the held-out table.

Runs the recipe stage by stage into a fresh run folder (`--run-dir`, removed first) and writes
`quickstart_stages.json`: seconds per stage, the total, the 1-minute load average after each stage, and the
held-out reward of each evaluated model from the run's report.json (the demonstration holds when base < SFT <
GRPO). Not part of `make bench`: it trains for many minutes.

    OMP_NUM_THREADS=2 python benchmarks/quickstart_stages.py [--run-dir runs/quickstart-timed] [override ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/quickstart-timed"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, as `memrl run quickstart KEY=VALUE`")
    args = parser.parse_args()

    start = time.perf_counter()
    from rich.console import Console

    from memrl.app.recipe import load_recipe
    from memrl.app.stages.runner import run_recipe

    imports = time.perf_counter() - start
    shutil.rmtree(args.run_dir, ignore_errors=True)
    loaded = load_recipe("quickstart", [f"output_dir={args.run_dir}", *args.overrides])
    console = Console()
    stages: dict[str, dict[str, float]] = {}
    for name in loaded.recipe.stages:
        start = time.perf_counter()
        run_recipe(loaded, console, only=[name])
        stages[name] = {"seconds": round(time.perf_counter() - start, 1), "load_1min": os.getloadavg()[0]}
    report = json.loads((args.run_dir / "report.json").read_text())
    result = {
        "overrides": args.overrides,
        "imports_seconds": round(imports, 1),
        "stages": stages,
        "total_seconds": round(imports + sum(s["seconds"] for s in stages.values()), 1),
        "mean_reward": report["mean_reward"],
        "learning": report["learning"],
        "machine": {"cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quickstart_stages.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print_json(data=result)


if __name__ == "__main__":
    main()
