"""The chart of a `collab_grpo` run's outcome, per training step: both trainers draw it, from their own history."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memrl.rewards.collab_episode import PARTS, REPLIES_CUT, STATUSES
from memrl.train.curves import Chart, Panel, draw


def outcome_chart(history: Sequence[dict[str, Any]], out: Path, title: str) -> Chart | None:
    """One panel per reward part (train mean per step), the weighted reward, how the episodes ended, and the share
    of replies cut at the reply budget."""

    def series(key: str) -> list[tuple[float, float]]:
        return [(float(row["step"]), float(row[key])) for row in history if key in row and "step" in row]

    panels = [Panel(part, {part: series(f"rewards/{part}/mean")}) for part in PARTS]
    panels.append(Panel("reward", {"weighted sum": series("reward")}))
    panels.append(Panel("episodes", {status: series(f"episode/{status}") for status in STATUSES}))
    panels.append(Panel("replies cut at the budget", {"share": series(f"episode/{REPLIES_CUT}")}))
    return draw(panels, out, title=title)
