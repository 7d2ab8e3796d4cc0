"""The run's report: held-out reward of every evaluated model, learning deltas, and the GRPO reward curve (TRL and
verl stages)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError
from memrl.core.files import read_json
from memrl.train import verl_metrics
from memrl.train.curves import TRAIN_REWARD, Panel, Points, draw, eval_reward
from memrl.train.verl_metrics import METRICS_FILE

REPORT_FILE = "report.json"


def reward_curve(logs: dict[str, Path], out: Path) -> Path | None:
    """Training reward (and its parts) per GRPO step, one line each per GRPO stage: TRL stages from their
    `log_history.json`, verl stages from their file logger's metrics (`verl_metrics.jsonl`)."""
    series: dict[str, Points] = {}
    for name, path in logs.items():
        series |= _verl_rewards(name, path) if path.name == METRICS_FILE else _trl_rewards(name, path)
    chart = draw([Panel("GRPO reward", series, "GRPO step", "mean reward of the rollouts")], out)
    return chart.path if chart else None


def _trl_rewards(name: str, path: Path) -> dict[str, Points]:
    rows = {int(r["step"]): r for r in json.loads(path.read_text()) if "reward" in r}
    parts = sorted({k for r in rows.values() for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    out = {f"{name} reward": [(float(s), float(r["reward"])) for s, r in rows.items()]}
    for part in parts:
        label = part.removeprefix("rewards/").removesuffix("/mean")
        out[f"{name} {label}"] = [(float(s), float(r[part])) for s, r in rows.items() if r.get(part) is not None]
    return out


def _verl_rewards(name: str, path: Path) -> dict[str, Points]:
    """verl logs the reward's parts for validation steps only: the train reward, then `eval <part>`."""
    steps = verl_metrics.read(path.parent)
    reward = [(float(s), r[TRAIN_REWARD]) for s, r in steps.items() if TRAIN_REWARD in r]
    return {f"{name} reward": reward} | {f"{name} {label}": pts for label, pts in eval_reward(steps).items()}


def grpo_logs(run_dir: Path, trl_logs: dict[str, Path]) -> dict[str, Path]:
    """The TRL stages' logs and, for each other stage folder of the run, verl's metrics if it logged a reward."""
    found = dict(trl_logs)
    for path in sorted(run_dir.glob(f"*/{METRICS_FILE}")):
        if path.parent.name not in found and any(TRAIN_REWARD in r for r in verl_metrics.read(path.parent).values()):
            found[path.parent.name] = path
    return found


def write_report(
    run_dir: Path,
    results: dict[str, dict[str, Any]],
    online: dict[str, Any] | None,
    trl_logs: dict[str, Path],
    outcome: dict[str, Any] | None = None,
) -> Path:
    """`report.json`: per model label its held-out metrics, and each label's score gain over the one before; with
    `outcome` (train/rewards/next_session_eval.py), the next-session evaluation of the held-out notes."""
    labels = list(results)
    gains = {
        f"{after}_minus_{before}": _diff(results[after].get("score"), results[before].get("score"))
        for before, after in itertools.pairwise(labels)
    }
    curve = reward_curve(grpo_logs(run_dir, trl_logs), run_dir / "reward_curve.png")
    report = {
        "held_out": results,
        "mean_reward": {label: results[label].get("score") for label in labels},
        "gains": gains,
        "learning": all(g is not None and g > 0 for g in gains.values()) if gains else None,
        "online": online,
        "reward_curve": str(curve) if curve else None,
    }
    if outcome is not None:
        report["outcome"] = outcome
    return merge_report(run_dir, report)


def merge_report(run_dir: Path, sections: dict[str, Any]) -> Path:
    """Write `sections` into the run's `report.json`, keeping the keys other stages wrote there."""
    path = run_dir / REPORT_FILE
    report = read_json(path, MemrlError) if path.is_file() else {}
    if not isinstance(report, dict):
        raise MemrlError(f"{path}: not a JSON object; delete it and rerun the stages that write it")
    path.write_text(json.dumps(report | sections, indent=2))
    return path


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 4) if a is not None and b is not None else None
