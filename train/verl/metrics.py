"""verl's per-step metrics in the stage folder: where its file logger writes them, and reading them back.

verl 0.9.1's `file` logger (`verl.utils.tracking.FileLogger`) writes one JSON object per `log` call,
`{"step": N, "data": {metric: value}}`, to the path in VERL_FILE_LOGGER_PATH, and opens it with "wb": a resumed run
would erase the curve of the attempt before it, so `archive` moves that file aside first and `read` joins them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

METRICS_FILE = "verl_metrics.jsonl"
PATH_ENV = "VERL_FILE_LOGGER_PATH"
_ARCHIVE_GLOB = "verl_metrics-*.jsonl"

Steps = dict[int, dict[str, float]]


def tracking_env(out_dir: Path, *, wandb: bool) -> dict[str, str]:
    """What verl's loggers read from the environment: the metrics file, and wandb's folder (both in the stage)."""
    env = {PATH_ENV: str(out_dir / METRICS_FILE)}
    if wandb:
        env["WANDB_DIR"] = str(out_dir)
    return env


def _attempts(out_dir: Path) -> list[Path]:
    """Earlier attempts' files, oldest first, then the current one."""
    archived = sorted(out_dir.glob(_ARCHIVE_GLOB), key=lambda p: int(p.stem.rpartition("-")[2] or 0))
    current = out_dir / METRICS_FILE
    return [*archived, current] if current.is_file() else archived


def archive(out_dir: Path) -> Path | None:
    """Move a previous attempt's metrics aside (verl truncates the file when it starts); returns the new name."""
    current = out_dir / METRICS_FILE
    if not current.is_file() or current.stat().st_size == 0:
        return None
    target = out_dir / f"verl_metrics-{len(_attempts(out_dir))}.jsonl"
    current.rename(target)
    return target


def read(out_dir: Path) -> Steps:
    """Step -> metrics over every attempt; a step logged again (a resumed run, or verl's separate validation log)
    is merged, the later value winning. Lines cut short by a killed run and non-numbers are skipped."""
    steps: Steps = {}
    for path in _attempts(out_dir):
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                step, data = int(row["step"]), row["data"]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            values = {k: float(v) for k, v in data.items() if _number(v)}
            steps.setdefault(step, {}).update(values)
    return dict(sorted(steps.items()))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
