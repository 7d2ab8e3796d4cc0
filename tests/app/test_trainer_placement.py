"""Every trainer a recipe can select keeps to the node's placement plan: the processes
it starts, the GPUs they see, what `memrl launch` asks Ray for, and what the dry run and `memrl preflight` print."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from memrl.app import launch
from memrl.app.preflight import preflight
from memrl.app.recipe import load_recipe
from memrl.app.runner import plan_lines
from memrl.train import distributed
from memrl.train.llamafactory import backend as lf

EIGHT = [str(i) for i in range(8)]
# The 70B server on GPUs 4-7 of the node, as the 7B recipes' headers describe it.
SERVER_ON_4_TO_7 = "placement.judge={gpus: [4, 5, 6, 7], memory_fraction: 0.9}"


def _dry_run(tmp_path: Path, recipe: str, stage: str, *overrides: str) -> str:
    loaded = load_recipe(recipe, [f"output_dir={tmp_path / 'run'}", *overrides]).recipe
    ctx = loaded.context(tmp_path / "run", Console(file=io.StringIO()))
    try:
        return "\n".join(plan_lines(loaded, ctx, stage))
    finally:
        ctx.close()


def _lf_data(run: Path) -> None:
    """The smallest LLaMA-Factory dataset folder the SFT stage accepts (what the data stage writes)."""
    folder = run / "data" / lf.DATASET_SUBDIR
    folder.mkdir(parents=True)
    info = {name: {"file_name": f"{name}.json"} for name in (lf.TRAIN_DATASET, lf.EVAL_DATASET)}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    for name in info:
        (folder / f"{name}.json").write_text('[{"messages": []}]\n')


def test_llamafactory_runs_torchrun_on_the_trainers_gpus_only(tmp_path: Path) -> None:
    """Item 1: NPROC_PER_NODE was cluster.gpus_per_node (8) with no CUDA_VISIBLE_DEVICES: four ranks on the 70B's
    GPUs. Now 4 processes on GPUs 0-3, the global batch split over those 4, and the dry run says so."""
    sft = "stages.sft.trainer=llamafactory"
    stage = load_recipe("reflector-qwen2.5-7b", [sft, f"stages.sft.{SERVER_ON_4_TO_7}"]).recipe.stages["sft"]
    env = lf.cli_env(stage, cpu=False)
    assert env["NPROC_PER_NODE"] == "4" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    args = lf.sft_yaml(stage, model_path="m", dataset_dir=Path("/d"), out_dir=Path("/o"), cpu=False)
    assert args["gradient_accumulation_steps"] == 64 // (1 * 4)

    _lf_data(tmp_path / "run")
    text = _dry_run(tmp_path, "reflector-qwen2.5-7b", "sft", sft, f"stages.sft.{SERVER_ON_4_TO_7}")
    assert (
        "NPROC_PER_NODE=4 NNODES=1 CUDA_VISIBLE_DEVICES=0,1,2,3 FORCE_TORCHRUN=1 GLOO_SOCKET_IFNAME=lo "
        "NCCL_SOCKET_IFNAME=lo llamafactory-cli train"
    ) in text
    assert "policy (LLaMA-Factory under torchrun, ZeRO-2): Qwen/Qwen2.5-7B-Instruct on GPUs 0,1,2,3" in text
    assert "trainer processes: 4 on this node, one per GPU, each started with CUDA_VISIBLE_DEVICES=0,1,2,3" in text


def test_trl_spawns_one_process_per_trainer_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: with 8 visible GPUs a TRL stage ran 8 accelerate processes, four on the judge's GPUs."""
    monkeypatch.setattr(distributed, "visible_gpus", lambda: EIGHT)
    text = _dry_run(tmp_path, "reflector-qwen2.5-7b", "grpo", "stages.grpo.trainer=trl")
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 " in text and "--num_processes=4 " in text
    assert "under accelerate launch, 4 processes per node" in text
    assert "policy (TRL, one process per GPU): Qwen/Qwen2.5-7B-Instruct on GPUs 0,1,2,3" in text
    # The node's GPUs named otherwise (a Ray worker's view, say): the plan's indexes pick among them.
    named = distributed.trl_spawn("m", Path("r"), "grpo", load_recipe("reflector-qwen2.5-7b").recipe.stages[
        "grpo"].cluster, ["a", "b", "c", "d", "e", "f", "g", "h"], trainer_gpus=(0, 1, 2, 3))  # fmt: skip
    assert named is not None and named.env["CUDA_VISIBLE_DEVICES"] == "a,b,c,d"
    # On CPU the stage trains in-process and the dry run still shows the plan for the GPU node.
    monkeypatch.setattr(distributed, "visible_gpus", lambda: [])
    cpu = _dry_run(tmp_path, "reflector-qwen2.5-7b", "grpo", "stages.grpo.trainer=trl")
    assert "in-process" in cpu and "each started with CUDA_VISIBLE_DEVICES=0,1,2,3" in cpu


def test_launch_asks_ray_for_the_trainers_gpus(tmp_path: Path) -> None:
    """Item 4: the single-node verl SFT job asked Ray for 8 GPUs and trained on 4 (never scheduled under `ray start
    --num-gpus 4`)."""
    loaded = load_recipe("reflector-qwen2.5-7b", [f"output_dir={tmp_path / 'run'}", f"stages.sft.{SERVER_ON_4_TO_7}"])
    assert launch.plan(loaded, "http://head:8265", working_dir=tmp_path, environ={}).gpus["sft"] == 4
    whole = load_recipe("reflector-qwen2.5-7b", [f"output_dir={tmp_path / 'run'}"])
    assert launch.plan(whole, "http://head:8265", working_dir=tmp_path).gpus["sft"] == 8  # no served model: all


def test_launch_asks_ray_for_the_gpu_of_an_in_process_vllm(tmp_path: Path) -> None:
    """Item 6: the evaluation runs vLLM in-process and its job asked Ray for no GPU, where preflight counts 1."""
    loaded = load_recipe("reflector-qwen2.5-7b", [f"output_dir={tmp_path / 'run'}"])
    assert launch.plan(loaded, "http://head:8265", working_dir=tmp_path, environ={}).gpus["eval"] == 1
    two = load_recipe(
        "reflector-qwen2.5-7b", [f"output_dir={tmp_path / 'run'}", "models.policy.tensor_parallel_size=2"]
    )
    assert launch.plan(two, "http://head:8265", working_dir=tmp_path, environ={}).gpus["eval"] == 2
    cpu = load_recipe("quickstart", [f"output_dir={tmp_path / 'run'}"])  # hf models only: no GPU asked
    assert "eval" not in launch.plan(cpu, "http://head:8265", working_dir=tmp_path, environ={}).gpus


@pytest.mark.parametrize(
    ("recipe", "stage", "overrides", "least", "trainer_gpus"),
    [
        # the 7B policy is a vLLM model: its TRL stages need a GPU wherever they run
        ("reflector-qwen2.5-7b", "sft", ["stages.sft.trainer=trl"], 1, 8),
        ("reflector-qwen2.5-7b", "grpo", ["stages.grpo.trainer=trl"], 1, 4),  # the judge's server keeps GPUs 4-7
        ("reflector-qwen2.5-7b", "sft", ["stages.sft.trainer=llamafactory", f"stages.sft.{SERVER_ON_4_TO_7}"], 1, 4),
        ("collaborator-quickstart", "collab", [], 0, 8),
        ("judger-minilm-cpu", "judger", ["data=/tmp"], 0, 1),
        ("quickstart", "sft", [], 0, 8),
    ],
)
def test_a_trainer_that_runs_on_cpu_too_asks_ray_for_gpus_only_where_a_node_has_some(
    recipe: str, stage: str, overrides: list[str], least: int, trainer_gpus: int, tmp_path: Path
) -> None:
    """Not asked, Ray may start the job on a node without GPUs (the head, often) or beside another job on the same
    GPUs; asked always, a CPU-only cluster never schedules it, and more than a node holds, no cluster does."""
    loaded = load_recipe(recipe, [f"output_dir={tmp_path / 'run'}", *overrides])
    if stage == "sft" and "llamafactory" in " ".join(overrides):
        _lf_data(tmp_path / "run")
    job = launch.plan(loaded, "http://head:8265", working_dir=tmp_path, environ={})
    assert job.gpus.get(stage, 0) == least and job.gpus_if_any[stage] == trainer_gpus
    assert job.entrypoint_gpus(stage, 0) == least  # a CPU-only cluster
    assert job.entrypoint_gpus(stage, 2) == min(2, trainer_gpus)  # its largest node holds 2
    assert job.entrypoint_gpus(stage, 8) == trainer_gpus
    text = io.StringIO()
    launch.describe(job, "http://head:8265", lambda line: text.write(line + "\n"))
    assert f"entrypoint GPUs: {least} to {trainer_gpus}, as many as the cluster's largest node has" in text.getvalue()


def test_preflight_plans_every_trainer_a_recipe_can_select(tmp_path: Path) -> None:
    """The dry run's placement block and preflight cover trl, verl, llamafactory and the judger."""
    out = f"output_dir={tmp_path / 'run'}"
    report = preflight(load_recipe("reflector-qwen2.5-7b", [out, "stages.grpo.trainer=trl"]).recipe, ["sft", "grpo"])
    checks = dict(report.checks)
    assert checks["placement sft"].endswith("CUDA_VISIBLE_DEVICES as given (all 8 GPUs)")
    assert checks["placement grpo"].endswith("CUDA_VISIBLE_DEVICES=0,1,2,3")
    _lf_data(tmp_path / "run")
    lf_report = preflight(load_recipe("reflector-qwen2.5-7b", [out, "stages.sft.trainer=llamafactory"]).recipe, ["sft"])
    assert "placement sft" in dict(lf_report.checks)
    judger = load_recipe("judger-llama3.1-8b", [out, "data=/tmp", f"stages.judger.{SERVER_ON_4_TO_7}"]).recipe
    judger_checks = dict(preflight(judger, ["judger"]).checks)
    assert judger_checks["placement judger"].endswith("CUDA_VISIBLE_DEVICES=0,1,2,3")
    text = _dry_run(tmp_path, "judger-llama3.1-8b", "judger", "data=/tmp", f"stages.judger.{SERVER_ON_4_TO_7}")
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 " in text and "--nproc-per-node=4 " in text
