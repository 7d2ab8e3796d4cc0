"""The reward parts of a verl online run, per training step, from the samples verl dumps to `rollout_data_dir`.

verl 0.9.1 logs a loop's `reward_extra_info` as metrics only at validation; during training it writes every sample
with its score to `<rollout_data_dir>/<step>.jsonl`. The legacy trainer adds the extra info to each line; the V1
trainer (`trainer.use_v1`, verl's default) writes only the sample's TransferQueue key (`uid`), so the agent loop
records each sample's parts under that key in `<rollout_data_dir>/parts/` (one file per process) and they are joined
back here. The rows come out under the names TRL logs (`rewards/<part>/mean`, `reward`, `episode/<status>`), for
`outcome_chart`, so both trainers' curves read alike. Validation samples are recorded too but never dumped by verl,
so they join nothing.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from memrl.train.online.rollout import REPLIES_CUT, STATUSES

PARTS_SUBDIR = "parts"


def sample_key(uid: str, session_id: int) -> str:
    """The key verl V1 stores (and dumps) a one-output agent loop's sample under: `{uid}_{session}_{output index}`."""
    return f"{uid}_{int(session_id)}_0"


def record_parts(folder: Path, key: str, info: dict[str, Any]) -> None:
    """Append one sample's reward parts under `key`; one file per host and process, so writers never interleave."""
    parts = folder / PARTS_SUBDIR
    parts.mkdir(parents=True, exist_ok=True)
    with (parts / f"{socket.gethostname()}-{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps({"uid": key, **info}) + "\n")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of `path` that parse: a killed run may have cut the last one short."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _step_row(step: int, samples: list[dict[str, Any]], parts: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"step": step}
    for part in parts:
        values = [float(s[part]) for s in samples if s.get(part) is not None]
        if values:
            row[f"rewards/{part}/mean"] = fmean(values)
    scores = [float(s["score"]) for s in samples if s.get("score") is not None and math.isfinite(float(s["score"]))]
    if scores:
        row["reward"] = fmean(scores)
    for status in STATUSES:
        row[f"episode/{status}"] = float(sum(float(s.get(f"episode_{status}") or 0.0) for s in samples))
    if cut := [float(s[REPLIES_CUT]) for s in samples if s.get(REPLIES_CUT) is not None]:
        row[f"episode/{REPLIES_CUT}"] = fmean(cut)
    return row


def rollout_history(folder: Path, parts: Sequence[str]) -> list[dict[str, Any]]:
    """One row per step dumped in `folder` (the reward `parts` of the stage's world), in step order; lines a killed
    run cut short are skipped."""
    recorded = {r["uid"]: r for path in sorted((folder / PARTS_SUBDIR).glob("*.jsonl")) for r in _jsonl(path)}
    rows = []
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1):
        if not path.stem.isdigit():
            continue
        # verl's own line wins (its score is the one trained on); the recorded parts fill in what it lacks
        samples = [recorded.get(s.get("uid"), {}) | s for s in _jsonl(path)]
        if samples:
            rows.append(_step_row(int(path.stem), samples, parts))
    return rows
