"""The reward parts of a verl collab run, per training step, from the samples verl dumps to `rollout_data_dir`.

verl 0.9.1 logs a loop's `reward_extra_info` as metrics only at validation; during training it writes every sample
with its score and extra info to `<rollout_data_dir>/<step>.jsonl`. This reads those files back into the rows
`outcome_chart` draws, under the names TRL logs (`rewards/<part>/mean`, `reward`, `episode/<status>`), so both
trainers' curves read alike.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import fmean
from typing import Any

from memrl.rewards.collab_outcome import PARTS, STATUSES


def _step_row(step: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"step": step}
    for part in PARTS:
        values = [float(s[part]) for s in samples if s.get(part) is not None]
        if values:
            row[f"rewards/{part}/mean"] = fmean(values)
    scores = [float(s["score"]) for s in samples if s.get("score") is not None and math.isfinite(float(s["score"]))]
    if scores:
        row["reward"] = fmean(scores)
    for status in STATUSES:
        row[f"episode/{status}"] = float(sum(float(s.get(f"episode_{status}") or 0.0) for s in samples))
    return row


def rollout_history(folder: Path) -> list[dict[str, Any]]:
    """One row per step dumped in `folder`, in step order; lines a killed run cut short are skipped."""
    rows = []
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1):
        if not path.stem.isdigit():
            continue
        samples = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        if samples:
            rows.append(_step_row(int(path.stem), samples))
    return rows
