"""The placement plan of a GPU stage: who runs on which GPUs with what memory share, refused when it cannot fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from memrl.app.recipe import load_recipe
from memrl.core.errors import ConfigError
from memrl.train.placement import params_billions, plan

GPU_RECIPES = {"reflector-qwen2.5-7b": "grpo", "reflector-llama3.1-8b": "grpo", "collaborator-qwen2.5-7b": "collab"}


def _stage(recipe: str, name: str, *overrides: str):  # type: ignore[no-untyped-def]
    return load_recipe(recipe, list(overrides)).recipe.stages[name]


def test_the_shipped_reflector_plan_fits_an_8x80_node() -> None:
    result = plan(_stage("reflector-qwen2.5-7b", "grpo"), "Qwen/Qwen2.5-7B-Instruct")
    assert result.trainer_gpus == (0, 1, 2, 3) and result.visible_devices == "0,1,2,3"
    judge = next(p for p in result.placed if p.role == "judge")
    assert (judge.gpus, judge.memory_fraction, judge.tp) == ((4, 5, 6, 7), 0.9, 4)
    assert judge.model == "meta-llama/Llama-3.3-70B-Instruct"


def test_fractions_over_one_on_a_gpu_are_refused() -> None:
    stage = _stage(
        "reflector-qwen2.5-7b", "grpo", "stages.grpo.placement.judge={gpus: [0, 1, 2, 3], memory_fraction: 0.6}"
    )
    # the judge takes GPUs 0-3, verl's rollout (0.5) the other four: fine; now put both on the same GPU
    plan(stage, "Qwen/Qwen2.5-7B-Instruct")
    stage = _stage(
        "reflector-qwen2.5-7b", "grpo",
        "stages.grpo.placement.judge={gpus: [4, 5, 6, 7], memory_fraction: 0.6}",
        "stages.grpo.placement.teacher={gpus: [4, 5], memory_fraction: 0.5}",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"GPU 4 is asked for judge 0.6 \+ teacher 0.5 = 1.1 of its memory, over 1"):
        plan(stage, "Qwen/Qwen2.5-7B-Instruct")


def test_a_70b_judge_on_too_few_gpus_is_refused() -> None:
    stage = _stage("reflector-qwen2.5-7b", "grpo", "stages.grpo.placement.judge={gpus: [6, 7], memory_fraction: 0.5}")
    with pytest.raises(ConfigError, match=r"judge meta-llama/Llama-3.3-70B-Instruct needs ~65 GiB .* on 2 GPU\(s\)"):
        plan(stage, "Qwen/Qwen2.5-7B-Instruct")
    # the same two GPUs at 0.9 of 80 GiB hold it; measured 40 GiB GPUs do not
    stage = _stage("reflector-qwen2.5-7b", "grpo", "stages.grpo.placement.judge={gpus: [6, 7], memory_fraction: 0.9}")
    assert plan(stage, "Qwen/Qwen2.5-7B-Instruct").trainer_gpus == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ConfigError, match=r"over its share 36 GiB \(0.9 x 40 GiB\)"):
        plan(stage, "Qwen/Qwen2.5-7B-Instruct", gpu_memory_gib=40)


def test_impossible_layouts_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"GPU 8 is not on this node"):
        plan(_stage("reflector-qwen2.5-7b", "grpo", "stages.grpo.placement.judge={gpus: [7, 8]}"), "m")
    whole = "stages.grpo.placement.judge={gpus: [0, 1, 2, 3, 4, 5, 6, 7]}"
    with pytest.raises(ConfigError, match=r"none is left to train on"):
        plan(_stage("reflector-qwen2.5-7b", "grpo", whole), "m")
    with pytest.raises(ConfigError, match=r"spans 2 nodes"):
        plan(_stage("reflector-qwen2.5-7b", "grpo", "stages.grpo.cluster.nnodes=2"), "m")


def test_an_endpoint_placement_reserves_nothing() -> None:
    stage = _stage("reflector-qwen2.5-7b", "grpo", "stages.grpo.placement.judge=endpoint")
    result = plan(stage, "Qwen/Qwen2.5-7B-Instruct")
    assert result.trainer_gpus == tuple(range(8))
    assert (
        "judge: meta-llama/Llama-3.3-70B-Instruct at http://127.0.0.1:8000/v1 (nothing reserved here)" in result.text()
    )


def test_parameter_counts_from_model_names() -> None:
    assert params_billions("meta-llama/Llama-3.3-70B-Instruct") == 70
    assert params_billions("Qwen/Qwen2.5-7B-Instruct") == 7
    assert params_billions("smollm2-135m-instruct") == pytest.approx(0.135)
    assert params_billions("/models/my-reflector") is None


@pytest.mark.parametrize("recipe", sorted(GPU_RECIPES))
def test_dry_run_prints_the_placement_of_every_gpu_recipe(recipe: str, tmp_path: Path) -> None:
    """What `memrl run R --dry-run` prints for every verl stage: the checked verl command, then `placement:`."""
    from memrl.app.runner import plan_lines

    loaded = load_recipe(recipe, [f"output_dir={tmp_path / 'run'}"]).recipe
    ctx = loaded.context(tmp_path / "run", Console(file=open(tmp_path / "log", "w")))  # noqa: SIM115
    try:
        # raises on a bad verl key or a plan that cannot fit
        text = "\n".join(plan_lines(loaded, ctx, GPU_RECIPES[recipe]))
    finally:
        ctx.close()
    block = text[text.index("placement:") :]
    assert "placement: 8 GPUs of 80 GiB on this node" in block
    assert "policy (verl actor + rollout):" in block and "on GPUs 0,1,2,3, memory fraction 0.5, TP 2" in block
    assert "on GPUs 4,5,6,7, memory fraction 0.9, TP 4, http://127.0.0.1:8000/v1" in block
    assert not (tmp_path / "run").exists()


def test_the_judger_dry_run_prints_its_placement(tmp_path: Path) -> None:
    from memrl.app.runner import plan_lines

    loaded = load_recipe("judger-llama3.1-8b", [f"output_dir={tmp_path / 'run'}"]).recipe
    ctx = loaded.context(tmp_path / "run", Console(file=open(tmp_path / "log", "w")))  # noqa: SIM115
    try:
        text = "\n".join(plan_lines(loaded, ctx, "judger"))
    finally:
        ctx.close()
    assert "judger (torchrun): meta-llama/Llama-3.1-8B-Instruct on GPUs 0,1,2,3,4,5,6,7, all memory" in text


def test_the_trainer_sees_only_its_gpus() -> None:
    from memrl.train.placement import trainer_cluster, trainer_env

    shipped, elsewhere = (
        _stage("reflector-qwen2.5-7b", "grpo"),
        _stage("reflector-qwen2.5-7b", "grpo", "stages.grpo.placement.judge=endpoint"),
    )
    assert trainer_env(shipped) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"} and trainer_env(elsewhere) == {}
    assert trainer_cluster(shipped).gpus_per_node == 4 and trainer_cluster(elsewhere).gpus_per_node == 8
    assert shipped.cluster.gpus_per_node == 8  # the node's own count stays as the recipe says


@pytest.mark.parametrize("recipe", sorted(GPU_RECIPES))
def test_verl_gets_the_gpus_the_plan_leaves(recipe: str, tmp_path: Path) -> None:
    """trainer.n_gpus_per_node, the rollout's TP and memory share, torchrun's processes and CUDA_VISIBLE_DEVICES
    all follow the placement plan (verl would otherwise ask Ray for GPUs the served model holds)."""
    from memrl.app.stages.registry import kind_of

    loaded = load_recipe(recipe, [f"output_dir={tmp_path / 'run'}"]).recipe
    ctx = loaded.context(tmp_path / "run", Console(file=open(tmp_path / "log", "w")))  # noqa: SIM115
    try:
        for name, stage in loaded.stages.items():
            if getattr(stage, "trainer", None) != "verl":
                continue
            module = __import__(kind_of(stage).run.__module__, fromlist=["verl_command"])
            command = module.verl_command(stage, ctx, name, dry_run=True)
            argv = " ".join(command.argv)
            assert command.env is not None
            if stage.kind == "sft":  # calls no served model: the whole node (the 70B is stopped for it)
                assert "trainer.n_gpus_per_node=8" in argv and "--nproc_per_node=8" in argv
                assert "CUDA_VISIBLE_DEVICES" not in command.env
            else:
                assert "trainer.n_gpus_per_node=4" in argv, name
                assert command.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
                assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in argv
                assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.5" in argv
    finally:
        ctx.close()
