"""The chart of an online GRPO run's outcome, per training step: both trainers draw it, from their own history."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memrl.train.curves import Chart, Panel, draw
from memrl.train.online.rollout import REPLIES_CUT, STATUSES


def outcome_chart(history: Sequence[dict[str, Any]], out: Path, title: str, parts: Sequence[str]) -> Chart | None:
    """One panel per reward part `parts` (train mean per step), the weighted reward, how the episodes ended, and the
    share of replies cut at the reply budget."""

    def series(key: str) -> list[tuple[float, float]]:
        return [(float(row["step"]), float(row[key])) for row in history if key in row and "step" in row]

    panels = [Panel(part, {part: series(f"rewards/{part}/mean")}) for part in parts]
    panels.append(Panel("reward", {"weighted sum": series("reward")}))
    panels.append(Panel("episodes", {status: series(f"episode/{status}") for status in STATUSES}))
    panels.append(Panel("replies cut at the budget", {"share": series(f"episode/{REPLIES_CUT}")}))
    return draw(panels, out, title=title)
