"""Every trainer keeps only the newest `checkpoints.keep` checkpoints, and `memrl preflight` holds
what the training stages keep against the run folder's free space."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from memrl.app.preflight import preflight
from memrl.app.recipe import load_recipe
from memrl.app.runner import plan_lines
from memrl.train.config import LoggingTarget
from memrl.train.disk import disk_use
from memrl.train.hf_trainer import TrainContext, base_args
from memrl.train.llamafactory import backend as lf


def _dry_run(tmp_path: Path, stage: str, *overrides: str) -> str:
    """The verl command of a stage as `--dry-run` prints it, its overrides checked against verl's own config."""
    loaded = load_recipe("reflector-qwen2.5-7b", [f"output_dir={tmp_path / 'run'}", *overrides]).recipe
    ctx = loaded.context(tmp_path / "run", Console(file=io.StringIO()))
    try:
        return "\n".join(plan_lines(loaded, ctx, stage))
    finally:
        ctx.close()


def test_verl_keeps_the_newest_checkpoints_only(tmp_path: Path) -> None:
    grpo = _dry_run(tmp_path, "grpo")
    assert "trainer.max_actor_ckpt_to_keep=2" in grpo and "trainer.max_critic_ckpt_to_keep=2" in grpo
    assert "trainer.max_ckpt_to_keep=2" in _dry_run(tmp_path, "sft")
    assert "trainer.max_actor_ckpt_to_keep=1" in _dry_run(tmp_path, "grpo", "stages.grpo.checkpoints.keep=1")


def test_trl_the_judger_and_llamafactory_keep_as_many() -> None:
    ctx = TrainContext(Path("/o"), "sft", 0, "none", "r")
    assert base_args(ctx, lr=1e-6, checkpoints=LoggingTarget(keep=3))["save_total_limit"] == 3  # TRL, the judger
    stage = load_recipe("reflector-qwen2.5-7b", ["stages.sft.trainer=llamafactory"]).recipe.stages["sft"]
    args = lf.sft_yaml(stage, model_path="m", dataset_dir=Path("/d"), out_dir=Path("/o"), cpu=True)
    assert args["save_total_limit"] == 2


def test_the_estimate_of_a_7b_run() -> None:
    stages = load_recipe("reflector-qwen2.5-7b").recipe.stages
    grpo = disk_use(stages["grpo"], "grpo", "Qwen/Qwen2.5-7B-Instruct")
    # 200 steps, a save every 50: 4 saves, 2 kept, each 7e9 x 12 bytes; final/ at most float32
    assert grpo is not None and (grpo.kept, grpo.per_checkpoint, grpo.final) == (2, pytest.approx(84), 28)
    assert grpo.line() == "grpo ~196 GB (2 x 84 GB checkpoints + 28 GB final)"
    lora = load_recipe("reflector-qwen2.5-7b", ["stages.grpo.lora={rank: 8}"]).recipe.stages["grpo"]
    assert disk_use(lora, "grpo", "Qwen/Qwen2.5-7B-Instruct").per_checkpoint == 0  # type: ignore[union-attr]
    assert disk_use(stages["grpo"], "grpo", "/models/mine") is None  # no size in the name: no estimate


@pytest.mark.parametrize(("free_gb", "fits"), [(500, True), (300, False)])
def test_preflight_compares_the_checkpoints_with_the_free_space(
    free_gb: int, fits: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk this test runs on is not the question: its free space is set (500 or 300 GB) against 392 GB."""
    from memrl.app import preflight as module

    monkeypatch.setattr(module.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1e12, 0, free_gb * 1e9))  # type: ignore[attr-defined]
    trl = ["stages.sft.trainer=trl", "stages.grpo.trainer=trl"]  # as verl's, without importing verl
    report = preflight(load_recipe("reflector-qwen2.5-7b", [f"output_dir={tmp_path / 'run'}", *trl]).recipe)
    parts = "(sft ~196 GB (2 x 84 GB checkpoints + 28 GB final); grpo ~196 GB (2 x 84 GB checkpoints + 28 GB final))"
    if fits:
        assert dict(report.checks)["disk"] == f"~392 GB of 500 GB free in {tmp_path} {parts}"
    else:
        assert f"disk: the training stages keep up to ~392 GB in {tmp_path} {parts}; 300 GB is free" in "\n".join(
            report.problems
        )
