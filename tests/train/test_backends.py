"""Trainer backends (`backend` of memrl.train.trl, .verl, .llamafactory): what a `StageRun` carries reaches the
trainer, with no run context."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from memrl.train.config import ClusterConfig, SFTStage
from memrl.train.stage_run import StageRun
from memrl.train.verl import backend as verl


def _where(tmp_path: Path, *, wandb: bool, planned: frozenset[str] = frozenset()) -> StageRun:
    return StageRun(tmp_path / "run" / "sft", "sft", "reflector", "memrl-tests", wandb, 7, planned, Console())


def _sft() -> SFTStage:
    eight_gpus = ClusterConfig(nnodes=1, gpus_per_node=8)
    return SFTStage(kind="sft", trainer="verl", model="policy", data="data", lora=None, lr=1e-6, epochs=1,
                    batch_size=8, micro_batch_size=1, lr_scheduler="cosine", cluster=eight_gpus)  # fmt: skip


@pytest.mark.parametrize(("wandb", "logger", "report_to"), [(True, "wandb", "wandb"), (False, "console", "none")])
def test_a_stage_run_names_and_logs_its_run(tmp_path: Path, wandb: bool, logger: str, report_to: str) -> None:
    where = _where(tmp_path, wandb=wandb)
    assert (where.experiment, where.logger, where.report_to) == ("reflector-sft", logger, report_to)
    ctx = where.train_context()
    assert (ctx.out_dir, ctx.stage, ctx.seed, ctx.report_to, ctx.run_name) == (
        where.out_dir, "sft", 7, report_to, "reflector-sft"
    )  # fmt: skip


@pytest.mark.parametrize("wandb", [True, False])
def test_the_verl_sft_command_comes_from_the_stage_run(tmp_path: Path, wandb: bool) -> None:
    earlier = str(tmp_path / "run" / "data_sft")  # a stage of this run that has not run yet: named by its plan
    where = _where(tmp_path, wandb=wandb, planned=frozenset({earlier}))
    command = verl.sft_command(_sft(), where, earlier, tmp_path / "data", dry_run=True)
    assert command.model_path == f"{earlier}/final"
    argv = " ".join(command.argv)
    for expected in ("trainer.experiment_name=reflector-sft", "trainer.project_name=memrl-tests", "trainer.seed=7",
                     f"trainer.default_local_dir={where.out_dir}", "--nproc_per_node=8"):  # fmt: skip
        assert expected in argv
    assert command.env is not None and command.env["VERL_FILE_LOGGER_PATH"].startswith(str(where.out_dir))
    assert (command.env.get("WANDB_DIR") == str(where.out_dir)) is wandb
    assert verl.describe_sft(_sft(), where, earlier, tmp_path / "data")[0].startswith(command.argv[0])


@pytest.mark.parametrize(
    ("raw", "overrides"),
    [({}, ["+ray_kwargs.ray_init.address=auto"]),
     ({"cluster": {"ray_address": "http://head:8265", "nnodes": 2}, "overrides": ["a=1"]},
      ["a=1", "+ray_kwargs.ray_init.address=auto"])],
)  # fmt: skip
def test_verl_inside_a_ray_job_joins_the_jobs_cluster(raw: dict, overrides: list[str]) -> None:
    nodes = raw.get("cluster", {}).get("nnodes")
    verl.join_job_cluster(raw)
    assert raw["cluster"]["ray_address"] is None and raw["cluster"].get("nnodes") == nodes
    assert raw["overrides"] == overrides
