"""What a training stage leaves in the run folder: the checkpoints it keeps (`checkpoints.keep`) and its `final/`,
estimated from the parameter count in the model's name, for `memrl preflight` to hold against the free space there.

A full-parameter checkpoint holds float32 weights and Adam's two float32 moments, 12 bytes a parameter (a 7B: ~90 GB
per save, whichever trainer writes it); a LoRA checkpoint holds the adapter and its optimizer state, a small share of
that, counted as nothing. `final/` is at most the float32 model (TRL's full-parameter save; merges are bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memrl.train.placement import params_billions

CHECKPOINT_BYTES = 12  # per parameter: float32 weights (4) + Adam's exp_avg and exp_avg_sq (4 + 4)
FINAL_BYTES = 4
GB = 1e9


@dataclass(frozen=True)
class DiskUse:
    """The most a stage keeps on disk at once: `kept` checkpoints of `per_checkpoint` GB, and `final` GB."""

    stage: str
    kept: int
    per_checkpoint: float
    final: float

    @property
    def total(self) -> float:
        return self.kept * self.per_checkpoint + self.final

    def line(self) -> str:
        return (
            f"{self.stage} ~{self.total:.0f} GB ({self.kept} x {self.per_checkpoint:.0f} GB checkpoints + "
            f"{self.final:.0f} GB final)"
        )


def disk_use(stage: Any, name: str, model: str) -> DiskUse | None:
    """The estimate for a training stage on `model` (None: its name states no size). Runs with a step count keep
    no more checkpoints than they write (`max_steps // save_steps`, at least the last)."""
    billions = params_billions(model)
    if billions is None:
        return None
    checkpoints = stage.checkpoints
    steps = getattr(stage, "max_steps", None)
    kept = checkpoints.keep if steps is None else min(checkpoints.keep, max(1, steps // checkpoints.save_steps))
    per = 0.0 if stage.lora is not None else billions * 1e9 * CHECKPOINT_BYTES / GB
    return DiskUse(name, kept, per, billions * 1e9 * FINAL_BYTES / GB)
