"""Snapshot what a user reads from the CLI: every command's `--help` and every bundled recipe's `--dry-run`.

A refactor that keeps behaviour keeps these byte-identical (paths of the checkout, the cache and the scratch folder
are written as placeholders, so two checkouts compare). Usage:

    python tools/cli_snapshot.py OUT_DIR                 # write one file per command and recipe
    python tools/cli_snapshot.py OUT_DIR --compare BASE  # then diff against an earlier snapshot; exit 1 on a change
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMRL = [sys.executable, "-c", "from memrl.app.cli.entry import main; main()"]
ENV = {**os.environ, "COLUMNS": "120", "TERM": "dumb", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def command_paths() -> list[list[str]]:
    """Every command and group of `memrl`, as argv prefixes, the root first."""
    import typer.main

    from memrl.app.cli.main import app

    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def recipes() -> list[str]:
    return sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml") if p.stem != "base")


def _run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run([*MEMRL, *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600, check=False)
    return f"$ memrl {' '.join(argv)}\nexit {done.returncode}\n{done.stdout}{done.stderr}"


def _placeholders(text: str, scratch: Path) -> str:
    cache = os.environ.get("MEMRL_CACHE", str(ROOT / ".cache" / "memrl"))
    for path, name in ((cache, "<CACHE>"), (str(scratch), "<SCRATCH>"), (str(ROOT), "<ROOT>")):
        text = text.replace(path, name)
    return text


def snapshot(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp).resolve()
        jobs = [(f"help{'.'.join(['', *p])}.txt", [*p, "--help"]) for p in command_paths()]
        for name in recipes():
            jobs += [(f"dry-run.{name}.txt", ["run", name, "--dry-run"])]
            jobs += [(f"dry-run.{name}.smoke.txt", ["run", name, "--smoke", "--dry-run"])]
        for file, argv in jobs:
            (out / file).write_text(_placeholders(_run(argv, scratch), scratch))
            print(file, flush=True)


def compare(out: Path, base: Path) -> int:
    changed = 0
    for file in sorted({p.name for p in out.glob("*.txt")} | {p.name for p in base.glob("*.txt")}):
        before = (base / file).read_text().splitlines() if (base / file).is_file() else []
        after = (out / file).read_text().splitlines() if (out / file).is_file() else []
        if before != after:
            changed += 1
            sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(before, after, f"base/{file}", file))
    print(f"{changed} file(s) differ")
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="an earlier snapshot to diff against")
    args = parser.parse_args()
    snapshot(args.out)
    return compare(args.out, args.compare) if args.compare else 0


if __name__ == "__main__":
    raise SystemExit(main())
