"""Does training help, on held-out data, whatever the seed? Runs each learning recipe for several training seeds and
writes the seeds table (`make learn`).

For each recipe and seed it runs `memrl run RECIPE seed=S` into its own folder (a rerun resumes: finished runs are
read, not trained again), reads the held-out effect the run reported, with its paired bootstrap interval, and the
per-unit paired differences behind it, then pools the units of every seed into one effect with its interval. A claim
is made only when the pooled interval lies above 0 and no seed's estimate is below 0 (`memrl.core.stats.pooled_claim`).

| what | recipe | effect (per held-out unit) |
|---|---|---|
| reflector | reflector-quickstart | judge score, GRPO - SFT, per held-out session |
| collaborator | collaborator-quickstart | preference share, trained - base policy, per held-out session |
| judger | judger-minilm-cpu | recall@5, fused - retrieval alone, per held-out query with gold (needs `--judger-data`) |

Writes `learn.json` and `learn.md` under `--out`: one table per machine (its CPU model, each run's minutes and the
1-minute load average before and after it), so a claim can be read on every machine it was measured on; the tables of
other CPUs, and the learners measured earlier on this one and not run again, are kept. Not part of `make bench`: a
run trains for 15 to 20 minutes.

    OMP_NUM_THREADS=2 python benchmarks/learn.py [--seeds 0 1 2] [--only reflector collaborator]
        [--judger-data DIR] [--runs runs/learn] [--out benchmarks/results]

Resume runs with the MEMRL_CACHE they were trained with (`make learn` sets ./.cache/memrl): a model converted into
another cache is another folder of weights, so a resumed held-out stage rightly plays its sessions again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpu_busy import cpu_model

from memrl.train.report import held_out_rows, paired_measures

HERE = Path(__file__).parent

Units = list[float]


def reflector_units(run: Path, report: dict[str, Any]) -> tuple[dict[str, Any], Units]:
    """GRPO - SFT judge score per held-out session (`report.json` `learning`)."""
    learning = report["learning"]
    after, before = (s.strip() for s in learning["compared"].split("-"))
    rows = held_out_rows(run / "eval", [after, before])
    mine, theirs = paired_measures(rows[after], rows[before], "score")
    units = [d for a, b in zip(mine, theirs, strict=True) if not math.isnan(d := a - b)]
    return {"n": learning["n"], "delta": learning["delta"], "ci95": learning["ci95"]}, units


def collaborator_units(run: Path, report: dict[str, Any]) -> tuple[dict[str, Any], Units]:
    """Trained - base preference share per held-out session (`report.json` `heldout`)."""
    from memrl.envs.collab.records import read_sessions
    from memrl.train.heldout import pair_key, session_metrics

    held = report["heldout"]
    played = [read_sessions(run / "heldout" / side / "sessions.jsonl") for side in ("base", "trained")]
    sides = [{pair_key(r): session_metrics(r)["preference"] for r in records} for records in played]
    keys = sorted(sides[0].keys() & sides[1].keys())
    units = [sides[1][k] - sides[0][k] for k in keys if sides[0][k] is not None and sides[1][k] is not None]
    return {"n": held["n"], "delta": held["delta"]["preference"], "ci95": held["ci95"]["preference"]}, units


def judger_units(run: Path, report: dict[str, Any]) -> tuple[dict[str, Any], Units]:
    """Fused - retrieval-alone recall@5 per held-out query with gold (the eval stage's `metrics.json`)."""
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    per_query = metrics["recall@5_per_query"]
    pairs = zip(per_query["fused"], per_query["retrieval"], strict=True)
    units = [f - r for f, r in pairs if f is not None and r is not None]
    interval = metrics["judger_gain@5_interval"]
    return {"n": interval["queries"], "delta": metrics["judger_gain@5"], "ci95": interval["ci95"]}, units


@dataclass(frozen=True)
class Learner:
    recipe: str
    effect: str
    units: Callable[[Path, dict[str, Any]], tuple[dict[str, Any], Units]]


LEARNERS = {
    "reflector": Learner("reflector-quickstart", "held-out judge score, GRPO - SFT", reflector_units),
    "collaborator": Learner("collaborator-quickstart", "held-out preference share, trained - base", collaborator_units),
    "judger": Learner("judger-minilm-cpu", "held-out recall@5, fused - retrieval alone", judger_units),
}


def run_one(what: str, seed: int, runs: Path, judger_data: str | None, earlier: dict[str, Any]) -> dict[str, Any]:
    learner = LEARNERS[what]
    folder = runs / f"{learner.recipe}-s{seed}"
    measured = _earlier_timing(earlier, what, seed, folder)  # a finished run is read again, not timed again
    cmd = [sys.executable, "-m", "memrl", "run", learner.recipe, f"seed={seed}", f"output_dir={folder}"]
    if what == "judger":
        cmd.append(f"data={judger_data}")
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    log = folder.with_suffix(".log")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as sink:
        done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, check=False)
    minutes = (time.monotonic() - start) / 60
    if done.returncode != 0:
        raise SystemExit(f"learn: {' '.join(cmd)} exited {done.returncode}; see {log}")
    report_file = folder / "report.json"  # the judger's recipe writes eval/metrics.json only
    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
    effect, units = learner.units(folder, report)
    timing = measured or {
        "minutes": round(minutes, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    return {"seed": seed, "run": str(folder), **timing, **effect, "units": units}


def _earlier_timing(earlier: dict[str, Any], what: str, seed: int, folder: Path) -> dict[str, Any] | None:
    """The minutes and loads an earlier invocation measured for this run, when the run is finished and was timed."""
    finished = (folder / "report.json").is_file() or (folder / "eval" / "metrics.json").is_file()
    rows = earlier.get(what, {}).get("seeds", [])
    row = next((r for r in rows if r["seed"] == seed and r["run"] == str(folder)), None)
    if not finished or row is None:
        return None
    return {key: row[key] for key in ("minutes", "load_before", "load_after")}


def summarize(what: str, seeds: list[dict[str, Any]]) -> dict[str, Any]:
    from memrl.core.stats import pooled_claim

    claim = pooled_claim([s["units"] for s in seeds])
    return {
        "recipe": LEARNERS[what].recipe,
        "effect": LEARNERS[what].effect,
        "seeds": seeds,
        "pooled": None if claim.pooled is None else round(claim.pooled, 4),
        "pooled_ci95": None if claim.pooled_ci95 is None else [round(x, 4) for x in claim.pooled_ci95],
        "pooled_n": sum(len(s["units"]) for s in seeds),
        "claim": claim.holds,
        "why": claim.why,
    }


def _detectable(units: Units) -> str:
    """The smallest true effect these units would show 4 times in 5 (`memrl.core.stats.detectable_effect`)."""
    from memrl.core.stats import detectable_effect

    found = detectable_effect(units)
    return "-" if found is None else f"{found:.4f}"


def markdown(machines: list[dict[str, Any]]) -> str:
    lines = [
        "# Seeds tables",
        "",
        "One section per machine: its CPU, and each run's minutes and the 1-minute load average before and after it.",
        "`detectable`: the smallest true effect that many units, as spread as these, show with an interval above 0",
        "4 times in 5 (normal approximation); an interval reaching 0 rules out no effect below it.",
        "",
    ]
    for machine in machines:
        lines += [f"## {machine['cpu']}, {machine['cores']} cores ({machine['date']})", ""]
        for what, r in machine["learners"].items():
            lines += [
                f"### {what}: `{r['recipe']}`, {r['effect']}",
                "",
                "| seed | n | effect | 95% interval | detectable | minutes | load before / after |",
                "|---|---:|---:|---|---:|---:|---|",
            ]
            for s in r["seeds"]:
                lines.append(
                    f"| {s['seed']} | {s['n']} | {s['delta']:+.4f} | [{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}] | "
                    f"{_detectable(s['units'])} | {s['minutes']} | {s['load_before']} / {s['load_after']} |"
                )
            ci = r["pooled_ci95"]
            interval = f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "-"
            pooled = f"{r['pooled']:+.4f}" if r["pooled"] is not None else "-"
            lines += [
                f"| pooled | {r['pooled_n']} | {pooled} | {interval} | "
                f"{_detectable([u for s in r['seeds'] for u in s['units']])} | | |",
                "",
                f"Claim: **{'holds' if r['claim'] else 'not made'}** ({r['why']}).",
                "",
            ]
    return "\n".join(lines)


def read_machines(path: Path) -> list[dict[str, Any]]:
    """Every machine's table an earlier invocation wrote (a file of one machine, as written before 2026-11-29,
    reads as a list of one)."""
    if not path.is_file():
        return []
    earlier = json.loads(path.read_text())
    return list(earlier["machines"]) if "machines" in earlier else [earlier]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=list(LEARNERS), default=list(LEARNERS))
    parser.add_argument(
        "--judger-data", help="judger pairs folder (`memrl data judger`); the judger is skipped without"
    )
    parser.add_argument("--runs", type=Path, default=Path("runs/learn"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    chosen = [w for w in args.only if w != "judger" or args.judger_data]
    if len(chosen) < len(args.only):
        print("learn: no --judger-data: the judger is skipped", file=sys.stderr)
    machines = read_machines(args.out / "learn.json")
    mine = next((m for m in machines if m["cpu"] == cpu_model()), None)
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "learners": dict(mine["learners"]) if mine else {},  # learners measured here and not run again are kept
    }
    machines = [results if m is mine else m for m in machines] + ([] if mine else [results])
    earlier = dict(results["learners"])
    for what in chosen:
        seeds: list[dict[str, Any]] = []
        for seed in args.seeds:
            print(f"learn: {what} seed {seed} ...", flush=True)
            seeds.append(run_one(what, seed, args.runs, args.judger_data, earlier))
            s = seeds[-1]
            print(
                f"learn: {what} seed {seed}: {s['delta']:+.4f} {s['ci95']} n={s['n']} ({s['minutes']} min)", flush=True
            )
            results["learners"][what] = summarize(what, seeds)
            write(machines, args.out)  # after every seed: an interrupted `make learn` keeps the runs it finished
    print(markdown(machines))


def write(machines: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "learn.json").write_text(json.dumps({"machines": machines}, indent=2))
    (out / "learn.md").write_text(markdown(machines) + "\n")


if __name__ == "__main__":
    main()
