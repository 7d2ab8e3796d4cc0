"""TRL stages on several GPUs (TRL 1.16 refuses one process that sees more than one): the launch decision, the
`accelerate launch` / pinned-GPU command, the global batch over processes, and a stage that leaves `memrl run`'s
process when several GPUs are visible (on CPU: a pinned single process that then trains in-process)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from accelerate.commands.launch import launch_command_parser
from rich.console import Console

from memrl.app.recipe import load_recipe
from memrl.app.runner import run_recipe
from memrl.core.errors import ConfigError
from memrl.train import distributed
from memrl.train.config import ClusterConfig
from memrl.train.distributed import is_rank, resolve_refs, trl_spawn, world_size
from memrl.train.processes import format_command
from memrl.train.trl.common import accumulation_steps

ENTRY = "memrl.app.stage_main"
RECIPE = Path("run/recipe.resolved.yaml")
EIGHT = [str(i) for i in range(8)]


def test_cpu_one_gpu_and_a_launched_rank_train_in_process() -> None:
    cluster = ClusterConfig()
    assert trl_spawn(ENTRY, RECIPE, "sft", cluster, []) is None
    assert trl_spawn(ENTRY, RECIPE, "sft", cluster, ["3"]) is None
    assert trl_spawn(ENTRY, RECIPE, "sft", cluster, EIGHT, inside=True) is None
    assert is_rank({"WORLD_SIZE": "8"}) and not is_rank({}) and world_size({"WORLD_SIZE": "8"}) == 8


def test_several_gpus_run_one_process_each_under_accelerate() -> None:
    launch = trl_spawn(ENTRY, RECIPE, "grpo", ClusterConfig(), EIGHT)
    assert launch is not None and launch.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    # One node: accelerate runs through memrl's loopback-only launcher, its ranks' traffic on the loopback interface.
    assert launch.argv[:4] == [sys.executable, "-m", "memrl.train.loopback", "accelerate"]
    assert launch.argv[4:6] == ["launch", "--multi_gpu"]
    assert {launch.env[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")} == {"lo"}
    assert "--num_processes=8" in launch.argv and "--num_machines=1" in launch.argv
    assert launch.argv[-5:] == ["-m", ENTRY, str(RECIPE), "--stage", "grpo"]
    # The cluster asks for fewer GPUs than are visible: that many processes, on the first ones.
    fewer = trl_spawn(ENTRY, RECIPE, "grpo", ClusterConfig(gpus_per_node=2), ["2", "5", "7"])
    assert fewer is not None and "--num_processes=2" in fewer.argv and fewer.env["CUDA_VISIBLE_DEVICES"] == "2,5"
    # More asked than visible: every visible GPU, one process each.
    three = trl_spawn(ENTRY, RECIPE, "grpo", ClusterConfig(), ["0", "1", "2"])
    assert three is not None and "--num_processes=3" in three.argv


def test_a_one_gpu_stage_is_pinned_to_its_device() -> None:
    launch = trl_spawn(ENTRY, RECIPE, "sft", ClusterConfig(gpus_per_node=1), ["4", "6"])
    assert launch is not None
    assert launch.argv == [sys.executable, "-m", ENTRY, str(RECIPE), "--stage", "sft"]
    assert launch.env == {"CUDA_VISIBLE_DEVICES": "4"}


def test_several_nodes_keep_rendezvous_references() -> None:
    launch = trl_spawn(ENTRY, RECIPE, "sft", ClusterConfig(nnodes=2), EIGHT)
    assert launch is not None
    assert "--num_processes=16" in launch.argv and "--num_machines=2" in launch.argv
    assert '"--machine_rank=${NODE_RANK}"' in format_command(launch.argv)
    filled = resolve_refs(launch.argv, {"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"})
    # accelerate's own parser takes the command as memrl fills it
    args = launch_command_parser().parse_args(filled[2:])
    assert (args.num_processes, args.num_machines, args.machine_rank, args.multi_gpu) == (16, 2, 1, True)
    assert (args.main_process_ip, args.main_process_port, args.module) == ("10.0.0.1", 29500, True)
    assert [args.training_script, *args.training_script_args] == [ENTRY, str(RECIPE), "--stage", "sft"]
    with pytest.raises(ConfigError, match="set MASTER_ADDR on every node"):
        resolve_refs(launch.argv, {"NODE_RANK": "0"})


def test_global_batch_is_split_over_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert accumulation_steps(64, 2, "sft", "batch_size", processes=8) == 4
    with pytest.raises(ConfigError, match=r"batch_size \(64\) must be a multiple of micro_batch_size \(4\) x 32"):
        accumulation_steps(64, 4, "sft", "batch_size", processes=32)
    monkeypatch.setenv("WORLD_SIZE", "4")  # what accelerate launch sets in each process
    assert accumulation_steps(64, 2, "sft", "batch_size") == 8
    monkeypatch.delenv("WORLD_SIZE")
    assert accumulation_steps(64, 2, "sft", "batch_size") == 32


def _plan(tmp_path: Path, overrides: list[str]) -> str:
    console = Console(record=True, file=io.StringIO(), width=400)
    loaded = load_recipe("quickstart", [f"output_dir={tmp_path / 'run'}", *overrides])
    run_recipe(loaded, console, only=["sft", "grpo"], dry_run=True)
    return console.export_text()


def test_dry_run_shows_the_launch_when_several_gpus_are_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "TRL SFTTrainer" in _plan(tmp_path, []) and "accelerate" not in _plan(tmp_path, [])  # CPU: in-process
    monkeypatch.setattr(distributed, "visible_gpus", lambda: EIGHT)
    out = _plan(tmp_path, ["stages.sft.cluster.gpus_per_node=4"])
    assert "TRL SFTTrainer" in out and "under accelerate launch, 4 processes per node" in out
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in out and "--num_processes=4 " in out
    assert f"-m {ENTRY} {tmp_path / 'run' / 'recipe.resolved.yaml'} --stage sft" in out
    assert "--num_processes=8 " in out and "--stage grpo" in out


SFT_RECIPE = """\
name: trl-pinned
logging: {backend: none}
models:
  policy: {backend: hf, model: tiny-qwen2}
stages:
  sft: {kind: sft, model: policy, data: DATA, lora: {rank: 4, alpha: 8}, max_steps: 1, batch_size: 2,
        micro_batch_size: 1, max_length: 64, cluster: {gpus_per_node: 1}}
"""


def _sft_data(root: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"Reflect on session {i}."}, {"role": "assistant", "content": "ok"}]}
        for i in range(4)
    ]
    for split in ("train", "eval"):
        path = root / "sft" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


@pytest.mark.slow
def test_a_stage_seeing_two_gpus_leaves_the_process(
    tmp_path: Path, tiny_qwen2: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two visible GPUs and `gpus_per_node: 1`: the stage reruns as `python -m memrl.app.stage_main` pinned to the
    first GPU. On CPU that process sees no GPU and trains in-process; `final/` comes back to the parent."""
    data = _sft_data(tmp_path / "data")
    (tmp_path / "r.yaml").write_text(SFT_RECIPE.replace("DATA", str(data)))
    monkeypatch.setattr(distributed, "visible_gpus", lambda: ["0", "1"])  # this process only: the child sees none
    loaded = load_recipe(str(tmp_path / "r.yaml"), [f"output_dir={tmp_path / 'run'}"])
    run_recipe(loaded, Console(file=io.StringIO()))
    log = (tmp_path / "run" / "sft" / "trl.log").read_text()
    assert log.startswith(f"$ CUDA_VISIBLE_DEVICES=0 {sys.executable} -m {ENTRY} ")
    info = json.loads((tmp_path / "run" / "sft" / "final" / "memrl_checkpoint.json").read_text())
    assert info["trainer"] == "trl-sft" and info["steps"] == 1
