"""The trainer backends that run as a command of their own (verl; LLaMA-Factory's `final/` is
`llamafactory_run.save_final`): where a stage starts, and a run from its command to `final/`. The app layer only
names the stage folders and prints; TRL runs in-process (`trl_sft`, `trl_grpo`, `online/trl_collab`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from memrl.core.checkpoints import adapter_base, final_dir, is_adapter, resolve_model

CURVES_FILE = "training_curves.png"


@dataclass(frozen=True)
class VerlCommand:
    """A verl stage's command line, its environment, and the model path it starts from."""

    argv: list[str]
    env: dict[str, str] | None
    model_path: str


def verl_start(ref: str, planned: Collection[str], dry_run: bool) -> tuple[str, str | None]:
    """(model path, LoRA adapter or None) to start from. `planned`: the folders of this run's stages, so that a
    stage that has not run yet is named by its plan."""
    final = final_dir(Path(ref))
    if is_adapter(final):
        return resolve_model(adapter_base(final)), str(final)
    if final.is_dir():
        return str(final), None
    if ref in planned:
        return str(Path(ref) / "final"), None  # an earlier stage of this run; its final/ is where it will be
    return (ref if dry_run else resolve_model(ref)), None


def run_verl_stage(
    command: VerlCommand, out: Path, *, title: str, base: str, trainer: str, stage: str, lora_alpha: int | None
) -> Path:
    """Run a verl stage's command, draw its curves (a failed run's too), and merge its last checkpoint into
    `out/final`."""
    from memrl.train import verl_metrics
    from memrl.train.curves import verl_chart
    from memrl.train.verl_launch import run_verl
    from memrl.train.verl_merge import save_final

    out.mkdir(parents=True, exist_ok=True)  # verl's file logger opens its file without creating the folder
    verl_metrics.archive(out)  # verl's file logger would truncate a resumed run's earlier curve
    try:
        run_verl(command.argv, out / "verl.log", env=command.env)  # raises MemrlError with the log's tail on failure
    finally:
        verl_chart(verl_metrics.read(out), out / CURVES_FILE, title=title)
    return save_final(out, base=base, trainer=trainer, stage=stage, lora_alpha=lora_alpha)
