"""The run's report: held-out reward of every evaluated model, learning deltas, and the GRPO reward curve."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any


def reward_curve(logs: dict[str, Path], out: Path) -> Path | None:
    """Training reward (and its parts) per logged GRPO step, one line per GRPO stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {name: [row for row in json.loads(path.read_text()) if "reward" in row] for name, path in logs.items()}
    series = {name: rows for name, rows in series.items() if rows}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, rows in series.items():
        ax.plot([r["step"] for r in rows], [r["reward"] for r in rows], marker="o", label=f"{name} reward")
        for part in sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")}):
            label = part.removeprefix("rewards/").removesuffix("/mean")
            ax.plot([r["step"] for r in rows], [r.get(part) for r in rows], linestyle="--", label=f"{name} {label}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward of the rollouts")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_report(
    run_dir: Path, results: dict[str, dict[str, Any]], online: dict[str, Any] | None, grpo_logs: dict[str, Path]
) -> Path:
    """`report.json`: per model label its held-out metrics, and each label's score gain over the one before."""
    labels = list(results)
    gains = {
        f"{after}_minus_{before}": _diff(results[after].get("score"), results[before].get("score"))
        for before, after in itertools.pairwise(labels)
    }
    curve = reward_curve(grpo_logs, run_dir / "reward_curve.png")
    report = {
        "held_out": results,
        "mean_reward": {label: results[label].get("score") for label in labels},
        "gains": gains,
        "learning": all(g is not None and g > 0 for g in gains.values()) if gains else None,
        "online": online,
        "reward_curve": str(curve) if curve else None,
    }
    path = run_dir / "report.json"
    path.write_text(json.dumps(report, indent=2))
    return path


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 4) if a is not None and b is not None else None
