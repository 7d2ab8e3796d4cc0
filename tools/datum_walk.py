"""Count the memrl modules one datum really passes through: `memrl run quickstart --smoke`, stage by stage.

A user's session becomes a reflection sample (`data`), trains the policy (`sft`, `grpo`), is exported and scored on
held-out users (`export`, `eval`). For each stage this runs `memrl run quickstart --smoke --stage S` (a rerun into the
same folder resumes, so the stages run in order) with a profiler in every Python process it starts, and records each
memrl module whose functions were called. A module that was only imported (its body, its classes' bodies and the
functions they call while it is imported ran) does not count: it did no work on the datum. What every stage's process
runs (the CLI, recipe loading and validation, the stage runner) is listed once, apart, so each stage's row shows what
that stage added.
docs/architecture.md ("One datum through `memrl run quickstart`") prints this tool's table.

    python tools/datum_walk.py [--out walk.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data", "sft", "grpo", "export", "eval")
SETUP = ("pull",)  # run first, not counted: it only finds the cached models
ENV_OUT = "MEMRL_WALK_OUT"

# Written as the sitecustomize of every Python process the run starts: records the memrl modules whose code ran.
TRACER = f'''
import os, sys, threading, atexit, json
_out = os.environ.get("{ENV_OUT}")
if _out:
    _seen = set()
    def _importing(frame):
        # Called, however deep, from a module body other than the program's own: an import building its tables.
        frame = frame.f_back
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
                return True
            frame = frame.f_back
        return False
    def _profile(frame, event, arg):
        # A function's own code only (CO_OPTIMIZED): module and class bodies run on import, which is not work; nor is
        # the factory @dataclass runs in the module's globals to build a class's methods, nor any function a module
        # body calls while it is imported.
        code = frame.f_code
        if event == "call" and code.co_flags & 1 and code.co_name[0] != "<" and code.co_name != "__create_fn__":
            name = frame.f_globals.get("__name__")
            if isinstance(name, str) and name.startswith("memrl.") and name not in _seen and not _importing(frame):
                _seen.add(name)
    def _write():
        with open(os.path.join(_out, f"{{os.getpid()}}.json"), "w") as f:
            json.dump(sorted(_seen), f)
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    atexit.register(_write)
'''


def run_stage(stage: str, run_dir: Path, trace_dir: Path) -> set[str]:
    """The memrl modules whose functions ran while `memrl run quickstart --smoke --stage STAGE` ran."""
    out = trace_dir / stage
    out.mkdir(parents=True)
    env = {
        **os.environ,
        ENV_OUT: str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(trace_dir), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    argv = [sys.executable, "-m", "memrl", "run", "quickstart", "--smoke", "--stage", stage, f"output_dir={run_dir}"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"datum_walk: stage {stage} exited {done.returncode}:\n{tail}")
    return {name for file in out.glob("*.json") for name in json.loads(file.read_text())}


def walk(work: Path) -> dict[str, list[str]]:
    trace_dir = work / "trace"
    trace_dir.mkdir(parents=True)
    (trace_dir / "sitecustomize.py").write_text(TRACER)
    run_dir = work / "run"
    for stage in SETUP:
        run_stage(stage, run_dir, trace_dir)
    touched = {stage: run_stage(stage, run_dir, trace_dir) for stage in STAGES}
    shared = set.intersection(*touched.values())
    return {"shared by every stage": sorted(shared)} | {s: sorted(m - shared) for s, m in touched.items()}


def table(walked: dict[str, list[str]]) -> str:
    rows = ["| stage | modules | which (under `memrl.`) |", "|---|---:|---|"]
    for stage, modules in walked.items():
        shown = ", ".join(f"`{m.removeprefix('memrl.')}`" for m in modules)
        rows.append(f"| {stage} | {len(modules)} | {shown} |")
    distinct = {m for modules in walked.values() for m in modules}
    rows.append(f"| all stages | {len(distinct)} | |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the modules per stage as JSON")
    parser.add_argument("--keep", type=Path, help="run in this (new) folder and keep it; default: a temporary one")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
        walked = walk(args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            walked = walk(Path(tmp))
    if args.out:
        args.out.write_text(json.dumps(walked, indent=2) + "\n")
    print(table(walked))


if __name__ == "__main__":
    main()
